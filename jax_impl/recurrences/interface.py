"""What a recurrence implementation declares, once, in its own module: :class:`Recurrence`.

Every implementation serves one interface, a layer over a sequence::

    layer(xs (T, B, D), (w_ih, w_hh, b_ih, b_hh), carry, *, dtype, precision, lengths=None) -> (final carry, ys)

with ys (T, B, H) the outputs, PyTorch's weights (w_ih (G·H, D), w_hh (G·H, H), b_ih and b_hh (G·H,); G = 4 for the
LSTM, gates i, f, g, o; 3 for the GRU, gates r, z, n) and carry (h, c) for an LSTM layer, h for a GRU layer, each
(B, H). With ``lengths`` (B,), row b's carry stops after its ``lengths[b]`` steps (``pack_padded_sequence``; the
outputs past them are padding). Its conditions (``dtypes``,
``platforms``, ``lengths``, ``mesh``, ``check``) are what :mod:`jax_impl.recurrences.choice` reads to refuse a run or
pass over the implementation; ``why`` holds the words of each refusal. The classifier's tuned paths are optional
overrides of the one layer loop (:class:`jax_impl.recurrences.stack.RNNStack`), used where its layer 0 reads token ids:

    embedded_layer(table (V, E), tokens (T, B), weights, carry, *, dtype, precision, lengths) -> (final carry, ys)
    two_layer_stack(table, tokens, weights (2 layers), carry, masks, *, fold, dtype, precision, lengths) -> finals

(``fold``: whether layer 0's input projection may be gathered from the projected table; ``masks``: None or the one
(T, B, H) dropout multiplier of layer 1's input).
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

Layer = Callable[..., tuple[Any, Any]]  # → (final carry, outputs (T, B, H))
EmbeddedLayer = Callable[..., tuple[Any, Any]]  # → (final carry, outputs (T, B, H))
TwoLayerStack = Callable[..., tuple[Any, ...]]  # → the final carries


@dataclass(frozen=True)
class Recurrence:
    """One implementation: its ``name`` (``--lstm-impl``), a one-line ``summary``, its ``layers`` by cell ('lstm',
    'gru'), the conditions it puts on a run, the words that refuse each (``why``: keys 'dtype', 'platform',
    'lengths', 'mesh', or a dtype's name for words of its own; ``{dtype}`` and ``{backend}`` are filled in), and
    its optional ``check(dtype) -> why not | None`` (a library, an instruction set), ``describe(hidden) -> dict`` (what
    runs, for the run's record) and whole-stack overrides (see the module's docstring)."""

    name: str
    summary: str
    layers: Mapping[str, Layer]
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float64")
    platforms: tuple[str, ...] | None = None  # None: every JAX backend
    lengths: bool = True  # takes sequence lengths (--padding right)
    mesh: bool = True  # runs over a mesh of devices
    why: Mapping[str, str] = field(default_factory=dict)
    check: Callable[[str], str | None] | None = None
    describe: Callable[[int], dict] | None = None
    embedded_layer: EmbeddedLayer | None = None
    two_layer_stack: TwoLayerStack | None = None

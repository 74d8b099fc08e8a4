"""The LSTM stacks that JAX differentiates itself: Flax ``nn.RNN`` layer by layer, over PyTorch's cell (``scan``, the
readable reference the fused and kernel stacks are tested against; under bfloat16, PyTorch's autocast rules) or over
Flax's stock ``nn.OptimizedLSTMCell`` (``flax``, what a Flax user writes). They share one layer loop,
:func:`layer_by_layer`: look the embeddings up, then each layer over the previous one's (dropped-out) outputs.

Every stack is ``(table (V, E), tokens (T, B) int32, weights, carry, lengths, masks, **options) → the L final
carries``; ``masks`` is None or L-1 (T, B, H) multipliers of the inputs of layers 1..L-1; with ``lengths`` (B,)
each row's carry is the one after its last token (``pack_padded_sequence``). Called inside
:class:`jax_impl.model.LSTMStack`, whose scope the ``nn.RNN`` modules join.

The language model's layers (``torch_lstm_layer``, ``torch_gru_layer``, ``flax_lstm_layer``, ``flax_gru_layer``, with
:class:`TorchGRUCell`) also return every step's output, over :func:`stack_layers`; see the section at the end.
"""
import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_impl.numerics import PRECISION, Array, LayerCarry, LayerWeights, bfloat16_dot, dot, to_bfloat16

Carry = tuple[LayerCarry, ...]  # one (h, c) pair per layer, bottom first
# (xs (T, B, D) the layer's input, its weights, its carry) → (its final carry, its outputs (T, B, H))
Layer = Callable[[Array, LayerWeights, LayerCarry], tuple[LayerCarry, Array]]


def stack_layers(xs: Array, weights: Sequence[LayerWeights], carry: Sequence[Any], masks: Sequence[Array] | None,
                 layer: Callable[[Array, LayerWeights, Any], tuple[Any, Array]]) -> tuple[tuple[Any, ...], Array]:
    """``nn.LSTM``/``nn.GRU``'s order of work over inputs ``xs`` (T, B, D): ``layer`` over each layer's input, the
    input of layer k > 0 being layer k-1's outputs times ``masks[k-1]``. → (the L final carries, the top layer's
    outputs (T, B, H)). A GRU layer's carry is h (B, H) alone."""
    finals = []
    for k, (layer_weights, layer_carry) in enumerate(zip(weights, carry)):
        if k > 0 and masks is not None:
            xs = xs * masks[k - 1].astype(xs.dtype)
        final, xs = layer(xs, layer_weights, layer_carry)
        finals.append(final)
    return tuple(finals), xs


def layer_by_layer(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry,
                   masks: Sequence[Array] | None, dtype: Any, layer: Layer) -> Carry:
    """``nn.LSTM``'s order of work from token ids: the embeddings of ``tokens`` (T, B) in ``dtype``, then
    :func:`stack_layers` → the L final carries (the classifier reads no other output)."""
    xs = jnp.take(table, tokens, axis=0).astype(dtype)  # (T, B, E)
    return stack_layers(xs, weights, carry, masks, layer)[0]


class TorchLSTMCell(nn.RNNCellBase):
    """PyTorch's LSTM cell for ``nn.RNN``, on gates whose input half ``x @ W_ih.T + b_ih`` is precomputed for
    all steps at once: ``((h, c), gates_x (B, 4H)) → ((h', c'), h')``. Its recurrent weights are arguments, not
    parameters of its own, so every implementation reads the one tree :class:`jax_impl.model.LSTMStack` declares."""

    w_hh_t: Array  # (H, 4H)
    b_hh: Array  # (4H,)
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION

    @nn.compact
    def __call__(self, state: LayerCarry, gates_x: Array) -> tuple[LayerCarry, Array]:
        h, c = state
        gates = gates_x + (dot(h.astype(self.dtype), self.w_hh_t, self.precision) + self.b_hh)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c_new = (jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)).astype(c.dtype)
        h_new = (jax.nn.sigmoid(o) * jnp.tanh(c_new)).astype(h.dtype)
        return (h_new, c_new), h_new

    @property
    def num_feature_axes(self) -> int:
        return 1


def scan_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry, lengths: Array | None,
               masks: Sequence[Array] | None, *, dtype: Any, precision: jax.lax.Precision = PRECISION) -> Carry:
    """The reference: ``nn.LSTM`` layer by layer, each a Flax ``nn.RNN`` of :class:`TorchLSTMCell`, in ``dtype``
    (bfloat16: :func:`autocast_stack`); each layer projects the inputs of all its steps at once, as ``nn.LSTM``
    does."""
    if dtype == jnp.bfloat16:
        return autocast_stack(table, tokens, weights, carry, lengths, masks, precision=precision)

    layer = functools.partial(torch_lstm_layer, dtype=dtype, precision=precision, lengths=lengths)
    return layer_by_layer(table, tokens, weights, carry, masks, dtype, layer)


class AutocastLSTMCell(nn.RNNCellBase):
    """PyTorch's LSTM cell as PyTorch computes it under bfloat16 autocast, found by replaying it
    (docs/mixed-precision.md): ``((h, c), gates_x (B, 4H)) → ((h', c'), h')`` on float32 arrays, rounded to bfloat16
    where PyTorch rounds. ``kernel`` "onednn" (oneDNN's LSTM): ``gates_x`` holds the float32 input projection and
    both biases; the matmuls take bfloat16 and sum in float32, the gate math is float32, h' is rounded, and c' is
    rounded as it passes to the next step (h' reads it unrounded). "native" (PyTorch's ATen cell, which runs packed
    sequences): ``gates_x`` is the rounded ``x W_ih + b_ih``; each matmul output, gate sum and activation is
    rounded, i * g too, and c and h stay float32. W_hh is cast inside the step, so its gradient sums over the steps
    in float32."""

    w_hh_t: Array  # (H, 4H) float32
    b_hh: Array  # (4H,) float32, rounded to bfloat16 (native only)
    kernel: str = "onednn"
    precision: jax.lax.Precision = PRECISION

    @nn.compact
    def __call__(self, state: LayerCarry, gates_x: Array) -> tuple[LayerCarry, Array]:
        h, c = state
        recurrent = bfloat16_dot(h, self.w_hh_t, self.precision)
        if self.kernel == "onednn":
            i, f, g, o = jnp.split(gates_x + recurrent, 4, axis=-1)
            c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h_new = to_bfloat16(jax.nn.sigmoid(o) * jnp.tanh(c_new))
            return (h_new, to_bfloat16(c_new)), h_new
        gates = to_bfloat16(to_bfloat16(recurrent + self.b_hh) + gates_x)
        i, f, g, o = (to_bfloat16(fn(z)) for fn, z in zip((jax.nn.sigmoid, jax.nn.sigmoid, jnp.tanh, jax.nn.sigmoid),
                                                           jnp.split(gates, 4, axis=-1)))
        c_new = f * c + to_bfloat16(i * g)
        h_new = o * jnp.tanh(c_new)
        return (h_new, c_new), h_new

    @property
    def num_feature_axes(self) -> int:
        return 1


def autocast_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry, lengths: Array | None,
                   masks: Sequence[Array] | None, *, precision: jax.lax.Precision = PRECISION) -> Carry:
    """:func:`scan_stack` under bfloat16: ``nn.LSTM`` under PyTorch's autocast, each layer a Flax ``nn.RNN`` of
    :class:`AutocastLSTMCell` with oneDNN's rules, or the ATen cell's with ``lengths`` (PyTorch runs packed sequences
    there). Every array, the embeddings and the carry included, stays float32 (autocast leaves the embedding alone)."""
    kernel = "onednn" if lengths is None else "native"

    def layer(xs: Array, layer_weights: LayerWeights, layer_carry: LayerCarry) -> tuple[LayerCarry, Array]:
        (w_ih, w_hh, b_ih, b_hh), (h, c) = layer_weights, layer_carry
        projected = bfloat16_dot(xs, w_ih.T, precision)  # all steps at once
        if kernel == "onednn":  # autocast's casts: the biases are added in bfloat16, h0 and c0 rounded
            gates_x = projected + to_bfloat16(to_bfloat16(b_ih) + to_bfloat16(b_hh))
            h, c = to_bfloat16(h), to_bfloat16(c)
        else:
            gates_x = to_bfloat16(projected + to_bfloat16(b_ih))
        cell = AutocastLSTMCell(w_hh.T, to_bfloat16(b_hh), kernel, precision)
        return nn.RNN(cell, time_major=True, return_carry=True)(gates_x, initial_carry=(h, c), seq_lengths=lengths)

    return layer_by_layer(table, tokens, weights, carry, masks, jnp.float32, layer)


def flax_cell_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry,
                    lengths: Array | None, masks: Sequence[Array] | None, *, dtype: Any,
                    precision: jax.lax.Precision = PRECISION) -> Carry:
    """What a Flax user writes: per layer ``nn.RNN`` over Flax's own ``nn.OptimizedLSTMCell``, whose loop projects
    each step's input, fed these weights. Per gate g its kernels are ``i<g>`` = W_ih[g].T and ``h<g>`` = W_hh[g].T,
    and its one bias is b_ih[g] + b_hh[g]: the sum lies inside the differentiated function, so both biases get
    PyTorch's gradient and the stack trains PyTorch's function. Its matmuls run at ``precision`` through JAX's
    default-precision setting (the cell takes none); it carries (c, h)."""

    layer = functools.partial(flax_lstm_layer, dtype=dtype, precision=precision, lengths=lengths)
    return layer_by_layer(table, tokens, weights, carry, masks, dtype, layer)


# ---------------------------------------------------------------- layers that return every step's output
#
# The language model (jax_impl.lm_model) reads the top layer at every step, not only the final carries, and has a GRU
# as well as an LSTM: the same ``Layer`` interface, one function per (implementation, cell), over :func:`stack_layers`.


class TorchGRUCell(nn.RNNCellBase):
    """PyTorch's GRU cell for ``nn.RNN``, on gates whose input half ``x @ W_ih.T + b_ih`` is precomputed for all
    steps at once: ``(h, gates_x (B, 3H)) → (h', h')`` with, gate order r, z, n,

        r = σ(W_ir x + b_ir + W_hr h + b_hr),  z = σ(W_iz x + b_iz + W_hz h + b_hz),
        n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = (1 − z) ⊙ n + z ⊙ h.

    Its recurrent weights are arguments, as :class:`TorchLSTMCell`'s are."""

    w_hh_t: Array  # (H, 3H)
    b_hh: Array  # (3H,)
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION

    @nn.compact
    def __call__(self, h: Array, gates_x: Array) -> tuple[Array, Array]:
        gates_h = dot(h.astype(self.dtype), self.w_hh_t, self.precision) + self.b_hh
        x_r, x_z, x_n = jnp.split(gates_x, 3, axis=-1)
        h_r, h_z, h_n = jnp.split(gates_h, 3, axis=-1)
        r, z = jax.nn.sigmoid(x_r + h_r), jax.nn.sigmoid(x_z + h_z)
        n = jnp.tanh(x_n + r * h_n)
        h_new = ((1 - z) * n + z * h).astype(h.dtype)
        return h_new, h_new

    @property
    def num_feature_axes(self) -> int:
        return 1


def _torch_cell_layer(cell_class: type, xs: Array, layer_weights: LayerWeights, layer_carry: Any, *, dtype: Any,
                      precision: jax.lax.Precision, lengths: Array | None) -> tuple[Any, Array]:
    """One layer as PyTorch runs it: the input projection of all steps at once, then ``nn.RNN`` over
    ``cell_class`` (:class:`TorchLSTMCell` or :class:`TorchGRUCell`), each row's carry stopping after its
    ``lengths`` (B,) steps where given. Must run inside a Flax module's scope."""
    w_ih, w_hh, b_ih, b_hh = layer_weights
    gates_x = dot(xs, w_ih.T.astype(dtype), precision) + b_ih.astype(dtype)  # (T, B, G·H)
    cell = cell_class(w_hh.T.astype(dtype), b_hh.astype(dtype), dtype, precision)
    return nn.RNN(cell, time_major=True, return_carry=True)(gates_x, initial_carry=layer_carry,
                                                            seq_lengths=lengths)


def torch_lstm_layer(xs: Array, layer_weights: LayerWeights, layer_carry: LayerCarry, *, dtype: Any,
                     precision: jax.lax.Precision = PRECISION,
                     lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """``scan``, LSTM: xs (T, B, D), carry (h, c) each (B, H) → ((h, c) after step T, outputs (T, B, H))."""
    return _torch_cell_layer(TorchLSTMCell, xs, layer_weights, layer_carry, dtype=dtype, precision=precision,
                            lengths=lengths)


def torch_gru_layer(xs: Array, layer_weights: LayerWeights, layer_carry: Array, *, dtype: Any,
                    precision: jax.lax.Precision = PRECISION,
                    lengths: Array | None = None) -> tuple[Array, Array]:
    """``scan``, GRU: xs (T, B, D), carry h (B, H) → (h after step T, outputs (T, B, H))."""
    return _torch_cell_layer(TorchGRUCell, xs, layer_weights, layer_carry, dtype=dtype, precision=precision,
                            lengths=lengths)


def flax_lstm_layer(xs: Array, layer_weights: LayerWeights, layer_carry: LayerCarry, *, dtype: Any,
                    precision: jax.lax.Precision = PRECISION,
                    lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """``flax``, LSTM: ``nn.RNN`` over Flax's ``nn.OptimizedLSTMCell`` fed PyTorch's weights as
    :func:`flax_cell_stack` feeds it (per gate g: ``i<g>`` = W_ih[g].T, ``h<g>`` = W_hh[g].T with the one bias
    b_ih[g] + b_hh[g], summed inside the differentiated function). xs (T, B, D), carry (h, c) → ((h, c),
    (T, B, H))."""
    (w_ih, w_hh, b_ih, b_hh), (h, c) = layer_weights, layer_carry
    hidden = w_hh.shape[1]
    rows = {g: slice(j * hidden, (j + 1) * hidden) for j, g in enumerate("ifgo")}
    cell = {f"i{g}": {"kernel": w_ih[r].T} for g, r in rows.items()}
    cell.update({f"h{g}": {"kernel": w_hh[r].T, "bias": (b_ih + b_hh)[r]} for g, r in rows.items()})
    rnn = nn.RNN(nn.OptimizedLSTMCell(hidden, dtype=dtype, param_dtype=w_hh.dtype), time_major=True,
                 return_carry=True)
    with jax.default_matmul_precision(precision.name.lower()):  # the cell takes no precision of its own
        (c, h), ys = rnn.apply({"params": {"cell": cell}}, xs, initial_carry=(c, h), seq_lengths=lengths)
    return (h, c), ys


def flax_gru_layer(xs: Array, layer_weights: LayerWeights, layer_carry: Array, *, dtype: Any,
                   precision: jax.lax.Precision = PRECISION) -> tuple[Array, Array]:
    """``flax``, GRU: ``nn.RNN`` over Flax's stock ``nn.GRUCell`` fed PyTorch's weights. Flax's cell computes

        r = σ(W_ir x + b_ir + W_hr h),  z = σ(W_iz x + b_iz + W_hz h),
        n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = (1 − z) ⊙ n + z ⊙ h

    (flax/linen/recurrent.py: Dense ``ir``, ``iz``, ``in`` with biases, ``hr``, ``hz`` without, ``hn`` with): the
    reset gate multiplies W_hn h + b_hn, where PyTorch puts it, and r and z each take one bias where PyTorch has two
    that are only ever summed. So it is PyTorch's GRU exactly, fed ``ir``/``iz`` bias b_ih[g] + b_hh[g] (the sum
    inside the differentiated function: both biases get PyTorch's gradient), ``in`` bias b_in, ``hn`` bias b_hn.
    xs (T, B, D), carry h (B, H) → (h after step T, outputs (T, B, H))."""
    w_ih, w_hh, b_ih, b_hh = layer_weights
    hidden = w_hh.shape[1]
    rows = {g: slice(j * hidden, (j + 1) * hidden) for j, g in enumerate("rzn")}
    cell = {f"i{g}": {"kernel": w_ih[r].T, "bias": (b_ih[r] if g == "n" else (b_ih + b_hh)[r])}
            for g, r in rows.items()}
    cell |= {f"h{g}": {"kernel": w_hh[r].T} for g, r in rows.items()}
    cell["hn"]["bias"] = b_hh[rows["n"]]
    rnn = nn.RNN(nn.GRUCell(hidden, dtype=dtype, param_dtype=w_hh.dtype), time_major=True, return_carry=True)
    with jax.default_matmul_precision(precision.name.lower()):  # the cell takes no precision of its own
        return rnn.apply({"params": {"cell": cell}}, xs, initial_carry=layer_carry)

"""pytorch/examples' ``word_language_model`` ``RNNModel`` in Flax linen: Embedding → dropout → L-layer LSTM or GRU
(dropout between layers) → dropout → Linear(V) at every time step. This is the path that trains.

    logits, carry = model.apply({"params": p}, tokens (T, B) int32, carry, train=False, rngs={"dropout": key})

Time-major, as the example: logits (T, B, V). The carry goes in and out explicitly, a tuple of L per-layer carries,
bottom first: LSTM pairs ``(h, c)``, GRU ``h``, each (B, H) (PyTorch keeps (L, B, H) stacks). The parameter tree is
PyTorch's, names and layouts (``common.lm_params``: two biases per layer, gates i, f, g, o or r, z, n), nested at the
first dot: ``{"encoder": {"weight"}, "rnn": {"weight_ih_l0", ...}, "decoder": {"weight", "bias"}}``, so
:func:`to_flax` and :func:`from_flax` only nest and flatten names. With ``tied`` the decoder reads the encoder's table
and the tree has no ``decoder/weight``.

The recurrence is one of :data:`jax_impl.recurrences.layers.LAYERS` (``impl``, one layer at a time, every step's
output returned): ``scan`` (Flax ``nn.RNN`` over PyTorch's cells: the reference) and ``flax`` (``nn.RNN`` over Flax's
stock ``nn.OptimizedLSTMCell`` and ``nn.GRUCell`` fed these weights, which represent PyTorch's cells exactly) for both
cells; for the LSTM also ``fused`` (XLA's loop with hand-written gradients), ``onednn`` and ``kernel`` (oneDNN's
primitive and our kernel through XLA's FFI). Every matmul runs at ``precision`` (``jax_impl.numerics``).
"""
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from common.errors import ConfigError
from common.lm_params import GATES, INIT_RANGE, check_lm_sizes
from common.params import Params
from jax_impl.recurrences import choice, stacks
from jax_impl.recurrences.layers import LAYERS
from jax_impl.numerics import PRECISION, Array, compute_dtype, dot, matmul_precision


LMCarry = tuple[Any, ...]  # L per-layer carries, bottom first: LSTM (h, c), GRU h, each (B, H)


def uniform(bound: float):
    """An initializer drawing U(-bound, bound)."""
    return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


class Encoder(nn.Module):
    """``nn.Embedding(V, E)``'s table ``weight`` (V, E), U(-0.1, 0.1); calling it returns the table."""

    vocab_size: int
    embed_dim: int
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self) -> Array:
        return self.param("weight", uniform(INIT_RANGE), (self.vocab_size, self.embed_dim), self.param_dtype)


class Decoder(nn.Module):
    """``nn.Linear(H, V)``: x (..., H) → ``x @ weight.T + bias`` (..., V) at ``precision``. ``weight`` (V, H),
    U(-0.1, 0.1), is its own unless a tied one is given; ``bias`` (V,) starts at zero."""

    vocab_size: int
    param_dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION

    @nn.compact
    def __call__(self, x: Array, tied_weight: Array | None = None) -> Array:
        weight = tied_weight if tied_weight is not None else self.param(
            "weight", uniform(INIT_RANGE), (self.vocab_size, x.shape[-1]), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.vocab_size,), self.param_dtype)
        return dot(x, weight.T, self.precision) + bias


class RNNStack(nn.Module):
    """``nn.LSTM`` / ``nn.GRU(E, H, layers, dropout)``, time-major: ``(xs (T, B, E), carry) → (the top layer's outputs
    (T, B, H), the new carry)``.

    Parameters: ``weight_ih_l{k}`` (G·H, D_k), ``weight_hh_l{k}`` (G·H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}``
    (G·H,), U(-1/√H, 1/√H) as PyTorch initialises them. In training the input of each layer above the first is
    multiplied by a (T, B, H) mask of 0 and 1/(1-p) drawn from the 'dropout' rng."""

    hidden_dim: int
    layers: int
    cell: str = "lstm"
    dropout: float = 0.5
    impl: str = "scan"
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION

    @nn.compact
    def __call__(self, xs: Array, carry: LMCarry, train: bool = False) -> tuple[Array, LMCarry]:
        hidden, rows = self.hidden_dim, GATES[self.cell] * self.hidden_dim
        weights = []
        for k in range(self.layers):
            shapes = {"weight_ih": (rows, xs.shape[-1] if k == 0 else hidden), "weight_hh": (rows, hidden),
                      "bias_ih": (rows,), "bias_hh": (rows,)}
            weights.append(tuple(self.param(f"{name}_l{k}", uniform(hidden ** -0.5), shape, self.dtype)
                                 for name, shape in shapes.items()))
        masks = None
        if train and self.dropout > 0 and self.layers > 1:
            keep = 1.0 - self.dropout
            keys = jax.random.split(self.make_rng("dropout"), self.layers - 1)
            masks = [jax.random.bernoulli(key, keep, xs.shape[:2] + (hidden,)).astype(self.dtype) / keep
                     for key in keys]
        layer = partial(LAYERS[self.impl][self.cell], dtype=self.dtype, precision=self.precision)
        finals, outputs = stacks.stack_layers(xs, weights, carry, masks, layer)
        return outputs, finals


class RNNModel(nn.Module):
    """The language model: ``apply({'params': p}, tokens (T, B) int32, carry, train=False, rngs={'dropout': key})``
    → ``(logits (T, B, V), new carry)``. ``cell`` 'lstm' | 'gru'; ``impl`` a key of :data:`LAYERS`; ``dtype`` the
    parameters' and the computation's (float32, or float64 under ``jax_enable_x64``). Dropout (training only) acts on
    the embeddings, between layers and before the decoder, all at rate ``dropout``."""

    vocab_size: int
    embed_dim: int
    hidden_dim: int
    layers: int
    cell: str = "lstm"
    dropout: float = 0.5
    tied: bool = False
    impl: str = "scan"
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION

    def __post_init__(self) -> None:
        check_lm_sizes(self.embed_dim, self.hidden_dim, self.cell, self.tied)
        if self.cell not in LAYERS.get(self.impl, {}):
            raise ConfigError(f"the language model's {self.cell} recurrence is one of "
                              f"{', '.join(impl for impl in LAYERS if self.cell in LAYERS[impl])}, got {self.impl!r}")
        super().__post_init__()

    def zero_carry(self, batch_size: int) -> LMCarry:
        """Zeros in the parameters' dtype: L pairs ``(h, c)`` (LSTM) or L ``h`` (GRU), each (batch_size, H)."""
        zeros = jnp.zeros((batch_size, self.hidden_dim), self.dtype)
        return tuple((zeros, zeros) if self.cell == "lstm" else zeros for _ in range(self.layers))

    @nn.compact
    def __call__(self, tokens: Array, carry: LMCarry, train: bool = False) -> tuple[Array, LMCarry]:
        if len(carry) != self.layers:
            raise ValueError(f"carry has {len(carry)} layers, the model {self.layers}")
        table = Encoder(self.vocab_size, self.embed_dim, self.dtype, name="encoder")()  # (V, E)
        emb = nn.Dropout(self.dropout, deterministic=not train)(jnp.take(table, tokens, axis=0))  # (T, B, E)
        rnn = RNNStack(self.hidden_dim, self.layers, self.cell, self.dropout, self.impl, self.dtype, self.precision,
                       name="rnn")
        output, carry = rnn(emb, carry, train)  # (T, B, H): the top layer at every step
        output = nn.Dropout(self.dropout, deterministic=not train)(output)
        decoder = Decoder(self.vocab_size, self.dtype, self.precision, name="decoder")
        return decoder(output, table if self.tied else None), carry  # (T, B, V)


def cross_entropy(logits: Array, targets: Array) -> Array:
    """``nn.CrossEntropyLoss`` of ``logits`` (T, B, V) against ``targets`` (T, B) int: the mean over all T·B tokens,
    the log-softmax in float32 or wider (perplexity = exp of it)."""
    wide = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    return optax.softmax_cross_entropy_with_integer_labels(wide, targets).mean()


def make_lm_model(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str = "lstm",
                  dropout: float = 0.5, tied: bool = False, impl: str = "scan",
                  precision: jax.lax.Precision = PRECISION) -> RNNModel:
    """The model of these sizes, float32 (its initial parameters: ``to_flax(common.lm_params.init_lm_params(...))``,
    the numbers the PyTorch twin starts from)."""
    return RNNModel(vocab_size, embed_dim, hidden_dim, layers, cell, dropout, tied, impl, jnp.float32, precision)


def to_flax(neutral: Params, dtype: Any = None) -> dict:
    """Neutral name → array to the Flax params tree: each name nested at its first dot, the arrays as they are (or in
    ``dtype``)."""
    tree: dict = {}
    for name, value in neutral.items():
        module, leaf = name.split(".", 1)
        tree.setdefault(module, {})[leaf] = np.asarray(value, dtype)
    return tree


def from_flax(tree: Any, dtype: Any = np.float32) -> Params:
    """A Flax-layout pytree (parameters or their gradients, numpy or jax arrays) to neutral numpy arrays in ``dtype``
    (default float32, the checkpoint's), in ``common.lm_params.lm_param_shapes``'s order."""
    tree = jax.device_get(tree)
    layers = sum(1 for leaf in tree["rnn"] if leaf.startswith("weight_ih_l"))
    names = [("encoder", "weight")]
    names += [("rnn", f"{name}_l{k}") for k in range(layers)
              for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    names += [("decoder", leaf) for leaf in ("weight", "bias") if leaf in tree["decoder"]]
    return {f"{module}.{leaf}": np.array(tree[module][leaf], dtype) for module, leaf in names}


def lm_model_from_config(cfg, vocab_size: int) -> RNNModel:
    """The language model ``cfg`` describes (``--cell``, ``--tied``, sizes, ``--dropout``, ``--lstm-impl``), computing
    in ``--dtype``, its matmuls at the precision ``--allow-tf32`` asks for."""
    impl = choice.resolve(cfg.lstm_impl, choice.Run.of(cfg))
    return RNNModel(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.cell, cfg.dropout, cfg.tied, impl,
                    compute_dtype(cfg.dtype), matmul_precision(cfg.allow_tf32))

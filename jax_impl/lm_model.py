"""pytorch/examples' ``word_language_model`` ``RNNModel`` in Flax linen: Embedding → dropout → L-layer LSTM or GRU
(dropout between layers) → dropout → Linear(V) at every time step. This is the path that trains.

    logits, carry = model.apply({"params": p}, tokens (T, B) int32, carry, train=False, rngs={"dropout": key})

Time-major, as the example: logits (T, B, V). The carry goes in and out explicitly, a tuple of L per-layer carries,
bottom first: LSTM pairs ``(h, c)``, GRU ``h``, each (B, H) (PyTorch keeps (L, B, H) stacks). The parameter tree is
PyTorch's, names and layouts (``common.params``: two biases per layer, gates i, f, g, o or r, z, n), nested at the
first dot: ``{"encoder": {"weight"}, "rnn": {"weight_ih_l0", ...}, "decoder": {"weight", "bias"}}``
(:func:`jax_impl.lm.to_flax`, :func:`jax_impl.lm.from_flax`). With ``tied`` the decoder reads the encoder's table
and the tree has no ``decoder/weight``.

The recurrence is :class:`jax_impl.recurrences.stack.RNNStack`, run by the implementation ``impl`` names, a key of
:data:`jax_impl.recurrences.choice.REGISTRY` serving the cell: ``scan`` (Flax ``nn.RNN`` over PyTorch's cells: the
reference) and ``flax`` (Flax's stock cells fed these weights) for both cells; for the LSTM also ``fused``,
``onednn``, ``kernel`` and ``cudnn``. The default, ``fused``, is what ``auto`` runs for the LSTM (a GRU names its
own; ``auto`` runs ``scan``). Every matmul runs at ``precision`` (``jax_impl.numerics``).

From the model to the code that computes the gates, the default, 4 calls: ``RNNModel.__call__`` →
``RNNStack.__call__`` → ``fused.lstm_layer`` → ``fused._recurrence`` (a ``custom_vjp``) → ``_recurrence_forward``,
its loop.
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from common.errors import ConfigError
from common.params import INIT_RANGE, check_lm_sizes
from jax_impl.numerics import PRECISION, Array, Carry, dot
from jax_impl.recurrences.choice import REGISTRY
from jax_impl.recurrences.stack import RNNStack


LMCarry = Carry  # L per-layer carries, bottom first: LSTM (h, c), GRU h, each (B, H)


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


class RNNModel(nn.Module):
    """The language model: ``apply({'params': p}, tokens (T, B) int32, carry, train=False, rngs={'dropout': key})``
    → ``(logits (T, B, V), new carry)``. ``cell`` 'lstm' | 'gru'; ``impl`` a key of ``REGISTRY``; ``dtype`` the
    parameters' and the computation's (float32, or float64 under ``jax_enable_x64``). Dropout (training only) acts on
    the embeddings, between layers and before the decoder, all at rate ``dropout``."""

    vocab_size: int
    embed_dim: int
    hidden_dim: int
    layers: int
    cell: str = "lstm"
    dropout: float = 0.5
    tied: bool = False
    impl: str = "fused"
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION

    def __post_init__(self) -> None:
        check_lm_sizes(self.embed_dim, self.hidden_dim, self.cell, self.tied)
        if self.impl not in REGISTRY or self.cell not in REGISTRY[self.impl].layers:
            runs = ", ".join(name for name, r in REGISTRY.items() if self.cell in r.layers)
            raise ConfigError(f"the language model's {self.cell} recurrence is one of {runs}, got {self.impl!r}")
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
        rnn = RNNStack(self.embed_dim, self.hidden_dim, self.layers, REGISTRY[self.impl], self.cell, self.dropout,
                       self.dtype, self.dtype, self.precision, name="rnn")
        output, carry = rnn(emb, carry, train)  # (T, B, H): the top layer at every step
        output = nn.Dropout(self.dropout, deterministic=not train)(output)
        decoder = Decoder(self.vocab_size, self.dtype, self.precision, name="decoder")
        return decoder(output, table if self.tied else None), carry  # (T, B, V)


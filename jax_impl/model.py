"""The seed's sentiment classifier in Flax linen: Embed → L LSTM layers → dropout → Dense(1).

The LSTM layer is written in PyTorch's layout so that it trains the same function, not only computes the
same forward pass: per layer an input projection ``x @ W_ih^T + b_ih`` over the whole sequence at once
(outside the recurrence), then ``nn.RNN`` over a cell that adds ``h @ W_hh^T + b_hh``. Gate order i, f, g, o;
two biases. Every matmul asks for full float32 (``Precision.HIGHEST``) so GPUs whose default is TF32 still
agree with the CPU and with PyTorch.

The carry is an explicit pytree: a tuple of L pairs ``(h, c)``, each (B, H); PyTorch's ``(L, B, H)`` stacks
exist only at the boundary (:func:`jax_impl.convert.carry_to_stacked` / ``carry_from_stacked``).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
LayerCarry = tuple[Array, Array]  # (h, c), each (B, H)
Carry = tuple[LayerCarry, ...]  # one pair per layer, bottom first

# Full float32 matmuls: on GPUs the default would be TF32 (10-bit mantissa), which breaks parity.
PRECISION = jax.lax.Precision.HIGHEST


def init_carry(batch_size: int, layers: int, hidden_dim: int, dtype: Any = jnp.float32) -> Carry:
    """Zeros: ``layers`` pairs ``(h, c)``, each (batch_size, hidden_dim)."""
    zeros = jnp.zeros((batch_size, hidden_dim), dtype)
    return tuple((zeros, zeros) for _ in range(layers))


def param_dtype_for(dtype: Any) -> Any:
    """Parameters stay float32 under bfloat16 compute (mixed precision), and are float64 under float64."""
    return jnp.promote_types(dtype, jnp.float32)


class LSTMRecurrentCell(nn.RNNCellBase):
    """One time step given the precomputed input gates: ``gates = gates_x + h @ W_hh^T + b_hh``.

    ``gates_x`` (B, 4H) already holds ``x @ W_ih^T + b_ih``. The carry keeps its own dtype (float32 even
    when the gates are computed in bfloat16), so the scan's carry type never changes.
    """

    hidden_dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, carry: LayerCarry, gates_x: Array) -> tuple[LayerCarry, Array]:
        h, c = carry
        hidden_proj = nn.Dense(4 * self.hidden_dim, dtype=self.dtype, param_dtype=param_dtype_for(self.dtype),
                               precision=PRECISION, name="hh")
        gates = gates_x + hidden_proj(h)  # (B, 4H)
        i, f, g, o = jnp.split(gates, 4, axis=-1)  # PyTorch's gate order
        i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        new_c = (f * c + i * g).astype(c.dtype)
        new_h = (o * jnp.tanh(new_c)).astype(h.dtype)
        return (new_h, new_c), new_h

    @nn.nowrap
    def initialize_carry(self, rng: Any, input_shape: tuple[int, ...]) -> LayerCarry:
        zeros = jnp.zeros((*input_shape[:-1], self.hidden_dim), param_dtype_for(self.dtype))
        return zeros, zeros

    @property
    def num_feature_axes(self) -> int:
        return 1


class LSTMRecurrence(nn.Module):
    """The recurrence of one layer: ``(gates_x (B, T, 4H), carry) → (carry, outputs (B, T, H))``.

    This is the one place the time loop lives (``nn.RNN``, i.e. a ``lax.scan``); a faster version (for
    instance a ``jax.custom_vjp`` over the whole loop) replaces this module and nothing else. Its
    parameters are ``cell/hh/{kernel (H, 4H), bias (4H,)}`` (see :mod:`jax_impl.convert`).

    ``lengths`` (B,) int32 (masked variable-length mode): past each text's length the carry stops changing,
    and the returned carry is each text's state at its last token (``nn.RNN``'s ``seq_lengths``).
    """

    hidden_dim: int
    dtype: Any = jnp.float32
    unroll: int = 1

    @nn.compact
    def __call__(self, gates_x: Array, carry: LayerCarry, lengths: Array | None = None
                 ) -> tuple[LayerCarry, Array]:
        rnn = nn.RNN(LSTMRecurrentCell(self.hidden_dim, self.dtype, name="cell"), return_carry=True,
                     unroll=self.unroll)
        return rnn(gates_x, initial_carry=carry, seq_lengths=lengths)


class LSTMLayer(nn.Module):
    """One PyTorch-layout LSTM layer: ``(x (B, T, D), carry) → (outputs (B, T, H), carry)``."""

    hidden_dim: int
    dtype: Any = jnp.float32
    unroll: int = 1

    @nn.compact
    def __call__(self, xs: Array, carry: LayerCarry, lengths: Array | None = None) -> tuple[Array, LayerCarry]:
        # The input projection of every time step at once: one large matmul outside the recurrence.
        gates_x = nn.Dense(4 * self.hidden_dim, dtype=self.dtype, param_dtype=param_dtype_for(self.dtype),
                           precision=PRECISION, name="ih")(xs)  # (B, T, 4H)
        carry, outputs = LSTMRecurrence(self.hidden_dim, self.dtype, self.unroll, name="recurrence")(
            gates_x, carry, lengths)
        return outputs, carry


class SentimentRNN(nn.Module):
    """Embed → ``layers`` LSTM layers → dropout → Dense(1): the logit of the top layer's final h.

    ``apply({'params': p}, tokens (B, T) int32, carry, lengths=None, train=False, rngs={'dropout': key})``
    returns ``(logits (B,), new_carry)``. Dropout (training only) acts between LSTM layers, on the whole
    sequence fed to the next layer (``dropout``), and on the final h before the Dense (``fc_dropout``).
    Under bfloat16 the logits come back as float32 so the loss is computed in float32. ``unroll``: time
    steps per iteration of the recurrence's loop (a speed knob of ``lax.scan``; the numbers are the same).
    """

    vocab_size: int
    embed_dim: int
    hidden_dim: int
    layers: int
    dropout: float = 0.5
    fc_dropout: float = 0.3
    dtype: Any = jnp.float32
    unroll: int = 1
    fused: bool = False

    @nn.compact
    def __call__(self, tokens: Array, carry: Carry, lengths: Array | None = None, train: bool = False
                 ) -> tuple[Array, Carry]:
        if len(carry) != self.layers:
            raise ValueError(f"carry has {len(carry)} layers, the model {self.layers}")
        pdtype = param_dtype_for(self.dtype)
        if self.fused and not self.is_initializing():
            new_carry = self._fused_layers(tokens, carry, lengths, train)
        else:
            xs = nn.Embed(self.vocab_size, self.embed_dim, dtype=self.dtype, param_dtype=pdtype,
                          name="embedding")(tokens)  # (B, T, E)
            new_carry = []
            for k in range(self.layers):
                if k > 0:
                    xs = nn.Dropout(self.dropout, deterministic=not train)(xs)
                xs, layer_carry = LSTMLayer(self.hidden_dim, self.dtype, self.unroll, name=f"lstm_l{k}")(
                    xs, carry[k], lengths)
                new_carry.append(layer_carry)
        top_h = new_carry[-1][0]  # (B, H): the last step's output, or each text's last token with lengths
        top_h = nn.Dropout(self.fc_dropout, deterministic=not train)(top_h)
        logits = nn.Dense(1, dtype=self.dtype, param_dtype=pdtype, precision=PRECISION, name="fc")(top_h)
        return logits[:, 0].astype(pdtype), tuple(new_carry)


    def _fused_layers(self, tokens: Array, carry: Carry, lengths: Array | None, train: bool) -> Carry:
        """The embedding and the LSTM layers through :func:`jax_impl.recurrence.embedding_lstm_stack`: the same
        function, from the same parameters, computed faster on a CPU (hand-written gradients, a two-layer
        wavefront, the embedding folded into layer 0's input projection; benchmarks/PERFORMANCE.md).
        Dropout between layers: one (T, B, H) mask per layer boundary, 0 or 1/(1-p), from the 'dropout' rng."""
        from jax_impl.recurrence import embedding_lstm_stack

        params = self.variables["params"]
        layer_params = []
        for k in range(self.layers):
            ih, hh = params[f"lstm_l{k}"]["ih"], params[f"lstm_l{k}"]["recurrence"]["cell"]["hh"]
            layer_params.append((ih["kernel"].T, hh["kernel"].T, ih["bias"], hh["bias"]))  # PyTorch's layout
        table = params["embedding"]["embedding"]  # (V, E)
        masks = None
        if train and self.dropout > 0 and self.layers > 1:
            keep = 1.0 - self.dropout
            shape = (tokens.shape[1], tokens.shape[0], self.hidden_dim)  # (T, B, H), time-major
            keys = jax.random.split(self.make_rng("dropout"), self.layers - 1)
            masks = [jax.random.bernoulli(key, keep, shape).astype(table.dtype) / keep for key in keys]
        _, new_carry = embedding_lstm_stack(table, tokens.T, layer_params, carry, lengths, masks,
                                            return_outputs=False)
        return tuple(tuple(layer) for layer in new_carry)


def model_from_config(cfg, vocab_size: int) -> SentimentRNN:
    """The model a :class:`common.config.Config` describes (compute dtype from ``cfg.dtype``)."""
    # The fast recurrence (jax_impl.recurrence) is the default path; bfloat16 keeps the scan, whose mixed
    # precision (float32 parameters and carry, bfloat16 gates) the fast path does not implement.
    return SentimentRNN(vocab_size=vocab_size, embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
                        layers=cfg.layers, dropout=cfg.dropout, fc_dropout=cfg.fc_dropout,
                        dtype=compute_dtype(cfg.dtype), fused=cfg.dtype != "bfloat16")


def compute_dtype(name: str) -> Any:
    """'float32' | 'bfloat16' | 'float64' → the jnp dtype (float64 needs ``jax_enable_x64``)."""
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}[name]

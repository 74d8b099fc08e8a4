"""``scan``, the reference: each layer a Flax ``nn.RNN`` over PyTorch's cell (:mod:`.cells`), differentiated by JAX,
its input projected for all steps at once as ``nn.LSTM`` does. Under bfloat16 the LSTM computes as PyTorch's autocast
does (:class:`AutocastLSTMCell`). Layers as :mod:`.interface` describes them."""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_impl.numerics import PRECISION, Array, LayerCarry, LayerWeights, bfloat16_dot, dot, to_bfloat16
from jax_impl.recurrences.cells import TorchGRUCell, TorchLSTMCell
from jax_impl.recurrences.interface import Recurrence


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


def _run(cell: nn.RNNCellBase, gates_x: Array, carry: Any, lengths: Array | None) -> tuple[Any, Array]:
    """``nn.RNN`` of ``cell`` over ``gates_x`` (T, B, G·H) from ``carry`` → (the final carry, outputs (T, B, H))."""
    return nn.RNN(cell, time_major=True, return_carry=True).apply({}, gates_x, initial_carry=carry,
                                                                  seq_lengths=lengths)


def _autocast_layer(xs: Array, weights: LayerWeights, carry: LayerCarry, precision: jax.lax.Precision,
                    lengths: Array | None) -> tuple[LayerCarry, Array]:
    """The LSTM layer under PyTorch's bfloat16 autocast, float32 arrays in and out: oneDNN's rules, or the ATen
    cell's with ``lengths`` (PyTorch runs packed sequences there)."""
    (w_ih, w_hh, b_ih, b_hh), (h, c) = weights, carry
    kernel = "onednn" if lengths is None else "native"
    projected = bfloat16_dot(xs, w_ih.T, precision)  # all steps at once
    if kernel == "onednn":  # autocast's casts: the biases are added in bfloat16, h0 and c0 rounded
        gates_x = projected + to_bfloat16(to_bfloat16(b_ih) + to_bfloat16(b_hh))
        h, c = to_bfloat16(h), to_bfloat16(c)
    else:
        gates_x = to_bfloat16(projected + to_bfloat16(b_ih))
    return _run(AutocastLSTMCell(w_hh.T, to_bfloat16(b_hh), kernel, precision), gates_x, (h, c), lengths)


def lstm_layer(xs: Array, weights: LayerWeights, carry: LayerCarry, *, dtype: Any,
               precision: jax.lax.Precision = PRECISION, lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """PyTorch's LSTM layer in ``dtype`` (bfloat16: autocast's mixed precision on float32 arrays)."""
    if dtype == jnp.bfloat16:
        return _autocast_layer(xs, weights, carry, precision, lengths)
    return _torch_layer(TorchLSTMCell, xs, weights, carry, dtype, precision, lengths)


def gru_layer(xs: Array, weights: LayerWeights, carry: Array, *, dtype: Any,
              precision: jax.lax.Precision = PRECISION, lengths: Array | None = None) -> tuple[Array, Array]:
    """PyTorch's GRU layer in ``dtype``."""
    return _torch_layer(TorchGRUCell, xs, weights, carry, dtype, precision, lengths)


def _torch_layer(cell_class: type, xs: Array, weights: LayerWeights, carry: Any, dtype: Any,
                 precision: jax.lax.Precision, lengths: Array | None) -> tuple[Any, Array]:
    w_ih, w_hh, b_ih, b_hh = weights
    gates_x = dot(xs.astype(dtype), w_ih.T.astype(dtype), precision) + b_ih.astype(dtype)  # (T, B, G·H)
    return _run(cell_class(w_hh.T.astype(dtype), b_hh.astype(dtype), dtype, precision), gates_x, carry, lengths)


RECURRENCE = Recurrence(
    "scan", "Flax nn.RNN over PyTorch's LSTM and GRU cells, differentiated by JAX: the reference (bfloat16: autocast)",
    {"lstm": lstm_layer, "gru": gru_layer})

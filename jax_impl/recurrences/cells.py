"""PyTorch's LSTM and GRU cells, the equations every implementation is tested against, as Flax ``nn.RNN`` cells.

    LSTM (gates i, f, g, o):  [i, f, g, o] = x W_ih^T + b_ih + h W_hh^T + b_hh
                              c' = σ(f) c + σ(i) tanh(g),  h' = σ(o) tanh(c')
    GRU (gates r, z, n):      r = σ(W_ir x + b_ir + W_hr h + b_hr),  z = σ(W_iz x + b_iz + W_hz h + b_hz)
                              n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = (1 − z) ⊙ n + z ⊙ h

Each cell takes its step's input half ``x W_ih^T + b_ih`` already projected (all steps at once, as ``nn.LSTM`` does)
and its recurrent weights as fields, not parameters of its own: ``(carry, gates_x (B, G·H)) → (carry', h')``.
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
LayerCarry = tuple[Array, Array]


class TorchLSTMCell(nn.RNNCellBase):
    """PyTorch's LSTM cell: ``((h, c), gates_x (B, 4H)) → ((h', c'), h')``, computed in ``dtype``."""

    w_hh_t: Array  # (H, 4H)
    b_hh: Array  # (4H,)
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = jax.lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, state: LayerCarry, gates_x: Array) -> tuple[LayerCarry, Array]:
        h, c = state
        gates = gates_x + (jnp.matmul(h.astype(self.dtype), self.w_hh_t, precision=self.precision) + self.b_hh)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c_new = (jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)).astype(c.dtype)
        h_new = (jax.nn.sigmoid(o) * jnp.tanh(c_new)).astype(h.dtype)
        return (h_new, c_new), h_new

    @property
    def num_feature_axes(self) -> int:
        return 1


class TorchGRUCell(nn.RNNCellBase):
    """PyTorch's GRU cell: ``(h, gates_x (B, 3H)) → (h', h')``, computed in ``dtype``; the reset gate multiplies
    ``W_hn h + b_hn``, where PyTorch puts it."""

    w_hh_t: Array  # (H, 3H)
    b_hh: Array  # (3H,)
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = jax.lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, h: Array, gates_x: Array) -> tuple[Array, Array]:
        gates_h = jnp.matmul(h.astype(self.dtype), self.w_hh_t, precision=self.precision) + self.b_hh
        x_r, x_z, x_n = jnp.split(gates_x, 3, axis=-1)
        h_r, h_z, h_n = jnp.split(gates_h, 3, axis=-1)
        r, z = jax.nn.sigmoid(x_r + h_r), jax.nn.sigmoid(x_z + h_z)
        n = jnp.tanh(x_n + r * h_n)
        h_new = ((1 - z) * n + z * h).astype(h.dtype)
        return h_new, h_new

    @property
    def num_feature_axes(self) -> int:
        return 1

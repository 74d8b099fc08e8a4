"""``flax``: what a Flax user writes, ``nn.RNN`` over Flax's stock ``nn.OptimizedLSTMCell`` and ``nn.GRUCell`` (each
step's input projected inside the loop), fed PyTorch's weights. Both represent PyTorch's cells exactly: where PyTorch
has two biases that are only ever summed, the stock cell's one bias is their sum, taken inside the differentiated
function, so both get PyTorch's gradient. The cells take no precision: their matmuls run at ``precision`` through
JAX's default-precision setting. Layers as :mod:`.interface` describes them."""
from typing import Any

import flax.linen as nn
import jax

from jax_impl.numerics import PRECISION, Array, LayerCarry, LayerWeights
from jax_impl.recurrences.interface import Recurrence


def lstm_layer(xs: Array, weights: LayerWeights, carry: LayerCarry, *, dtype: Any,
               precision: jax.lax.Precision = PRECISION, lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """``nn.OptimizedLSTMCell``: per gate g its kernels ``i<g>`` = W_ih[g].T and ``h<g>`` = W_hh[g].T, its one bias
    (in ``h<g>``) b_ih[g] + b_hh[g]. The cell carries (c, h)."""
    (w_ih, w_hh, b_ih, b_hh), (h, c) = weights, carry
    hidden = w_hh.shape[1]
    rows = {g: slice(j * hidden, (j + 1) * hidden) for j, g in enumerate("ifgo")}
    cell = {f"i{g}": {"kernel": w_ih[r].T} for g, r in rows.items()}
    cell.update({f"h{g}": {"kernel": w_hh[r].T, "bias": (b_ih + b_hh)[r]} for g, r in rows.items()})
    rnn = nn.RNN(nn.OptimizedLSTMCell(hidden, dtype=dtype, param_dtype=w_hh.dtype), time_major=True,
                 return_carry=True)
    with jax.default_matmul_precision(precision.name.lower()):
        (c, h), ys = rnn.apply({"params": {"cell": cell}}, xs, initial_carry=(c, h), seq_lengths=lengths)
    return (h, c), ys


def gru_layer(xs: Array, weights: LayerWeights, carry: Array, *, dtype: Any,
              precision: jax.lax.Precision = PRECISION, lengths: Array | None = None) -> tuple[Array, Array]:
    """``nn.GRUCell`` (flax/linen/recurrent.py: Dense ``ir``, ``iz``, ``in`` with biases, ``hr``, ``hz`` without,
    ``hn`` with) computes PyTorch's GRU, its reset gate on W_hn h + b_hn: fed ``ir``/``iz`` bias b_ih[g] + b_hh[g],
    ``in`` bias b_in, ``hn`` bias b_hn."""
    w_ih, w_hh, b_ih, b_hh = weights
    hidden = w_hh.shape[1]
    rows = {g: slice(j * hidden, (j + 1) * hidden) for j, g in enumerate("rzn")}
    cell = {f"i{g}": {"kernel": w_ih[r].T, "bias": (b_ih[r] if g == "n" else (b_ih + b_hh)[r])}
            for g, r in rows.items()}
    cell |= {f"h{g}": {"kernel": w_hh[r].T} for g, r in rows.items()}
    cell["hn"]["bias"] = b_hh[rows["n"]]
    rnn = nn.RNN(nn.GRUCell(hidden, dtype=dtype, param_dtype=w_hh.dtype), time_major=True, return_carry=True)
    with jax.default_matmul_precision(precision.name.lower()):
        return rnn.apply({"params": {"cell": cell}}, xs, initial_carry=carry, seq_lengths=lengths)


RECURRENCE = Recurrence("flax", "Flax's stock nn.OptimizedLSTMCell and nn.GRUCell under nn.RNN, fed PyTorch's weights",
                        {"lstm": lstm_layer, "gru": gru_layer})

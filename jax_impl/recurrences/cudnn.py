"""The LSTM stack on cuDNN's fused kernel (``jax.experimental.rnn.lstm``), the kernel PyTorch's ``nn.LSTM`` runs on
CUDA, over the one parameter tree the other implementations read.

cuDNN takes one flat float32 vector: every layer's ``W_ih``, ``W_hh`` (row-major, PyTorch's layout and gate order
i, f, g, o), then every layer's ``b_ih``, ``b_hh``. Inter-layer dropout cannot be cuDNN's own (its masks come from
its own generator, not a JAX key), so with dropout the layers run as single-layer calls with the project's masks
between them. Float32 only; a CUDA backend only (it has no CPU lowering).
"""
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import rnn

from jax_impl.numerics import PRECISION, LayerCarry, LayerWeights

Array = jax.Array


def bfloat16_refusal() -> str:
    """Why ``jax.experimental.rnn`` cannot compute bfloat16, in its own words (it reads precision DEFAULT as bfloat16,
    and refuses that; no GPU needed to ask)."""
    try:
        rnn._lstm_cudnn_allow_tf32(jax.lax.Precision.DEFAULT)
    except NotImplementedError as err:
        return str(err)
    except AttributeError:  # a JAX whose private helper moved: the words of jax 0.10
        pass
    return "bfloat16 support not implemented for LSTM"


def pack_weights(weights: Sequence[LayerWeights]) -> Array:
    """L layers' ``(w_ih, w_hh, b_ih, b_hh)`` → cuDNN's flat vector (all matrices, then all biases)."""
    matrices = [w.ravel() for w_ih, w_hh, _, _ in weights for w in (w_ih, w_hh)]
    biases = [b for _, _, b_ih, b_hh in weights for b in (b_ih, b_hh)]
    return jnp.concatenate([*matrices, *biases])


def cudnn_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Sequence[LayerCarry],
                lengths: Array | None, masks: Sequence[Array] | None, *,
                precision: jax.lax.Precision = PRECISION) -> tuple[LayerCarry, ...]:
    """``nn.LSTM`` through cuDNN → each layer's final (h, c), each (B, H).

    table (V, E); tokens (T, B) int32; ``masks``: None or L-1 (T, B, H) multipliers of the inputs of layers 1..L-1;
    lengths (B,) (masked mode: each row's carry after its last token) or None (all T). cuDNN computes float32;
    ``precision`` HIGHEST keeps it off TF32, anything else allows TF32 (``rnn.lstm`` reads HIGH as TF32 and
    refuses DEFAULT as bfloat16).
    """
    steps, batch = tokens.shape
    xs = jnp.take(table, tokens.T, axis=0)  # (B, T, E): cuDNN's call is batch-major
    seq_lengths = jnp.full((batch,), steps, jnp.int32) if lengths is None else lengths.astype(jnp.int32)
    cudnn_precision = PRECISION if precision == PRECISION else jax.lax.Precision.HIGH

    def run(xs: Array, layer_weights: Sequence[LayerWeights], layer_carry: Sequence[LayerCarry]):
        h0, c0 = (jnp.stack([pair[i] for pair in layer_carry]) for i in (0, 1))  # (L, B, H) each
        ys, h_n, c_n = rnn.lstm(xs, h0, c0, pack_weights(layer_weights), seq_lengths, input_size=xs.shape[-1],
                                hidden_size=h0.shape[-1], num_layers=len(layer_weights), dropout=0.0,
                                bidirectional=False, precision=cudnn_precision)
        return ys, tuple(zip(h_n, c_n))

    if masks is None:
        return run(xs, weights, carry)[1]  # one call: cuDNN runs the whole stack
    finals = []
    for k, (layer_weights, layer_carry) in enumerate(zip(weights, carry)):
        if k > 0:
            xs = xs * masks[k - 1].swapaxes(0, 1).astype(xs.dtype)  # (T, B, H) → (B, T, H)
        xs, final = run(xs, [layer_weights], [layer_carry])
        finals += final
    return tuple(finals)

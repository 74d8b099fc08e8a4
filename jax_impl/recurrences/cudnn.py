"""``cudnn``: the LSTM on cuDNN's fused kernel (``jax.experimental.rnn.lstm``), the kernel PyTorch's ``nn.LSTM`` runs on
CUDA, one call per layer over the one parameter tree the other implementations read.

cuDNN takes one flat float32 vector: the layer's ``W_ih``, ``W_hh`` (row-major, PyTorch's layout and gate order
i, f, g, o), then ``b_ih``, ``b_hh``. Inter-layer dropout stays the stack's (cuDNN's own masks would come from its
generator, not a JAX key), which is why each layer is its own call. Float32 only; a CUDA backend only (it has no CPU
lowering), so the tests that run it are the GPU's (``jax_impl/tests/test_cudnn.py``).
"""
import jax
import jax.numpy as jnp
from jax.experimental import rnn

from jax_impl.numerics import PRECISION, Array, LayerCarry, LayerWeights
from jax_impl.recurrences.interface import Recurrence


def bfloat16_refusal() -> str:
    """Why ``jax.experimental.rnn`` cannot compute bfloat16, in its own words (it reads precision DEFAULT as bfloat16,
    and refuses that; no GPU needed to ask)."""
    try:
        rnn._lstm_cudnn_allow_tf32(jax.lax.Precision.DEFAULT)
    except NotImplementedError as err:
        return str(err)
    except AttributeError:  # a JAX whose helper moved: the words of jax 0.10
        pass
    return "bfloat16 support not implemented for LSTM"


def pack_weights(weights: LayerWeights) -> Array:
    """A layer's ``(w_ih, w_hh, b_ih, b_hh)`` → cuDNN's flat vector (both matrices, then both biases)."""
    return jnp.concatenate([w.ravel() for w in weights])


def lstm_layer(xs: Array, weights: LayerWeights, carry: LayerCarry, *, dtype=jnp.float32,
               precision: jax.lax.Precision = PRECISION, lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """One LSTM layer (:mod:`.interface`) through cuDNN, float32. ``precision`` HIGHEST keeps it off TF32, anything
    else allows TF32 (``rnn.lstm`` reads HIGH as TF32 and refuses DEFAULT as bfloat16)."""
    steps, batch = xs.shape[:2]
    seq_lengths = jnp.full((batch,), steps, jnp.int32) if lengths is None else lengths.astype(jnp.int32)
    (h0, c0), hidden = carry, weights[1].shape[1]
    tf32 = PRECISION if precision == PRECISION else jax.lax.Precision.HIGH
    ys, h_n, c_n = rnn.lstm(xs.swapaxes(0, 1), h0[None], c0[None], pack_weights(weights), seq_lengths,
                            input_size=xs.shape[-1], hidden_size=hidden, num_layers=1, dropout=0.0,
                            bidirectional=False, precision=tf32)
    return (h_n[0], c_n[0]), ys.swapaxes(0, 1)  # cuDNN's call is batch-major


RECURRENCE = Recurrence(
    "cudnn", "cuDNN's LSTM, the kernel nn.LSTM runs on CUDA, through jax.experimental.rnn", {"lstm": lstm_layer},
    dtypes=("float32",), platforms=("gpu", "cuda"),
    why={"bfloat16": f"it cannot compute bfloat16: jax.experimental.rnn says \"{bfloat16_refusal()}\"; use auto",
         "dtype": "it computes float32 only, not {dtype}; use auto",
         "platform": "it needs a CUDA GPU, and this backend is {backend}"})

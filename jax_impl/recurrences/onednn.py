"""``onednn``: the LSTM on oneDNN's LSTM primitive, the kernel PyTorch's ``nn.LSTM`` runs on the CPU, one XLA FFI call
per layer and direction of the pass (:mod:`jax_impl.recurrences.native`'s ``onednn_lstm`` library: the same
oneDNN, the same primitive, the same arguments as ``torch:eager``).

Each layer (:func:`lstm_layer`) is one ``jax.custom_vjp``, :func:`lstm_call`: the forward call is oneDNN's inference
primitive where no gradient is taken and its training primitive under ``jax.grad``, whose workspace (oneDNN's record of
the gates) is an explicit residual, an output of the forward call and an input of the backward one. Dropout between the
layers is applied in JAX (as ATen applies it between its per-layer calls). oneDNN takes one bias, ``b_ih + b_hh`` (ATen
sums them), so both biases get its gradient. Under bfloat16 each layer takes what PyTorch's autocast hands the same
function: bfloat16 input, weights, biases, h0 and c0, and gives back bfloat16 outputs and states (the carry then holds
those values in its own dtype; the parameters' gradients come back through the casts), where this CPU's oneDNN has a
bfloat16 LSTM. No float64 (oneDNN's RNN has none) and no sequence lengths (oneDNN's RNN primitive takes none: PyTorch
itself runs packed sequences on its ATen cell, not on oneDNN).
"""
from __future__ import annotations

import ctypes
import functools

import jax
import jax.numpy as jnp

from common.errors import UnsupportedError
from jax_impl.recurrences import native
from jax_impl.numerics import Array, LayerCarry, LayerWeights
from jax_impl.recurrences.interface import Recurrence

NAME = "onednn_lstm"
TARGETS = native.FFI_HANDLERS[NAME]  # forward, backward, their bfloat16 twins, the denormal probe (last)


def target(kind: str, dtype) -> str:
    """The FFI target of ``kind`` ("forward" or "backward") for arrays of ``dtype`` (float32 or bfloat16)."""
    return f"onednn_lstm_{kind}" + ("_bf16" if dtype == jnp.bfloat16 else "")


def has_bfloat16() -> bool:
    """Whether this CPU's oneDNN creates a bfloat16 LSTM primitive (it refuses one without the instructions)."""
    return library().onednn_lstm_workspace_bytes(1, 1, 1, 1, 1) >= 0


@functools.cache
def library() -> ctypes.CDLL:
    """oneDNN's library (:func:`jax_impl.recurrences.native.load`: checked, its functions typed), its FFI targets
    registered with XLA once, on first use rather than at import: loading it maps all of libtorch_cpu, which a process
    that never runs this tier should not pay for."""
    return native.load(NAME)


@functools.cache
def workspace_bytes(steps: int, batch: int, inputs: int, hidden: int, bfloat16: bool = False) -> int:
    """The size of oneDNN's training workspace for one layer (float32, or bfloat16), asked of the library at trace
    time (one call on zeros), since XLA needs every output's shape before it runs."""
    size = library().onednn_lstm_workspace_bytes(steps, batch, inputs, hidden, int(bfloat16))
    if size < 0:
        raise UnsupportedError(f"oneDNN's LSTM refuses a {'bfloat16' if bfloat16 else 'float32'} layer of T {steps}, "
                               f"B {batch}, D {inputs}, H {hidden}")
    return size


def describe() -> dict:
    """What runs: the oneDNN version (that of the torch it comes from), ATen's intra-op threads, and whether every
    one of them flushes denormals to zero (measured: a GEMM of denormal products on them)."""
    lib = library()
    version = lib.onednn_lstm_version()
    flushed = float(jax.jit(lambda: jax.ffi.ffi_call(TARGETS[-1], jax.ShapeDtypeStruct((), jnp.float32))())())
    return {"lstm_kernel": "onednn", "onednn": f"{version // 10000}.{version // 100 % 100}.{version % 100}"
            if version else None, "onednn_threads": int(lib.onednn_lstm_threads()), "flush_denormal": flushed == 1.0}


def _forward(x, w_ih, w_hh, b_ih, b_hh, h0, c0, train: bool):
    """x (T, B, D) and the layer's arguments, all of x's dtype → (y (T, B, H), h_T, c_T in that dtype, workspace
    (W,) uint8; W is 0 unless ``train``)."""
    steps, batch, inputs = x.shape
    hidden = w_hh.shape[1]
    like_x = functools.partial(jax.ShapeDtypeStruct, dtype=x.dtype)
    workspace = workspace_bytes(steps, batch, inputs, hidden, x.dtype == jnp.bfloat16) if train else 0
    library()  # the targets registered before XLA looks them up
    outputs = (like_x((steps, batch, hidden)), like_x((batch, hidden)), like_x((batch, hidden)),
               jax.ShapeDtypeStruct((workspace,), jnp.uint8))
    return jax.ffi.ffi_call(target("forward", x.dtype), outputs)(x, w_ih, w_hh, b_ih, b_hh, h0, c0, train=train)


@jax.custom_vjp
def lstm_call(x: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array, h0: Array, c0: Array
               ) -> tuple[Array, LayerCarry]:
    """One ``nn.LSTM`` layer on oneDNN: x (T, B, D) → (outputs (T, B, H), (h_T, c_T) each (B, H)), every array
    float32, or every array bfloat16."""
    y, h, c, _ = _forward(x, w_ih, w_hh, b_ih, b_hh, h0, c0, train=False)
    return y, (h, c)


def _lstm_layer_forward(x, w_ih, w_hh, b_ih, b_hh, h0, c0):
    y, h, c, workspace = _forward(x, w_ih, w_hh, b_ih, b_hh, h0, c0, train=True)
    return (y, (h, c)), (x, w_ih, w_hh, b_ih, b_hh, h0, c0, y, h, c, workspace)


def _lstm_layer_backward(residuals, cotangents):
    dy, (dh, dc) = cotangents
    x, w_ih, w_hh = residuals[:3]
    like = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
    dx, dw_ih, dw_hh, db, dh0, dc0 = jax.ffi.ffi_call(target("backward", x.dtype), (
        like(x), like(w_ih), like(w_hh), like(residuals[3]), like(residuals[5]), like(residuals[6])))(
        *residuals, dy, dh, dc)
    return dx, dw_ih, dw_hh, db, db, dh0, dc0


lstm_call.defvjp(_lstm_layer_forward, _lstm_layer_backward)


def lstm_layer(xs: Array, weights: LayerWeights, carry: LayerCarry, *, dtype=jnp.float32, precision=None,
               lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """One LSTM layer (:mod:`.interface`) on oneDNN's primitive, its arrays in ``dtype`` (bfloat16: rounded as
    autocast rounds them), the outputs in ``dtype`` and the carry back in its own dtype. No ``lengths``."""
    if lengths is not None:
        raise UnsupportedError("--lstm-impl onednn: it takes no sequence lengths (--padding right)")
    ys, (h, c) = lstm_call(xs.astype(dtype), *(w.astype(dtype) for w in weights), *(v.astype(dtype) for v in carry))
    return (h.astype(carry[0].dtype), c.astype(carry[1].dtype)), ys


def _check(dtype: str) -> str | None:
    if dtype == "bfloat16" and not native.unavailable(NAME) and not has_bfloat16():
        return "this CPU's oneDNN has no bfloat16 LSTM (it refused the primitive); use scan or auto"
    return native.unavailable(NAME)


RECURRENCE = Recurrence(
    "onednn", "oneDNN's LSTM primitive, the kernel nn.LSTM runs on the CPU, through XLA's FFI", {"lstm": lstm_layer},
    dtypes=("float32", "bfloat16"), platforms=("cpu",), lengths=False, mesh=False,
    why={"dtype": "it computes float32 or bfloat16 only, not {dtype}; use scan or auto",
         "platform": "it is a CPU kernel, and this backend is {backend}",
         "lengths": "it takes no sequence lengths (--padding right): oneDNN's RNN primitive has none, and PyTorch runs "
                    "packed sequences on its ATen cell instead",
         "mesh": "it runs on one device: XLA cannot split a custom call over a mesh"},
    check=_check, describe=lambda hidden: describe())

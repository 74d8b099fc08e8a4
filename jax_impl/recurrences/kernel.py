"""``kernel``: the LSTM on our own recurrence kernel (:mod:`jax_impl.recurrences.native`'s ``lstm_kernel`` library),
one XLA FFI call per layer and direction of the pass, everything else in XLA.

The kernel projects each layer's input itself (:func:`lstm_layer`): each step's product is ``[x_t, h_{t-1}]``
against ``[W_ih; W_hh]``, both packed once per call, run by its own register tiles (AVX-512 or AVX2, the widest the
CPU has, or the one ``LSTM_KERNEL_ISA`` forces; elsewhere OpenBLAS's sgemm), each tile followed by its gate math,
vectorised, on a team of threads that each own a range of hidden units. It folds the embedding itself too
(:func:`table_layer`, the classifier's layer 0): it projects only the table rows the batch's tokens use, where XLA's
fold projects the whole table, and each step reads its tokens' rows of that projection in place (the bench counts
the smaller work as exec GFLOP). The backward computes each step's ``dh_{t-1}`` and ``dx_t`` in the same tiles, and
the weight gradients as OpenBLAS GEMMs over all steps, split over the team. Forward and backward are one
``jax.custom_vjp`` (:func:`lstm_recurrence`): the forward call keeps the activated gates and the cell states for the
backward one where a gradient is taken. Sequence lengths are the kernel's own: from step ``lengths[b]`` on, row b's
carry stays. Float32 only, on one CPU device. Why it is built so, and what it measured: ``docs/performance.md``.
"""
from __future__ import annotations

import ctypes
import os
from functools import partial

import jax
import jax.numpy as jnp

from common.errors import UnsupportedError
from jax_impl.recurrences import native
from jax_impl.numerics import PRECISION, Array, LayerCarry, LayerWeights
from jax_impl.recurrences.interface import Recurrence

NAME = "lstm_kernel"
TARGETS = native.FFI_HANDLERS[NAME]  # forward, backward
VMAP = "sequential"  # under jax.vmap, one call per element: each call already spreads over every core


ISAS = ("portable", "avx2", "avx512")  # the library's instruction sets, by their number (lstm_isa.h's Isa)
ISA_ENV = "LSTM_KERNEL_ISA"  # where set, the instruction set every call runs, in place of the widest the CPU has
GEMMS = {"portable": "OpenBLAS sgemm", "avx2": "AVX2 tiles", "avx512": "AVX-512 tiles"}


def requested_isa() -> str | None:
    """The instruction set :data:`ISA_ENV` asks for, None where it is unset or empty; an :class:`UnsupportedError` of
    one line where it names none of :data:`ISAS`."""
    value = os.environ.get(ISA_ENV, "")
    if value and value not in ISAS:
        raise UnsupportedError(f"{ISA_ENV} must be one of {', '.join(reversed(ISAS))}, got {value!r}")
    return value or None


def isa_problem(lib: ctypes.CDLL | None = None) -> str | None:
    """Why :data:`ISA_ENV`'s request cannot be met on this CPU (a bad value, or a set the CPU lacks), in one line;
    None where it can, or nothing is requested."""
    try:
        wanted = requested_isa()
    except UnsupportedError as err:
        return str(err)
    if wanted is None:
        return None
    lib = lib or library()
    if not lib.lstm_kernel_supported(ISAS.index(wanted)):
        runs = ", ".join(name for number, name in enumerate(ISAS) if lib.lstm_kernel_supported(number))
        return f"{ISA_ENV}={wanted}: this CPU cannot run it (it runs {runs})"
    return None


def library() -> ctypes.CDLL:
    """The kernel's library (:func:`jax_impl.recurrences.native.load`: checked, its functions typed, its FFI targets
    registered), running the instruction set :data:`ISA_ENV` asks for where it is set: an :class:`UnsupportedError`
    where that cannot be."""
    lib = native.load(NAME)
    problem = isa_problem(lib)
    if problem:
        raise UnsupportedError(problem)
    wanted = requested_isa()
    if wanted is not None:
        lib.lstm_kernel_set_isa(ISAS.index(wanted))
    return lib


try:
    library()  # XLA's FFI targets registered once, at import, as JAX's FFI example does
except UnsupportedError:
    pass  # native.unavailable(NAME) says why wherever the kernel is asked for


def isa() -> str:
    """The instruction set the kernel runs here: ``avx512`` or ``avx2`` (its register tiles and vector gate math), or
    ``portable`` (OpenBLAS's sgemm each step, scalar gate math)."""
    return ISAS[library().lstm_kernel_isa()]


def describe(hidden: int) -> dict:
    """What runs for layers of ``hidden`` units: the instruction set, each step's GEMM, the team's threads, and the
    gate math's functions."""
    lib = library()
    path = ISAS[lib.lstm_kernel_isa()]
    return {"lstm_kernel": "kernel", "kernel_isa": path, "gemm": GEMMS[path],
            "kernel_threads": int(lib.lstm_kernel_threads(hidden)),
            "gate_math": lib.lstm_kernel_exp_tanh(ISAS.index(path)).decode()}


def _forward(source, rows, w_hh, h0, c0, lengths, x, w_ih, table, w_table, train: bool):
    """source (N, 4H), rows (T, B), x (T, B, D) and table (V, E) → (y (T, B, H), h_T, c_T (B, H), activated gates
    (T, B, 4H), c after each step (T, B, H)); the last two are empty (size 0) unless ``train``."""
    (steps, batch), width = rows.shape, source.shape[1]
    hidden = width // 4
    kept = (steps, batch) if train else (0, 0)
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    return jax.ffi.ffi_call(TARGETS[0], (f32(steps, batch, hidden), f32(batch, hidden), f32(batch, hidden),
                                         f32(*kept, width if train else 0), f32(*kept, hidden if train else 0)),
                            vmap_method=VMAP)(
        source, rows, w_hh, h0, c0, lengths, x, w_ih, table, w_table, train=train)


@partial(jax.custom_vjp, nondiff_argnums=(10,))
def lstm_recurrence(source: Array, rows: Array, w_hh: Array, h0: Array, c0: Array, lengths: Array, x: Array,
                    w_ih: Array, table: Array, w_table: Array, gathered: bool) -> tuple[Array, LayerCarry]:
    """One layer's recurrence: step t of row b takes its input gates as ``x[t, b] W_ih^T`` plus row ``rows[t, b]``
    of ``source`` (N, 4H). The source holds the rest: the rows of gates_x (T·B, 4H) in order (``gathered`` False,
    D = 0), the projected embedding table's rows of the tokens (the embedding fold, ``gathered`` True: the kernel
    reads them in place and adds each step's gradient into them, D = 0), or one row, b_ih + b_hh, for every step
    (``gathered`` True, x the layer's input: the kernel projects it inside each step's product). Where ``table`` (V,
    E) has E > 0, the kernel folds the embedding itself: rows are the tokens, source the one bias row, and the input
    gates ``table[rows[t, b]] w_table^T + source[0]``, from the projection of the table rows the tokens use (E = 0:
    table (0, 0), no fold). rows (T, B) int32, w_hh (4H, H), h0 and c0 (B, H), lengths (B,) int32, x (T, B, D),
    w_ih (4H, D), w_table (4H, E) → (outputs (T, B, H), 0 past a row's length; (h_T, c_T) each (B, H)), all float32,
    every product full float32."""
    ys, h, c, _, _ = _forward(source, rows, w_hh, h0, c0, lengths, x, w_ih, table, w_table, train=False)
    return ys, (h, c)


def _lstm_recurrence_forward(source, rows, w_hh, h0, c0, lengths, x, w_ih, table, w_table, gathered):
    ys, h, c, gates, c_after = _forward(source, rows, w_hh, h0, c0, lengths, x, w_ih, table, w_table, train=True)
    # Of the source only its row count is needed: a (N, 0) array carries it without keeping the source alive.
    return (ys, (h, c)), (jnp.zeros((source.shape[0], 0), source.dtype), rows, w_hh, h0, c0, lengths, x, w_ih,
                          table, w_table, ys, gates, c_after)


def _lstm_recurrence_backward(gathered, residuals, cotangents):
    source_rows, rows, w_hh, h0, c0, lengths, x, w_ih, table, w_table, ys, gates, c_after = residuals
    dy, (dh, dc) = cotangents
    like = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
    d_source = jax.ShapeDtypeStruct((source_rows.shape[0], gates.shape[-1]), gates.dtype)
    d_source, dw_hh, dh0, dc0, dx, dw_ih, d_table, dw_table = jax.ffi.ffi_call(
        TARGETS[1], (d_source, like(w_hh), like(h0), like(c0), like(x), like(w_ih), like(table), like(w_table)),
        vmap_method=VMAP)(
        rows, w_hh, h0, ys, gates, c_after, c0, lengths, dy, dh, dc, x, w_ih, table, w_table, gathered=gathered)
    return d_source, None, dw_hh, dh0, dc0, None, dx, dw_ih, d_table, dw_table


lstm_recurrence.defvjp(_lstm_recurrence_forward, _lstm_recurrence_backward)


def _all_steps(lengths: Array | None, rows: Array) -> Array:
    """lengths (B,) int32, every row's T where None."""
    return jnp.full(rows.shape[1], rows.shape[0], jnp.int32) if lengths is None else lengths.astype(jnp.int32)


def _nothing(width: int) -> tuple[Array, Array]:
    """A (0, 0) array and a (width, 0) weight: no input or table for :func:`lstm_recurrence` to project."""
    return jnp.zeros((0, 0), jnp.float32), jnp.zeros((width, 0), jnp.float32)


def gates_layer(gates_x: Array, w_hh: Array, h0: Array, c0: Array, lengths: Array | None = None
                ) -> tuple[Array, LayerCarry]:
    """One layer's recurrence on its input gates, already projected: gates_x (T, B, 4H) (x W_ih^T with both biases),
    w_hh (4H, H), h0 and c0 (B, H), lengths (B,) or None → (outputs (T, B, H), (h_T, c_T))."""
    steps, batch, width = gates_x.shape
    rows = jnp.arange(steps * batch, dtype=jnp.int32).reshape(steps, batch)
    no_table, no_weight = _nothing(width)
    return lstm_recurrence(gates_x.reshape(steps * batch, width), rows, w_hh, h0, c0, _all_steps(lengths, rows),
                           jnp.zeros((steps, batch, 0), jnp.float32), no_weight, no_table, no_weight, False)


def lstm_layer(xs: Array, weights: LayerWeights, carry: LayerCarry, *, dtype=None, precision=PRECISION,
               lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """One LSTM layer (:mod:`.interface`), its input projected inside each step's product; full float32 whatever
    ``precision`` says (the CPU has no TF32)."""
    w_ih, w_hh, b_ih, b_hh = weights
    rows = jnp.zeros(xs.shape[:2], jnp.int32)  # every step's one source row: the bias
    no_table, no_weight = _nothing(w_hh.shape[0])
    ys, final = lstm_recurrence((b_ih + b_hh)[None], rows, w_hh, *carry, _all_steps(lengths, rows), xs, w_ih, no_table,
                                no_weight, True)
    return final, ys


def table_layer(table: Array, tokens: Array, weights: LayerWeights, carry: LayerCarry, *, dtype=None,
                precision=PRECISION, lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """Layer 0 over ``table[tokens]`` with the embedding folded inside the kernel (:mod:`.interface`'s
    ``embedded_layer``): step t of row b takes ``table[tokens[t, b]] W_ih^T + b_ih + b_hh``, from the projection of
    the table rows the tokens use only. table (V, E), tokens (T, B) int → ((h_T, c_T), outputs (T, B, H))."""
    w_ih, w_hh, b_ih, b_hh = weights
    rows = tokens.astype(jnp.int32)
    unprojected, no_weight = jnp.zeros((*rows.shape, 0), jnp.float32), _nothing(w_hh.shape[0])[1]
    ys, final = lstm_recurrence((b_ih + b_hh)[None], rows, w_hh, *carry, _all_steps(lengths, rows), unprojected,
                                no_weight, table, w_ih, True)
    return final, ys


def _check(dtype: str) -> str | None:
    return native.unavailable(NAME) or isa_problem()


RECURRENCE = Recurrence(
    "kernel", "our recurrence kernel through XLA's FFI: register tiles for each step's product and gate math",
    {"lstm": lstm_layer}, dtypes=("float32",), platforms=("cpu",), mesh=False,
    why={"dtype": "it computes float32 only, not {dtype}; use scan or auto",
         "platform": "it is a CPU kernel, and this backend is {backend}",
         "mesh": "it runs on one device: XLA cannot split a custom call over a mesh"},
    check=_check, describe=describe, embedded_layer=table_layer)

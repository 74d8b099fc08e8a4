"""The LSTM stack on our own recurrence kernel (:mod:`jax_impl.recurrences.native`'s ``lstm_kernel`` library): one XLA
FFI call per layer and direction of the pass, everything else in XLA.

The kernel projects each layer's input itself (:func:`input_layer`): each step's product is ``[x_t, h_{t-1}]``
against ``[W_ih; W_hh]``, both packed once per call, run by its own register tiles (AVX-512 or AVX2, the widest the
CPU has, or the one ``LSTM_KERNEL_ISA`` forces; elsewhere OpenBLAS's sgemm), each tile followed by its gate math,
vectorised, on a team of threads that each own a range of hidden units. Measured, this is faster than XLA's one
(T·B, D)·(D, 4H) GEMM before the call: no (T, B, 4H) buffer is written and read back, and the tiles run nearer the
CPU's peak (``benchmarks/PERFORMANCE.md``). The kernel folds the embedding itself too (:func:`table_layer`): it
projects only the table rows the batch's tokens use (640-970 of the seed's 4398), where XLA's fold projects the whole
table, and each step reads its tokens' rows of that projection in place. This is the one place where the kernel
computes less than the XLA tiers: the bench counts it (exec GFLOP). The backward computes each step's ``dh_{t-1}``
and ``dx_t`` in the same tiles, and the weight gradients as OpenBLAS GEMMs over all steps, split over the team.
Forward and backward are one ``jax.custom_vjp``: the forward call keeps the activated gates and the cell states for
the backward one where a gradient is taken. Sequence lengths (``--padding right``) are the kernel's own: from step
``lengths[b]`` on, row b's carry stays. Float32 only: the kernel has no bfloat16 or float64 path. ``--lstm-impl
auto``'s use of it: :mod:`jax_impl.recurrences.choice`.
"""
from __future__ import annotations

import ctypes
import os
from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp

from common.errors import UnsupportedError
from jax_impl.recurrences import native
from jax_impl.numerics import PRECISION, Array, LayerCarry, LayerWeights
from jax_impl.recurrences.stacks import Carry

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
    """The kernel's library (:func:`jax_impl.recurrences.native.load`), running the instruction set :data:`ISA_ENV`
    asks for where it is set: an :class:`UnsupportedError` where that cannot be."""
    lib = native.load(NAME)
    for f in (lib.lstm_kernel_isa, lib.lstm_kernel_supported, lib.lstm_kernel_set_isa, lib.lstm_kernel_threads,
              lib.lstm_kernel_activation):
        f.restype = ctypes.c_int64
    lib.lstm_kernel_supported.argtypes = lib.lstm_kernel_set_isa.argtypes = [ctypes.c_int64]
    lib.lstm_kernel_threads.argtypes = lib.lstm_kernel_exp_tanh.argtypes = [ctypes.c_int64]
    lib.lstm_kernel_exp_tanh.restype = ctypes.c_char_p
    lib.lstm_kernel_activation.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.c_int64]
    lib.lstm_kernel_tile_gflops.restype = lib.lstm_kernel_team_flush_fraction.restype = ctypes.c_double
    lib.lstm_kernel_tile_gflops.argtypes = [ctypes.c_int64] * 4
    lib.lstm_kernel_team_flush_fraction.argtypes = [ctypes.c_int64]
    problem = isa_problem(lib)
    if problem:
        raise UnsupportedError(problem)
    wanted = requested_isa()
    if wanted is not None:
        lib.lstm_kernel_set_isa(ISAS.index(wanted))
    return lib


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
    library()  # registers the targets before XLA looks them up
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


def input_layer(x: Array, w_ih: Array, bias: Array, w_hh: Array, h0: Array, c0: Array, lengths: Array | None = None
                ) -> tuple[Array, LayerCarry]:
    """One layer with its input projected inside each step's product: x (T, B, D), w_ih (4H, D), bias b_ih + b_hh
    (4H,), w_hh (4H, H), h0 and c0 (B, H), lengths (B,) or None → (outputs (T, B, H), (h_T, c_T))."""
    rows = jnp.zeros(x.shape[:2], jnp.int32)  # every step's one source row: the bias
    no_table, no_weight = _nothing(w_hh.shape[0])
    return lstm_recurrence(bias[None], rows, w_hh, h0, c0, _all_steps(lengths, rows), x, w_ih, no_table, no_weight,
                           True)


def table_layer(table: Array, tokens: Array, w_ih: Array, bias: Array, w_hh: Array, h0: Array, c0: Array,
                lengths: Array | None = None) -> tuple[Array, LayerCarry]:
    """Layer 0 with the embedding folded inside the kernel: step t of row b takes ``table[tokens[t, b]] W_ih^T +
    bias``, from the projection of the table rows the tokens use only. table (V, E), tokens (T, B) int, w_ih (4H,
    E), bias (4H,), w_hh (4H, H), h0 and c0 (B, H), lengths (B,) or None → (outputs (T, B, H), (h_T, c_T))."""
    rows = tokens.astype(jnp.int32)
    unprojected, no_weight = jnp.zeros((*rows.shape, 0), jnp.float32), _nothing(w_hh.shape[0])[1]
    return lstm_recurrence(bias[None], rows, w_hh, h0, c0, _all_steps(lengths, rows), unprojected, no_weight, table,
                           w_ih, True)


def sequence_layer(xs: Array, layer_weights: LayerWeights, layer_carry: LayerCarry, *, dtype=None,
                   precision=PRECISION, lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """One LSTM layer over a sequence on the kernel, every step's output returned (the language model's interface,
    :data:`jax_impl.recurrences.layers.LAYERS`): xs (T, B, D), (h, c) each (B, H) → ((h_T, c_T), outputs (T, B, H)),
    the input projected inside each step's product. Float32; the kernel computes in full float32 whatever
    ``precision`` says (the CPU has no TF32)."""
    w_ih, w_hh, b_ih, b_hh = layer_weights
    ys, final = input_layer(xs, w_ih, b_ih + b_hh, w_hh, *layer_carry, lengths)
    return final, ys


def kernel_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry, lengths: Array | None,
                 masks: Sequence[Array] | None, *, embed_fold: bool = True, precision=PRECISION) -> Carry:
    """``nn.LSTM`` layer by layer, each layer one kernel call that projects its own input → each layer's final
    (h, c), each (B, H). table (V, E); tokens (T, B) int32; ``lengths`` (B,) or None; ``masks``: None or L-1
    (T, B, H) multipliers of the inputs of layers 1..L-1 (constants: no gradient reaches them); ``embed_fold``: with
    V < T·B, layer 0 folds the embedding (:func:`table_layer`), as the fused stack does. Full float32 whatever
    ``precision`` says."""
    del precision
    if masks is not None:
        if len(masks) != len(weights) - 1:
            raise ValueError(f"need {len(weights) - 1} dropout masks, got {len(masks)}")
        masks = [jax.lax.stop_gradient(m) for m in masks]
    finals = []
    for k, ((w_ih, w_hh, b_ih, b_hh), (h0, c0)) in enumerate(zip(weights, carry)):
        if k == 0 and embed_fold and table.shape[0] < tokens.size:
            ys, final = table_layer(table, tokens, w_ih, b_ih + b_hh, w_hh, h0, c0, lengths)
        else:
            if k == 0:
                x = jnp.take(table, tokens, axis=0)
            else:  # the previous layer's outputs, dropped out
                x = ys if masks is None else ys * masks[k - 1].astype(ys.dtype)
            ys, final = input_layer(x, w_ih, b_ih + b_hh, w_hh, h0, c0, lengths)
        finals.append(final)
    return tuple(finals)

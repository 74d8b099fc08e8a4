"""The LSTM stack on our own recurrence kernel (:mod:`jax_impl.recurrences.native`'s ``lstm_kernel`` library): one XLA
FFI call per layer and direction of the pass, everything else in XLA.

The kernel projects each layer's input itself (:func:`jax_impl.recurrences.fused.embedding_lstm_stack` hands it over as
a :class:`~jax_impl.recurrences.fused.LayerInput`): each step's product is ``[x_t, h_{t-1}]`` against ``[W_ih; W_hh]``,
both packed once per call, run by its own register tiles on AVX-512 (elsewhere by MKL's packed GEMM), each tile followed
by its gate math, vectorised, on a team of threads that each own a range of hidden units. Measured, this is faster than
XLA's one (T·B, D)·(D, 4H) GEMM before the call: no (T, B, 4H) buffer is written and read back, and the tiles run
nearer the CPU's peak (``benchmarks/PERFORMANCE.md``). The kernel folds the embedding itself too (a
:class:`~jax_impl.recurrences.fused.TableInput`): it projects only the table rows the batch's tokens use (640-970 of the
seed's 4398), where XLA's fold projects the whole table, and each step reads its tokens' rows of that projection in
place. This is the one place where the kernel computes less than the XLA tiers: the bench counts it (exec GFLOP).
The backward computes each step's ``dh_{t-1}`` and ``dx_t`` in the same tiles, and the weight
gradients as MKL GEMMs over all steps. Forward and backward are one ``jax.custom_vjp``: the forward call keeps the
activated gates and the cell states for the backward one where a gradient is taken. Sequence lengths
(``--padding right``) are the kernel's own: from step ``lengths[b]`` on, row b's carry stays. Float32 only: the kernel
has no bfloat16 or float64 path. ``--lstm-impl auto`` runs it in float32 on one CPU device with AVX-512
(:mod:`jax_impl.recurrences.choice`).
"""
from __future__ import annotations

import ctypes
from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp

from jax_impl.recurrences import fused, native
from jax_impl.numerics import PRECISION, Array, LayerCarry, LayerWeights
from jax_impl.recurrences.stacks import Carry

NAME = "lstm_kernel"
TARGETS = native.FFI_HANDLERS[NAME]  # forward, backward
VMAP = "sequential"  # under jax.vmap, one call per element: each call already spreads over every core


def vectorised() -> bool:
    """Whether the library runs its AVX-512 tiles on this CPU (elsewhere its portable path)."""
    return bool(library().lstm_kernel_vectorised())


def library() -> ctypes.CDLL:
    lib = native.load(NAME)
    lib.lstm_kernel_threads.restype = lib.lstm_kernel_vectorised.restype = ctypes.c_int64
    lib.lstm_kernel_threads.argtypes = [ctypes.c_int64]
    lib.lstm_kernel_tile_gflops.restype = lib.lstm_kernel_team_flush_fraction.restype = ctypes.c_double
    lib.lstm_kernel_tile_gflops.argtypes = [ctypes.c_int64] * 3
    lib.lstm_kernel_team_flush_fraction.argtypes = [ctypes.c_int64]
    return lib


def describe(hidden: int) -> dict:
    """What runs for layers of ``hidden`` units: each step's GEMM, the team's threads, and the gate math's functions."""
    lib = library()
    vectorised = bool(lib.lstm_kernel_vectorised())
    return {"lstm_kernel": "kernel", "gemm": "AVX-512 tiles" if vectorised else "MKL packed",
            "kernel_threads": int(lib.lstm_kernel_threads(hidden)),
            "gate_math": "AVX-512, SLEEF's exp (1 ulp) and tanh (3.5 ulp)" if vectorised
            else "scalar, the C library's exp and tanh"}


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


def kernel_recurrence(source, w_hh: Array, h0: Array, c0: Array, lengths: Array | None, precision):
    """:func:`lstm_recurrence` as :func:`jax_impl.recurrences.fused.embedding_lstm_stack` calls a layer's recurrence:
    ``source`` the layer's input unprojected (a :class:`~jax_impl.recurrences.fused.LayerInput`: the kernel projects
    it), the embedding fold's (a :class:`~jax_impl.recurrences.fused.TableInput`: the kernel projects the table rows the
    tokens use), or the input projection: (table_gates (V, 4H), tokens (T, B)) or (T, B, 4H). The kernel computes in
    full float32 whatever ``precision`` says (the CPU has no TF32)."""
    del precision
    width = w_hh.shape[0]
    # Nothing to project: x (T, B, 0) with W_ih (4H, 0); no table to fold: (0, 0) with w_table (4H, 0).
    unprojected = lambda rows: jnp.zeros((*rows.shape, 0), jnp.float32)  # noqa: E731
    no_weight, no_table = jnp.zeros((width, 0), jnp.float32), jnp.zeros((0, 0), jnp.float32)
    if isinstance(source, fused.LayerInput):
        rows = jnp.zeros(source.x.shape[:2], jnp.int32)
        args = (source.bias[None], rows, source.x, source.w_ih, no_table, no_weight, True)
    elif isinstance(source, fused.TableInput):
        rows = source.tokens.astype(jnp.int32)
        args = (source.bias[None], rows, unprojected(rows), no_weight, source.table, source.w_ih, True)
    elif isinstance(source, tuple):
        gate_rows, tokens = source
        rows = tokens.astype(jnp.int32)
        args = (gate_rows, rows, unprojected(rows), no_weight, no_table, no_weight, True)
    else:
        steps, batch, _ = source.shape
        rows = jnp.arange(steps * batch, dtype=jnp.int32).reshape(steps, batch)
        args = (source.reshape(steps * batch, width), rows, unprojected(rows), no_weight, no_table, no_weight, False)
    gate_rows, rows, x, w_ih, table, w_table, gathered = args
    if lengths is None:
        lengths = jnp.full(rows.shape[1], rows.shape[0], jnp.int32)
    return lstm_recurrence(gate_rows, rows, w_hh, h0, c0, lengths.astype(jnp.int32), x, w_ih, table, w_table,
                           gathered)


def sequence_layer(xs: Array, layer_weights: LayerWeights, layer_carry: LayerCarry, *, dtype=None,
                   precision=PRECISION, lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """One LSTM layer over a sequence on the kernel, every step's output returned (the language model's interface,
    :data:`jax_impl.recurrences.layers.LAYERS`): xs (T, B, D), (h, c) each (B, H) → ((h_T, c_T), outputs (T, B, H)),
    the input projected inside each step's product. Float32."""
    w_ih, w_hh, b_ih, b_hh = layer_weights
    ys, final = kernel_recurrence(fused.LayerInput(xs, w_ih, b_ih + b_hh), w_hh, *layer_carry, lengths, precision)
    return final, ys


def kernel_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry, lengths: Array | None,
                 masks: Sequence[Array] | None, *, embed_fold: bool = True, precision=PRECISION) -> Carry:
    """``nn.LSTM`` layer by layer with each recurrence on the kernel → each layer's final (h, c), each (B, H). table
    (V, E); tokens (T, B) int32; ``lengths`` (B,) or None; ``masks``: None or L-1 (T, B, H) multipliers of the inputs
    of layers 1..L-1; ``embed_fold``: layer 0's projection from the projected table, as in the fused stack."""
    return fused.embedding_lstm_stack(table, tokens, weights, carry, lengths, masks, wavefront=False,
                                           embed_fold=embed_fold, precision=precision,
                                           layer_recurrence=kernel_recurrence, recurrence_projects=True)

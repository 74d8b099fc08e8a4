"""Our recurrence kernel (``--lstm-impl kernel``): through XLA's FFI it computes what the project's reference, Flax
``nn.RNN`` over PyTorch's cell, computes, values and gradients, with and without sequence lengths; from given input
gates, from a layer's input it projects itself, and from the embedding table it folds itself; on any split of the
hidden units and of the inputs over its threads, on each of its instruction sets (AVX-512, AVX2, portable: each
forced in turn, where the CPU runs it); deterministically; flushing denormals on every thread as XLA does; its exp
and tanh within their stated ulps; and what it cannot compute is refused in one line. Skipped, saying why, where the
native library was not built."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.errors import UnsupportedError
from jax_impl.recurrences import fused, kernel, native
from jax_impl.recurrences.choice import Run, auto, resolve
from jax_impl.numerics import dot
from jax_impl.tests.native_site import fake_site, skip
from jax_impl.tests.test_fused import (LENGTHS, _assert_close, _embedding_args, _stack_loss,
                                       assert_stack_matches_reference, reference_stack, stack_of)

needs_library = pytest.mark.skipif(native.unavailable(kernel.NAME) is not None,
                                   reason=str(native.unavailable(kernel.NAME)))


def needs_probe(symbol: str):
    """Skips, saying why, where the library lacks the test probe ``symbol`` (a build without LSTM_TWINS_TEST_PROBES)."""
    reason = native.missing_probe(kernel.NAME, symbol)
    return pytest.mark.skipif(reason is not None, reason=str(reason))
# The kernel's GEMM and libmvec's functions against XLA's: the same float32 function rounded differently, a few ulps
# of each array's scale (as the fused stack against the reference, test_fused).
REL_TOL = 2e-5
HIGHEST = jax.lax.Precision.HIGHEST


@pytest.fixture(params=kernel.ISAS)
def isa(request):
    """The test runs once per instruction set of the library, each forced in turn as LSTM_KERNEL_ISA forces it;
    skipped, saying so, where the CPU cannot run it."""
    lib = kernel.library()
    number = kernel.ISAS.index(request.param)
    if not lib.lstm_kernel_supported(number):
        pytest.skip(f"this CPU cannot run the kernel's {request.param} path")
    previous = lib.lstm_kernel_set_isa(number)
    yield request.param
    lib.lstm_kernel_set_isa(previous)


@needs_library
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_final_carries_and_gradients_equal_jax_grad_of_the_reference(layers, with_lengths, isa):
    assert_stack_matches_reference(stack_of("kernel"), layers, jnp.asarray(LENGTHS) if with_lengths else None,
                                   REL_TOL)


@needs_library
@pytest.mark.parametrize("vocab", [6, 40], ids=["projected-table", "projected-rows"])  # V < T·B = 21, V > T·B
def test_on_the_embedding_folds_path_gathered_rows_and_their_added_gradients_equal_the_reference(vocab, isa):
    # 6 rows: the kernel reads layer 0's gates from the projected table and adds repeated tokens' gradients into it.
    table, tokens, weights, carries, masks = _embedding_args(6, vocab)
    lengths = jnp.asarray(LENGTHS)
    got, expected = (jax.jit(jax.value_and_grad(_stack_loss(stack, 6, jnp.float32, tokens, lengths, masks, 2),
                                                (0, 1, 2), has_aux=True))(table, weights, carries)
                     for stack in (stack_of("kernel"), reference_stack))
    _assert_close(got, expected, REL_TOL)


def _recurrence_args(hidden: int, steps: int = 9, batch: int = 5, scale: float = 1.0):
    """gates_x (T, B, 4H), w_hh (4H, H), h0, c0 (B, H) of a layer, lengths (B,) with a full, an empty and a middle
    row, and a fixed cotangent of each output."""
    rng = np.random.default_rng(hidden)
    f32 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    args = (f32(steps, batch, 4 * hidden), scale * f32(4 * hidden, hidden) / np.sqrt(hidden), f32(batch, hidden),
            f32(batch, hidden))
    lengths = jnp.asarray([steps, 0, 4, steps, 1][:batch], jnp.int32)
    return args, lengths, (f32(steps, batch, hidden), f32(batch, hidden), f32(batch, hidden))


def kernel_layer(gates_x, w_hh, h0, c0, lengths):
    """The kernel on gates_x (T, B, 4H) as the layer-by-layer path calls it."""
    return kernel.gates_layer(gates_x, w_hh, h0, c0, lengths)


def _outputs_and_gradients(layer, args, cotangents):
    """A layer's (outputs, (h_T, c_T)) and the gradients of Σ cotangent · output by each of its float arguments."""
    def loss(*a):
        ys, (h, c) = layer(*a)
        return sum(jnp.sum(w * v) for w, v in zip(cotangents, (ys, h, c))), (ys, h, c)
    (_, outputs), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args))), has_aux=True))(*args)
    return outputs, grads


@needs_library
@pytest.mark.parametrize("hidden", [1, 16, 40, 70])
def test_every_split_of_the_units_over_the_threads_computes_the_xla_recurrence(hidden, isa):
    # 40 units: blocks of 16, 16 and 8 over two threads; 70: a last block of 6 units; 1: one thread, one unit.
    args, lengths, cotangents = _recurrence_args(hidden)
    got = _outputs_and_gradients(lambda *a: kernel_layer(*a, lengths), args, cotangents)
    want = _outputs_and_gradients(lambda *a: fused.xla_recurrence(*a, lengths, HIGHEST), args, cotangents)
    _assert_close(got, want, REL_TOL)


def _projected_args(hidden: int, inputs: int):
    """A layer's input x (T, B, D) and (w_ih (4H, D), bias (4H,)) in place of gates_x in :func:`_recurrence_args`."""
    args, lengths, cotangents = _recurrence_args(hidden)
    rng = np.random.default_rng(inputs)
    steps, batch, _ = args[0].shape
    x = jnp.asarray(rng.standard_normal((steps, batch, inputs)), jnp.float32)
    w_ih = jnp.asarray(rng.standard_normal((4 * hidden, inputs)) / np.sqrt(inputs), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(4 * hidden), jnp.float32)
    return (x, w_ih, bias, *args[1:]), lengths, cotangents


def _projected_layers(lengths):
    """The kernel projecting x itself, and XLA's projection followed by XLA's recurrence, on (x, w_ih, bias, w_hh, h0,
    c0)."""
    def in_kernel(x, w_ih, bias, w_hh, h0, c0):
        final, ys = kernel.lstm_layer(x, (w_ih, w_hh, bias, jnp.zeros_like(bias)), (h0, c0), lengths=lengths)
        return ys, final

    def in_xla(x, w_ih, bias, w_hh, h0, c0):
        gates_x = fused._project(x, w_ih, bias, jnp.zeros_like(bias), HIGHEST)
        return fused.xla_recurrence(gates_x, w_hh, h0, c0, lengths, HIGHEST)
    return in_kernel, in_xla


@needs_library
@pytest.mark.parametrize("hidden,inputs", [(16, 1), (40, 40), (70, 23), (16, 150)])
def test_a_layer_input_projected_inside_the_kernel_computes_xlas_projection_then_recurrence(hidden, inputs, isa):
    # Gradients of x, w_ih and the bias too; 150 inputs: several panels of columns of dx dealt over two threads,
    # 23: one short panel; 1: one thread, one lane.
    args, lengths, cotangents = _projected_args(hidden, inputs)
    in_kernel, in_xla = _projected_layers(lengths)
    _assert_close(_outputs_and_gradients(in_kernel, args, cotangents),
                  _outputs_and_gradients(in_xla, args, cotangents), REL_TOL)


def _table_args(hidden: int, embed: int, vocab: int):
    """An embedding table (V, E), tokens (T, B) that use only some of its rows (the first and the last among them),
    and (w_ih (4H, E), bias (4H,)) in place of gates_x in :func:`_recurrence_args`."""
    args, lengths, cotangents = _recurrence_args(hidden)
    rng = np.random.default_rng(vocab)
    steps, batch, _ = args[0].shape
    used = np.array([0, 3, 4, vocab - 1])
    tokens = jnp.asarray(used[rng.integers(0, len(used), (steps, batch))], jnp.int32)
    table = jnp.asarray(rng.standard_normal((vocab, embed)), jnp.float32)
    w_ih = jnp.asarray(rng.standard_normal((4 * hidden, embed)) / np.sqrt(embed), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(4 * hidden), jnp.float32)
    return (table, w_ih, bias, *args[1:]), tokens, lengths, cotangents


def _table_layers(tokens, lengths):
    """The kernel folding the embedding itself (the used rows projected), and XLA's fold (the whole table projected,
    its rows gathered by the tokens) followed by XLA's recurrence, on (table, w_ih, bias, w_hh, h0, c0)."""
    def in_kernel(table, w_ih, bias, w_hh, h0, c0):
        final, ys = kernel.table_layer(table, tokens, (w_ih, w_hh, bias, jnp.zeros_like(bias)), (h0, c0),
                                       lengths=lengths)
        return ys, final

    def in_xla(table, w_ih, bias, w_hh, h0, c0):
        table_gates = dot(table, w_ih.T, HIGHEST) + bias
        return fused.xla_recurrence(jnp.take(table_gates, tokens, axis=0), w_hh, h0, c0, lengths, HIGHEST)
    return in_kernel, in_xla


@needs_library
@pytest.mark.parametrize("hidden,embed", [(16, 1), (40, 23), (70, 150)])
def test_the_embedding_folded_inside_the_kernel_computes_xlas_fold_then_recurrence(hidden, embed, isa):
    # The tokens use 4 of 11 rows: the gradient of the table is 0 in the 7 others, and that of w_ih and the bias sums
    # the used rows' only.
    args, tokens, lengths, cotangents = _table_args(hidden, embed, 11)
    in_kernel, in_xla = _table_layers(tokens, lengths)
    got = _outputs_and_gradients(in_kernel, args, cotangents)
    _assert_close(got, _outputs_and_gradients(in_xla, args, cotangents), REL_TOL)
    d_table = np.asarray(got[1][0])
    assert np.all(d_table[[1, 2, 5, 6, 7, 8, 9]] == 0) and np.all(np.abs(d_table[[0, 3, 4, 10]]).sum(axis=1) > 0)


@needs_library
def test_under_vmap_each_element_gets_what_its_own_call_computes():
    # A batch of initial carries (the dropout-expectation test vmaps the model over keys the same way): values and
    # gradients, element by element, bit for bit.
    args, lengths, cotangents = _recurrence_args(16)
    h0s = jnp.stack([args[2], -args[2], 2 * args[2]])

    def loss(h0):
        ys, (h, c) = kernel_layer(args[0], args[1], h0, args[3], lengths)
        return jnp.sum(ys * cotangents[0]) + jnp.sum(h * cotangents[1]) + jnp.sum(c * cotangents[2])
    got = jax.jit(jax.vmap(jax.value_and_grad(loss)))(h0s)
    for k, h0 in enumerate(h0s):
        value, grad = jax.jit(jax.value_and_grad(loss))(h0)
        assert float(got[0][k]) == float(value) and np.array_equal(got[1][k], grad)


@needs_library
@pytest.mark.parametrize("projected", ["no", "input", "table"], ids=["input-gates", "projected-input", "folded-table"])
def test_each_vector_path_computes_what_the_portable_one_does(projected, isa):
    # The portable path: OpenBLAS's GEMM and the C library's exp and tanh; the vector paths: the tiles and libmvec's.
    if projected == "input":
        args, lengths, cotangents = _projected_args(40, 70)
        layer = _projected_layers(lengths)[0]
    elif projected == "table":
        args, tokens, lengths, cotangents = _table_args(40, 70, 11)
        layer = _table_layers(tokens, lengths)[0]
    else:
        args, lengths, cotangents = _recurrence_args(40)
        layer = lambda *a: kernel_layer(*a, lengths)  # noqa: E731
    if isa == "portable":
        pytest.skip("the portable path is the reference here")
    assert kernel.describe(40)["kernel_isa"] == isa
    vectorised = _outputs_and_gradients(layer, args, cotangents)
    previous = kernel.library().lstm_kernel_set_isa(kernel.ISAS.index("portable"))
    try:
        assert kernel.describe(40)["gate_math"] == "the C library's expf and tanhf, scalar"
        portable = _outputs_and_gradients(jax.jit(layer), args, cotangents)
    finally:
        kernel.library().lstm_kernel_set_isa(previous)
    _assert_close(portable, vectorised, 1e-6)


@needs_probe("lstm_kernel_activation")
@pytest.mark.parametrize("function,reference,ulps", [(0, np.exp, 3), (1, np.tanh, 2)], ids=["exp", "tanh"])
def test_the_gate_maths_exp_and_tanh_are_within_their_stated_ulps(function, reference, ulps, isa):
    # Every float32 in [-20, 20] 4e-4 apart and around 0, against the float64 function: libmvec's expf measured 2.5
    # ulps at most and its tanhf 1.0; the C library's 0.5 and 1.9.
    x = np.concatenate([np.linspace(-20, 20, 100_001), np.geomspace(1e-30, 1, 2001), -np.geomspace(1e-30, 1, 2001)])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    assert kernel.library().lstm_kernel_activation(kernel.ISAS.index(isa), function, x.ctypes.data,
                                                   out.ctypes.data, x.size) == 0
    exact = reference(x.astype(np.float64))
    # A float32 ulp of each exact value, in float64 (np.spacing in float32 would be flushed to 0 near 0 wherever an
    # earlier test left the CPU flushing denormals).
    ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(exact), np.finfo(np.float32).tiny))) - 23)
    assert float(np.max(np.abs(out - exact) / ulp)) <= ulps


@needs_library
def test_the_library_links_no_pytorch_and_says_which_instruction_set_it_runs():
    ldd = subprocess.run(["ldd", str(native.library_path(kernel.NAME))], capture_output=True, text=True).stdout
    linked = {line.split()[0] for line in ldd.splitlines() if line.strip()}  # the names, not the folders found in
    assert not any(name.startswith(("libtorch", "libc10")) for name in linked)
    assert {"libscipy_openblas.so", "libmvec.so.1"} <= linked
    described = kernel.describe(256)
    assert described["kernel_isa"] in kernel.ISAS and described["gemm"] == kernel.GEMMS[described["kernel_isa"]]


@needs_library
@pytest.mark.parametrize("value,expected", [
    ("portable", "portable OpenBLAS sgemm"),
    ("neon", "LSTM_KERNEL_ISA must be one of avx512, avx2, portable, got 'neon'"),
])
def test_lstm_kernel_isa_forces_a_path_or_is_refused_in_one_line(value, expected):
    code = ("from common.errors import UnsupportedError\n"
            "from jax_impl.recurrences import kernel\n"
            "try:\n    d = kernel.describe(64); print(d['kernel_isa'], d['gemm'])\n"
            "except UnsupportedError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, kernel.ISA_ENV: value})
    assert out.stdout.strip() == expected, out.stderr


@needs_library
def test_the_same_inputs_give_bit_identical_results():
    args, lengths, cotangents = _recurrence_args(70)
    layer = lambda *a: kernel_layer(*a, lengths)  # noqa: E731
    first, second = (jax.tree_util.tree_leaves(jax.device_get(_outputs_and_gradients(layer, args, cotangents)))
                     for _ in range(2))
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


@needs_library
def test_every_thread_flushes_denormals_as_xla_does():
    # W_hh of denormals (1e-39): XLA treats them as zero, so no gradient reaches h0 through them; a thread that kept
    # them would give dh0 = dz · W_hh of about 1e-40 instead of exact zeros.
    args, lengths, cotangents = _recurrence_args(70)
    args = (args[0], jnp.full_like(args[1], 1e-39), *args[2:])
    full = jnp.full_like(lengths, args[0].shape[0])
    _, (_, _, dh0, _) = _outputs_and_gradients(lambda *a: kernel_layer(*a, full), args,
                                               cotangents)
    _, (_, _, dh0_xla, _) = _outputs_and_gradients(lambda *a: fused.xla_recurrence(*a, None, HIGHEST), args,
                                                   cotangents)
    assert np.count_nonzero(dh0_xla) == np.count_nonzero(dh0) == 0


@needs_probe("lstm_kernel_team_flush_fraction")
def test_every_thread_of_the_team_takes_the_callers_float_rules_however_it_was_started():
    # Threads OpenMP started for a caller that kept denormals still flush when the caller flushes.
    assert kernel.library().lstm_kernel_team_flush_fraction(256) == 1.0


@needs_library
def test_the_team_has_as_many_threads_as_openmp_offers_and_no_more_than_unit_blocks():
    code = ("from jax_impl.recurrences import kernel\n"
            "print(kernel.describe(256)['kernel_threads'], kernel.describe(16)['kernel_threads'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "3"}).stdout.split()
    assert out == ["3", "1"]


@pytest.mark.parametrize("dtype,platform,refusal", [
    ("float64", "cpu", r"^--lstm-impl kernel: it computes float32 only, not float64; use scan or auto$"),
    ("bfloat16", "cpu", r"^--lstm-impl kernel: it computes float32 only, not bfloat16; use scan or auto$"),
    ("float32", "gpu", r"^--lstm-impl kernel: it is a CPU kernel, and this backend is gpu$"),
])
def test_what_the_kernel_cannot_compute_is_refused_in_one_line(dtype, platform, refusal):
    with pytest.raises(UnsupportedError, match=refusal):
        resolve("kernel", Run(dtype=dtype, platform=platform))


@needs_library
def test_auto_runs_the_kernel_on_its_vector_tiles_and_xlas_recurrence_on_its_portable_path(isa):
    if isa == "portable":  # as on a CPU without AVX2
        assert auto(Run(platform="cpu")) == ("fused", "XLA's fused recurrence, not our kernel: it runs its portable "
                                                      "path here (no AVX2 tiles), measured slower than XLA's "
                                                      "(docs/performance.md)")
    else:
        assert auto(Run(platform="cpu")) == (
            "kernel", f"our kernel: float32 on one CPU device, with its {'AVX-512' if isa == 'avx512' else 'AVX2'} "
                      "tiles")


def test_auto_passes_over_a_kernel_that_was_not_built_saying_why(tmp_path, monkeypatch):
    skip(fake_site(tmp_path, monkeypatch), kernel.NAME, "no g++ on PATH")
    assert auto(Run(platform="cpu")) == (
        "fused", "XLA's fused recurrence, not our kernel: the native lstm_kernel library is not available: no g++ on "
                 "PATH")


def test_a_kernel_that_was_not_built_is_refused_with_the_builds_reason(tmp_path, monkeypatch):
    skip(fake_site(tmp_path, monkeypatch), kernel.NAME, "no g++ on PATH")
    with pytest.raises(UnsupportedError, match=r"^--lstm-impl kernel: the native lstm_kernel library is not "
                                               r"available: no g\+\+ on PATH$"):
        resolve("kernel", Run(platform="cpu"))

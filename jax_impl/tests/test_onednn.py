"""The oneDNN stack (``--lstm-impl onednn``): oneDNN's LSTM primitive through XLA's FFI computes what the project's
reference, Flax ``nn.RNN`` over PyTorch's cell, computes, values and gradients; it hands ATen XLA's own buffers, so
nothing is copied; every thread it computes on flushes denormals; and what it cannot compute is refused in one line.
Skipped, saying why, where the native library was not built."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.errors import UnsupportedError
from jax_impl.recurrences import native, onednn
from jax_impl.recurrences.choice import Run, resolve
from jax_impl.tests.native_site import fake_site, skip
from jax_impl.tests.test_model import refusal
from jax_impl.tests.test_fused import (B, H, T, _assert_close, _stack_args, _stack_loss,
                                       assert_stack_matches_reference, reference_stack, stack_of)

needs_library = pytest.mark.skipif(native.unavailable("onednn_lstm") is not None,
                                   reason=str(native.unavailable("onednn_lstm")))
# oneDNN's fused gates and packed GEMMs against XLA's: the same float32 function rounded differently, a few ulps
# of each array's scale (as the fused stack against the reference, test_fused).
REL_TOL = 2e-5


@needs_library
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_final_carries_and_gradients_equal_jax_grad_of_the_reference(layers):
    assert_stack_matches_reference(stack_of("onednn"), layers, None, REL_TOL)


@pytest.mark.skipif(refusal("onednn", "bfloat16") is not None, reason=str(refusal("onednn", "bfloat16")))
def test_in_bfloat16_a_float32_carry_holds_bfloat16_values_within_bfloat16s_reach_of_float32():
    table, tokens, weights, carries, masks = _stack_args(0, jnp.float32, 2)
    stack = stack_of("onednn", dtype=jnp.bfloat16)
    loss = _stack_loss(stack, 0, jnp.float32, tokens, None, masks, 2)
    reference = _stack_loss(reference_stack, 0, jnp.float32, tokens, None, masks, 2)
    (_, finals), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(table, weights, carries)
    (_, finals_r), grads_r = jax.value_and_grad(reference, argnums=(0, 1, 2), has_aux=True)(table, weights, carries)
    for v in jax.tree_util.tree_leaves(finals):  # as autocast's oneDNN returns h_n and c_n: bfloat16 values
        assert v.dtype == jnp.float32 and np.array_equal(v, v.astype(jnp.bfloat16).astype(jnp.float32))
    # The gradients come back through the casts in float32. Measured against float32: 1.0e-2 of each array's scale
    # at most (bfloat16 keeps 8 bits: 2^-8 = 3.9e-3 per rounding, over 2 layers and 7 steps).
    _assert_close(finals, finals_r, 3e-2)
    _assert_close(grads, grads_r, 3e-2)


@needs_library
def test_bfloat16_is_refused_in_one_line_where_this_cpus_oneDNN_has_none():
    # oneDNN limited to AVX2 has no bfloat16 LSTM (as on a CPU without AVX-512 BF16); float32 still resolves.
    code = ("from jax_impl.recurrences.choice import Run, resolve\n"
            "from common.errors import UnsupportedError\n"
            "print(resolve('onednn', Run(platform='cpu')))\n"
            "try:\n    resolve('onednn', Run(dtype='bfloat16', platform='cpu'))\n"
            "except UnsupportedError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}).stdout.splitlines()
    assert out == ["onednn", "--lstm-impl onednn: this CPU's oneDNN has no bfloat16 LSTM (it refused the primitive); "
                             "use scan or auto"]


@needs_library
def test_calls_from_several_threads_at_once_each_get_their_own_result():
    # Every ATen call is queued to the library's one ATen thread; callers from other threads wait for their own.
    inputs = [_stack_args(seed, jnp.float32, 2) for seed in range(4)]
    run = jax.jit(lambda args: stack_of("onednn")(*args[:4], None, args[4]))
    alone = [jax.device_get(run(args)) for args in inputs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda args: jax.device_get(run(args)), inputs))
    for a, b in zip(alone, together):
        assert all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@needs_library
def test_oneDNN_computes_on_as_many_threads_as_torch_is_set_to():
    # The library's ATen thread takes torch's intra-op count before each call (OpenMP keeps one count per thread).
    import torch
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert onednn.library().onednn_lstm_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert onednn.library().onednn_lstm_threads() == before


@needs_library
def test_the_workspace_is_the_size_oneDNN_asks_for_at_these_shapes():
    # oneDNN's training workspace: gates and states of every step, at least 4 gates and (h, c) per (t, b, unit).
    size = onednn.workspace_bytes(T, B, 5, H)
    assert size >= 4 * T * B * 6 * H and size == onednn.workspace_bytes(T, B, 5, H)


@needs_library
def test_every_thread_it_computes_on_flushes_denormals_and_the_version_is_torchs():
    described = onednn.describe()
    assert described["flush_denormal"] is True and described["lstm_kernel"] == "onednn"
    assert described["onednn_threads"] >= 1
    # The version comes from the oneDNN header torch ships; torch 2.2 ships only a stub that names a missing one.
    torch_dir = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
    if (torch_dir / "include" / "oneapi" / "dnnl" / "dnnl_version.h").is_file():
        assert described["onednn"].count(".") == 2
    else:
        assert described["onednn"] is None


@pytest.mark.parametrize("dtype,padding,platform,refusal", [
    ("float64", "left", "cpu", r"^--lstm-impl onednn: it computes float32 or bfloat16 only, not float64; use scan "
                               r"or auto$"),
    ("float32", "right", "cpu", r"^--lstm-impl onednn: it takes no sequence lengths \(--padding right\)"),
    ("float32", "left", "gpu", r"^--lstm-impl onednn: it is a CPU kernel, and this backend is gpu$"),
])
def test_what_onednn_cannot_compute_is_refused_in_one_line(dtype, padding, platform, refusal):
    with pytest.raises(UnsupportedError, match=refusal):
        resolve("onednn", Run(dtype=dtype, platform=platform, padding=padding))


def test_a_library_that_was_not_built_is_refused_with_the_builds_reason(tmp_path, monkeypatch):
    skip(fake_site(tmp_path, monkeypatch), onednn.NAME, "torch is not installed")
    with pytest.raises(UnsupportedError, match=r"^--lstm-impl onednn: the native onednn_lstm library is not "
                                               r"available: torch is not installed$"):
        resolve("onednn", Run(platform="cpu"))

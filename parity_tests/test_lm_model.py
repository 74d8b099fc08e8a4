"""The language model (pytorch/examples' ``word_language_model`` RNNModel): PyTorch's ``torch_impl.lm_model`` against
JAX's ``jax_impl.lm_model`` at small sizes (V 120, E = H 24, L 2, T 7, B 3), LSTM and GRU, each JAX implementation
(``scan``: PyTorch's cells under Flax ``nn.RNN``; ``flax``: Flax's stock cells fed the same weights; for the LSTM also
``fused``, ``onednn`` and ``kernel``, one layer at a time).

Every comparison starts both twins from one neutral tree (``common.params.init_lm_params``). Cases: the forward
pass (logits at every step and the final carry) from a zero and from a non-zero carry; the loss (mean cross-entropy
over the T·B tokens) and every parameter's gradient, untied and tied; the second of two consecutive windows, the
carry handed over and truncated (``repackage_hidden`` / ``stop_gradient``); the cross-entropy alone; and all of it
in float64 (a process of its own: JAX's x64 mode is process-global). Training mode with dropout 0 on both sides.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from common.params import Params, init_lm_params
from jax_impl import lm as jax_lm
from jax_impl import lm_model
from jax_impl.loss import cross_entropy
from jax_impl.recurrences import choice
from parity_tests import report
from parity_tests.conftest import nonzero_carry
from parity_tests.twins import torch_grads, worst_relative_diff
from torch_impl import lm as torch_lm
from torch_impl import lm_model as torch_lm_model
from torch_impl.model import load_params
from torch_impl.step import repackage_hidden

V, E, H, L, T, B = 120, 24, 24, 2, 7, 3
CELLS, IMPLS, LSTM_ONLY = ("lstm", "gru"), ("scan", "flax"), ("fused", "onednn", "kernel")
# A token stream of two windows and their targets, the example's get_batch: window w reads rows w·T .. w·T + T - 1
# and predicts the rows one ahead.
STREAM = np.random.default_rng(0).integers(0, V, (2 * T + 1, B))
WINDOWS = [(STREAM[w * T:(w + 1) * T], STREAM[w * T + 1:(w + 1) * T + 1]) for w in range(2)]

# Float32 through 7 steps and 2 layers, then a (T, B, H) @ (H, V) decoder: each side rounds its sums in its own
# order. Measured: logits ≤ 5e-8 and carries ≤ 1.5e-7 absolute. 1e-5 is the suite's bound, far below any semantic
# difference (a gate in the wrong place, a missing bias or carry moves these values by 1e-3 or more; the incoming
# carry alone moves the logits by 0.18-0.35, see the "effect" rows).
FORWARD_TOL = 1e-5
# The loss (≈ log V = 4.8) and each gradient against its own scale (``worst_relative_diff``): measured ≤ 2e-7
# (loss, one or two float32 ulps) and ≤ 6e-7 (gradients: sums over T·B terms rounded in different orders); the
# cross-entropy alone ≤ 1.6e-7. 1e-5 leaves 15x room and still catches a 0.001% error.
REL_TOL = 1e-5
# float64 rounding is 1e-16 relative; measured ≤ 1.2e-16 (forward) and 6e-16 (loss, gradients). 1e-10 is the suite's
# float64 bound: a million times the rounding, a million times below float32's gap.
FLOAT64_TOL = 1e-10
# The window cases must exercise the carry and the truncation: each moves some gradient by at least 1% of its
# scale (measured 36-74%), a thousand times REL_TOL.
EFFECT = 1e-2

Stacked = tuple[np.ndarray, ...]  # the carry as PyTorch's stacks, each (L, B, H): LSTM (h, c), GRU (h,)


@dataclass(frozen=True)
class Run:
    """One twin's result on one window: logits (T, B, V), the carry after it, the loss and every gradient, in
    float64 numpy under the neutral names; and the dtype the logits were computed in."""

    logits: np.ndarray
    carry: Stacked
    loss: float
    grads: Params
    dtype: str


def start_carry(cell: str, start: str) -> Stacked:
    """Zeros, or a non-zero state in a trained RNN's ranges (h in (-1, 1), c unbounded), float32."""
    h, c = nonzero_carry(L, B, H) if start == "non-zero" else (np.zeros((L, B, H), np.float32),) * 2
    return (h, c) if cell == "lstm" else (h,)


def neutral_params(cell: str, tied: bool) -> Params:
    return init_lm_params(V, E, H, L, cell, tied, seed=0)


# ---------------------------------------------------------------- PyTorch


def torch_model(cell: str, tied: bool, dtype: torch.dtype) -> torch_lm_model.RNNModel:
    model = torch_lm_model.RNNModel(V, E, H, L, cell, dropout=0.0, tied=tied)
    load_params(model, neutral_params(cell, tied))
    return model.to(dtype).train()


def torch_hidden(stacked: Stacked, dtype: torch.dtype):
    """PyTorch's hidden: ``(h, c)`` (LSTM) or ``h`` (GRU), each (L, B, H)."""
    tensors = tuple(torch.tensor(a, dtype=dtype) for a in stacked)
    return tensors if len(tensors) == 2 else tensors[0]


def stacked_from_torch(hidden) -> Stacked:
    return tuple(t.detach().double().numpy() for t in (hidden if isinstance(hidden, tuple) else (hidden,)))


def torch_run(cell: str, tied: bool, stacked: Stacked, dtype: torch.dtype = torch.float32,
              windows: tuple[int, ...] = (0,), truncate: bool = True) -> Run:
    """PyTorch over ``windows`` in turn from ``stacked``, the loss on the last: each carry is handed on through
    ``repackage_hidden`` (the example's training loop), or kept on the graph if ``truncate`` is False."""
    model = torch_model(cell, tied, dtype)
    hidden = torch_hidden(stacked, dtype)
    for w in windows[:-1]:
        _, hidden = model(torch.from_numpy(WINDOWS[w][0]), hidden)
        hidden = repackage_hidden(hidden) if truncate else hidden
    tokens, targets = WINDOWS[windows[-1]]
    logits, hidden = model(torch.from_numpy(tokens), hidden)
    loss = torch_lm.cross_entropy(logits, torch.from_numpy(targets))
    model.zero_grad()
    loss.backward()
    return Run(logits.detach().double().numpy(), stacked_from_torch(hidden), loss.item(), torch_grads(model),
               str(logits.dtype).removeprefix("torch."))


# ---------------------------------------------------------------- JAX


def jax_carry(stacked: Stacked, dtype) -> tuple:
    """PyTorch's stacks → the JAX twin's carry: per layer ``(h, c)`` (LSTM) or ``h`` (GRU), each (B, H)."""
    layers = [tuple(jnp.asarray(a[k], dtype) for a in stacked) for k in range(L)]
    return tuple(layer if len(layer) == 2 else layer[0] for layer in layers)


def stacked_from_jax(carry) -> Stacked:
    """The JAX twin's carry → PyTorch's stacks, float64."""
    layers = [layer if isinstance(layer, tuple) else (layer,) for layer in jax.device_get(carry)]
    return tuple(np.stack([np.asarray(layer[i], np.float64) for layer in layers]) for i in range(len(layers[0])))


@functools.cache
def jax_loss_grad(cell: str, impl: str, tied: bool, dtype_name: str, windows: tuple[int, ...]):
    """``jit(value_and_grad)`` of ``(params, carry) → (the last window's loss, (its logits, its final carry))``, the
    ``windows`` run in turn inside the function, each carry handed on across ``stop_gradient``."""
    dtype = jnp.dtype(dtype_name)
    model = lm_model.RNNModel(V, E, H, L, cell, dropout=0.0, tied=tied, impl=impl, dtype=dtype)

    def loss_fn(params, carry):
        for w in windows[:-1]:
            _, carry = model.apply({"params": params}, WINDOWS[w][0], carry, train=True)
            carry = jax.lax.stop_gradient(carry)
        tokens, targets = WINDOWS[windows[-1]]
        logits, carry = model.apply({"params": params}, tokens, carry, train=True)
        return cross_entropy(logits, targets), (logits, carry)

    return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))


def jax_run(cell: str, impl: str, tied: bool, stacked: Stacked, dtype_name: str = "float32",
            windows: tuple[int, ...] = (0,)) -> Run:
    refused = choice.obstacle(impl, choice.Run("lm", dtype_name, "cpu", cell=cell))
    if refused:  # a native library that was not built here: its one-line reason
        pytest.skip(f"--lstm-impl {impl}: {refused}")
    params = jax.tree_util.tree_map(lambda a: a.astype(dtype_name), jax_lm.to_flax(neutral_params(cell, tied)))
    (loss, (logits, carry)), grads = jax_loss_grad(cell, impl, tied, dtype_name, windows)(
        params, jax_carry(stacked, dtype_name))
    return Run(np.asarray(logits, np.float64), stacked_from_jax(carry), float(loss),
               jax_lm.from_flax(grads, np.float64), str(logits.dtype))


# ---------------------------------------------------------------- differences


def forward_diff(a: Run, b: Run) -> tuple[float, float]:
    """max |Δ logits| and max |Δ carry| over every layer and (h, c)."""
    return report.max_abs_diff(a.logits, b.logits), max(report.max_abs_diff(x, y) for x, y in zip(a.carry, b.carry))


def gradient_diff(a: Run, b: Run) -> tuple[float, float, str]:
    """|Δ loss| / |loss|, and the worst gradient's max|Δg| / max|g| with its name."""
    assert list(a.grads) == list(b.grads)  # every parameter, under the same names
    worst, where = worst_relative_diff(a.grads, b.grads)
    return abs(a.loss - b.loss) / abs(a.loss), worst, where


def float64_differences() -> dict:
    """Every forward and gradient case in float64, from a non-zero carry (call it in a process with
    ``jax_enable_x64``): case name → the forward and gradient differences, and the dtypes each side computed in."""
    torch.set_num_threads(1)
    out = {}
    for cell in CELLS:
        for tied in (False, True):
            torch_side = torch_run(cell, tied, start_carry(cell, "non-zero"), torch.float64)
            for impl in IMPLS:
                jax_side = jax_run(cell, impl, tied, start_carry(cell, "non-zero"), "float64")
                loss, grads, where = gradient_diff(torch_side, jax_side)
                out[f"{cell} {impl} {'tied' if tied else 'untied'}"] = {
                    "forward": max(forward_diff(torch_side, jax_side)), "loss": loss, "grads": grads,
                    "where": where, "dtypes": [torch_side.dtype, jax_side.dtype]}
    return out


# ---------------------------------------------------------------- the tests

# Both cells on the stock recurrences; the LSTM on the tuned and native ones too (LSTM_ONLY: the classifier's, per
# layer).
CASES = [(cell, impl) for cell in CELLS for impl in IMPLS] + [("lstm", impl) for impl in LSTM_ONLY]
CASE_IDS = [f"{cell}-{impl}" for cell, impl in CASES]


@pytest.fixture(scope="module")
def torch_runs():
    """PyTorch's run per (cell, tied, start), computed once (every JAX implementation is held to it)."""
    return functools.cache(lambda cell, tied, start: torch_run(cell, tied, start_carry(cell, start)))


@pytest.mark.parametrize("start", ["zero", "non-zero"])
@pytest.mark.parametrize("cell,impl", CASES, ids=CASE_IDS)
def test_lm_forward_logits_and_final_carry_agree(torch_runs, cell, impl, start):
    torch_side, jax_side = torch_runs(cell, False, start), jax_run(cell, impl, False, start_carry(cell, start))
    logits, carry = forward_diff(torch_side, jax_side)
    label = f"lm {cell} {impl} T{T}, {start} carry"
    report.within(f"{label}: logits (T, B, V)", logits, FORWARD_TOL)
    report.within(f"{label}: final carry, every layer", carry, FORWARD_TOL)
    if start == "non-zero":
        # The incoming state must matter for the case to test it.
        zero = torch_runs(cell, False, "zero")
        report.at_least(f"{label}: carry moves the logits (effect)", report.max_abs_diff(zero.logits, jax_side.logits),
                        1e-3)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("cell,impl", CASES, ids=CASE_IDS)
def test_lm_loss_and_every_gradient_agree(torch_runs, cell, impl, tied):
    torch_side = torch_runs(cell, tied, "non-zero")
    jax_side = jax_run(cell, impl, tied, start_carry(cell, "non-zero"))
    assert ("decoder.weight" in torch_side.grads) is not tied and "encoder.weight" in torch_side.grads
    loss, grads, where = gradient_diff(torch_side, jax_side)
    label = f"lm {cell} {impl} {'tied' if tied else 'untied'}, non-zero carry"
    report.within(f"{label}: loss rel.", loss, REL_TOL)
    report.within(f"{label}: {len(torch_side.grads)} grads rel., worst {where}", grads, REL_TOL)


@pytest.mark.slow  # two windows in one compiled gradient, per case
@pytest.mark.parametrize("cell,impl", CASES, ids=CASE_IDS)
def test_lm_second_window_gradients_agree_with_the_carry_truncated(cell, impl):
    start = start_carry(cell, "zero")
    torch_side = torch_run(cell, False, start, windows=(0, 1))
    jax_side = jax_run(cell, impl, False, start, windows=(0, 1))
    loss, grads, where = gradient_diff(torch_side, jax_side)
    label = f"lm {cell} {impl} window 2 of 2, carry truncated"
    report.within(f"{label}: logits and final carry", max(forward_diff(torch_side, jax_side)), FORWARD_TOL)
    report.within(f"{label}: loss rel.", loss, REL_TOL)
    report.within(f"{label}: grads rel., worst {where}", grads, REL_TOL)


@pytest.mark.parametrize("cell", CELLS)
def test_lm_window_boundary_cases_exercise_the_carry_and_the_truncation(cell):
    # PyTorch's second-window gradients move when the first window's carry is replaced by zeros, and when the carry
    # is not truncated (the gradient then reaches into the first window): agreement above is not an accident.
    zero = start_carry(cell, "zero")
    carried = torch_run(cell, False, zero, windows=(0, 1))
    fresh = torch_run(cell, False, zero, windows=(1,))
    untruncated = torch_run(cell, False, zero, windows=(0, 1), truncate=False)
    report.at_least(f"lm {cell} window 2: the carried state moves the grads (effect)",
                    worst_relative_diff(carried.grads, fresh.grads)[0], EFFECT)
    report.at_least(f"lm {cell} window 2: truncating the carry moves the grads (effect)",
                    worst_relative_diff(carried.grads, untruncated.grads)[0], EFFECT)


def test_lm_cross_entropy_and_its_gradient_agree():
    # Logits ~ N(0, 10²), up to ±45: the log-sum-exp's shift by the max matters, and the two libraries round the
    # shifted sums in their own orders (optax: logsumexp - the target's logit; PyTorch: log_softmax, then NLL).
    logits = (np.random.default_rng(3).standard_normal((T, B, V)) * 10).astype(np.float32)
    targets = WINDOWS[0][1]
    logits_t = torch.tensor(logits, requires_grad=True)
    loss_t = torch_lm.cross_entropy(logits_t, torch.from_numpy(targets))
    loss_t.backward()
    loss_j, grad_j = jax.jit(jax.value_and_grad(cross_entropy))(logits, targets)
    report.within("lm cross-entropy, logits N(0, 10²): loss rel.", abs(loss_t.item() - float(loss_j)) / loss_t.item(),
                  REL_TOL)
    grad_t = logits_t.grad.numpy()
    report.within("lm cross-entropy, logits N(0, 10²): d loss/d logits rel.",
                  report.max_abs_diff(grad_t, grad_j) / np.abs(grad_t).max(), REL_TOL)


@pytest.mark.slow  # one process: 8 compilations in float64
def test_lm_float64_forward_loss_and_gradients_agree_to_rounding():
    root = Path(__file__).resolve().parents[1]
    code = ("import jax; jax.config.update('jax_enable_x64', True); import json; "
            "from parity_tests.test_lm_model import float64_differences; print(json.dumps(float64_differences()))")
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(cases) == len(CELLS) * len(IMPLS) * 2
    for case, diffs in cases.items():
        assert diffs["dtypes"] == ["float64", "float64"], case  # both really computed in float64
        report.within(f"lm float64 {case}, non-zero carry: logits and final carry", diffs["forward"], FLOAT64_TOL)
        report.within(f"lm float64 {case}, non-zero carry: loss and grads rel., worst {diffs['where']}",
                      max(diffs["loss"], diffs["grads"]), FLOAT64_TOL)

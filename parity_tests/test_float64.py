"""Both twins in float64 (JAX x64, PyTorch double) for 50 training steps in each trajectory mode
agree to 1e-10 per step, so the ~1e-6 float32 gaps of test_trajectories are rounding, not semantics.

The runs happen in a separate process (``parity_tests.float64_run``; x64 is process-global in JAX), started
by conftest when collection picks this file; these tests run last and read its JSON.
"""
from __future__ import annotations

import numpy as np
import pytest

from parity_tests import report
from parity_tests.configs import FLOAT64_STEPS, TRAJECTORY_MODES
from parity_tests.conftest import FLOAT64_RUN

# float64 rounding is 1e-16 relative; 50 steps of the same function amplify it to ~1e-15 (measured 3e-16).
# 1e-10 is the suite's bound: a million times the rounding, a million times below float32's gap.
LOSS_TOL = 1e-10


@pytest.fixture(scope="module")
def float64_runs() -> dict:
    return FLOAT64_RUN.result(timeout=560)


@pytest.mark.parametrize("mode", list(TRAJECTORY_MODES))
def test_float64_trajectories_agree_to_rounding(float64_runs, mode):
    assert float64_runs["jax_x64"] is True
    run = float64_runs["modes"][mode]
    # Both really computed in float64 (a float32 side could not agree to 1e-10 anyway, but say why it failed).
    assert run["torch_dtype"] == "torch.float64" and run["jax_dtype"] == "float64"
    losses_t, losses_j = np.array(run["torch"]), np.array(run["jax"])
    assert len(losses_t) == len(losses_j) == FLOAT64_STEPS
    report.within(f"{FLOAT64_STEPS} steps float64 {mode}: max per-step |loss diff|",
                  np.abs(losses_t - losses_j).max(), LOSS_TOL)

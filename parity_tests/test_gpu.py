"""The forward check (test_forward) and the 200-step trajectories (test_trajectories) on a GPU, with TF32 off on both
sides (PyTorch: ``allow_tf32 = False`` for matmuls and cuDNN; JAX: default matmul precision "highest", on top
of the twin's own ``Precision.HIGHEST``), so both compute in full float32 and the CPU tolerances apply.

Skipped, with the reason, where PyTorch sees no CUDA GPU; where it does and JAX does not (a CPU-only jax on a GPU
host), the suite fails: that is a broken set-up, not a machine without a GPU.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from common.batches import Batch
from jax_impl.loss import sigmoid
from parity_tests import report
from parity_tests.configs import TRAJECTORY_MODES, TRAJECTORY_STEPS
from parity_tests.conftest import nonzero_carry
from parity_tests.test_forward import CASES, FORWARD_TOL
from parity_tests.test_trajectories import LOSS_TOL
from parity_tests.twins import (flax_params, jax_carry, flax_module, stacked_from_jax, stacked_from_torch,
                                make_twin, torch_hidden, torch_module, trajectory, zeros_stacked)
from torch_impl.classifier import to_device

JAX_GPUS = [d for d in jax.devices() if d.platform == "gpu"]
TORCH_GPU = torch.cuda.is_available()

JAX_PLATFORMS = sorted({d.platform for d in jax.devices()})
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not TORCH_GPU, reason=f"needs a CUDA GPU (torch.cuda.is_available() is False, torch "
                                             f"{torch.__version__})"),
]
needs_jax_gpu = pytest.mark.skipif(TORCH_GPU and not JAX_GPUS,
                                   reason="JAX sees no GPU, so test_jax_sees_the_gpu_pytorch_sees fails")


def test_jax_sees_the_gpu_pytorch_sees():
    assert JAX_GPUS, (f"PyTorch sees a CUDA GPU but JAX does not (its platforms: {JAX_PLATFORMS}, jax "
                      f"{jax.__version__}): JAX fell back to the CPU; install its CUDA build (make setup ACCEL=cuda)")


@pytest.fixture(scope="module", autouse=True)
def full_float32():
    """TF32 off for the module (and restored after): both twins then do full float32 matmuls."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with jax.default_matmul_precision("highest"):
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="module")
def gpu_twins(seed_setup):
    cfg = seed_setup.cfg
    torch_model = torch_module(cfg, seed_setup.neutral, seed_setup.vocab_size, device="cuda").eval()
    model = flax_module(cfg, seed_setup.vocab_size)
    apply = jax.jit(lambda p, tokens, carry, lengths: model.apply({"params": p}, tokens, carry, lengths))
    return torch_model, apply, flax_params(seed_setup.neutral, JAX_GPUS[0])


@needs_jax_gpu
@pytest.mark.parametrize("padding,start,steps", CASES, ids=[f"{p}-{s}-T{t}" for p, s, t in CASES])
def test_gpu_forward_probabilities_and_final_states_agree(seed_setup, gpu_twins, padding, start, steps):
    torch_model, apply, params = gpu_twins
    cfg, batch, device = seed_setup.cfg, seed_setup.batch(padding), JAX_GPUS[0]
    if steps < batch.tokens.shape[1]:
        batch = Batch(batch.tokens[:, -steps:], batch.labels, np.minimum(batch.lengths, steps))
    carry0 = zeros_stacked(cfg, batch.size) if start == "zero" else nonzero_carry(cfg.layers, batch.size,
                                                                                  cfg.hidden_dim)
    tokens, _, lengths = to_device(batch, torch_model)
    with torch.no_grad():
        probs_t, hidden_t = torch_model(tokens, torch_hidden(carry0, device="cuda"),
                                        lengths if padding == "right" else None)
    logits_j, carry_j = apply(params, jax.device_put(batch.tokens, device), jax_carry(carry0, device),
                              jax.device_put(batch.lengths, device) if padding == "right" else None)

    label = f"GPU forward {padding} T{steps}, {'zero' if start == 'zero' else 'non-zero'} carry"
    report.within(f"{label}: P(positive)", report.max_abs_diff(probs_t.cpu().numpy(), sigmoid(logits_j)),
                  FORWARD_TOL)
    (h_t, c_t), (h_j, c_j) = stacked_from_torch(hidden_t), stacked_from_jax(carry_j)
    for k in range(cfg.layers):
        diff = max(report.max_abs_diff(h_t[k], h_j[k]), report.max_abs_diff(c_t[k], c_j[k]))
        report.within(f"{label}: layer {k} final (h, c)", diff, FORWARD_TOL)


@needs_jax_gpu
@pytest.mark.parametrize("mode", list(TRAJECTORY_MODES))
def test_gpu_training_trajectories_agree_for_200_steps(trajectory_setup, jax_twins, mode):
    cfg = trajectory_setup.cfg.replace(device="gpu", **TRAJECTORY_MODES[mode])
    data, neutral = trajectory_setup.data(cfg), trajectory_setup.neutral
    torch_twin = make_twin("torch", cfg, trajectory_setup.vocab_size)
    losses_t = np.array(trajectory(torch_twin, cfg, data, neutral, TRAJECTORY_STEPS)[0])
    losses_j = np.array(trajectory(jax_twins(cfg), cfg, data, neutral, TRAJECTORY_STEPS)[0])
    report.within(f"GPU {TRAJECTORY_STEPS} steps {mode}: max per-step |loss diff|",
                  np.abs(losses_t - losses_j).max(), LOSS_TOL)

"""The loss where the sigmoid saturates. PyTorch: ``nn.BCELoss`` on ``torch.sigmoid(z)`` (the seed's
pair); JAX: ``jax_impl.loss.bce_loss(z)``. Logits ±20 (p rounds to exactly 1.0 at +20 in float32) and ±120
(p underflows to 0 at -120), labels 0 and 1: value and gradient agree, and nothing is NaN.
"""
from __future__ import annotations

import itertools

import jax
import numpy as np
import torch
from torch import nn

from jax_impl.loss import bce_loss
from parity_tests import report

CASES = list(itertools.product([20.0, -20.0, 120.0, -120.0], [0.0, 1.0]))
# Both sides compute p = sigmoid(z) in float32 and then the same clamped logs and PyTorch's backward formula;
# the sigmoids may differ by an ulp where p is tiny (z = -20: p ≈ 2e-9), which moves the loss 20.0 by ~1 ulp.
# Relative 1e-6 (of max(1, |value|)) is a few ulps and far below any semantic difference (0 vs 100).
TOL = 1e-6


def torch_value_and_grad(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    logits = torch.tensor(z, dtype=torch.float32, requires_grad=True)
    loss = nn.BCELoss()(torch.sigmoid(logits), torch.tensor(y, dtype=torch.float32))
    loss.backward()
    return float(loss.detach()), logits.grad.numpy()


def jax_value_and_grad(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    loss, grad = jax.value_and_grad(bce_loss)(np.asarray(z, np.float32), np.asarray(y, np.float32))
    return float(loss), np.asarray(grad)


def scaled(a: float | np.ndarray, b: float | np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(a))))


def test_saturated_bce_value_and_gradient_agree_without_nan():
    loss_diff = grad_diff = 0.0
    for z, y in CASES:
        lt, gt = torch_value_and_grad(np.array([z]), np.array([y]))
        lj, gj = jax_value_and_grad(np.array([z]), np.array([y]))
        assert np.isfinite([lt, lj, *gt, *gj]).all(), f"z={z}, y={y}: torch ({lt}, {gt}), jax ({lj}, {gj})"
        assert scaled(lt, lj) <= TOL and scaled(gt, gj) <= TOL, f"z={z}, y={y}: torch ({lt}, {gt}), jax ({lj}, {gj})"
        loss_diff, grad_diff = max(loss_diff, scaled(lt, lj)), max(grad_diff, scaled(gt, gj))
    report.within("BCE at z = ±20, ±120, y = 0/1 (8 cases): loss", loss_diff, TOL)
    report.within("BCE at z = ±20, ±120, y = 0/1 (8 cases): d loss/dz", grad_diff, TOL)


def test_saturated_bce_matches_pytorch_s_clamped_values():
    """The numbers PyTorch's rule gives (jax_impl/loss.py): at z = 20, p is 1.0 in float32, so y = 0 costs
    log(0) clamped to -100 → loss 100 with gradient 0; y = 1 is free. At z = -20, y = 1: loss 20, grad -1."""
    for z, y, loss, grad in [(20.0, 0.0, 100.0, 0.0), (20.0, 1.0, 0.0, 0.0), (-120.0, 1.0, 100.0, 0.0),
                             (-20.0, 1.0, 20.0, -1.0)]:
        lj, gj = jax_value_and_grad(np.array([z]), np.array([y]))
        assert abs(lj - loss) <= 1e-5 * max(1.0, loss) and abs(gj[0] - grad) <= 1e-6, (z, y, lj, gj)


def test_a_batch_mixing_saturated_logits_agrees():
    """The mean over a batch of all eight cases (each gradient divided by N = 8, as both rules do)."""
    z, y = np.array([c[0] for c in CASES]), np.array([c[1] for c in CASES])
    lt, gt = torch_value_and_grad(z, y)
    lj, gj = jax_value_and_grad(z, y)
    assert np.isfinite([lt, lj, *gt, *gj]).all()
    report.within("BCE on a batch of the 8 saturated cases: loss and grads",
                  max(scaled(lt, lj), scaled(gt, gj)), TOL)

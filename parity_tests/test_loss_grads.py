"""The loss and every parameter's gradient at the seed's shapes (B 50, T 200, E 400, H 256, L 2,
V 4398), the embedding's included.

PyTorch: the twin's model, ``nn.BCELoss`` on its probabilities, ``backward()``. JAX: ``jax.value_and_grad`` of
``jax_impl.step.make_loss_fn`` (the loss-of-parameters function the twin's ``train_step`` differentiates)
on the twin's model. Training mode with dropout 0 on both sides.
"""
from __future__ import annotations

import jax
import pytest

from parity_tests import report
from parity_tests.conftest import nonzero_carry
from jax_impl import classifier as jax_classifier
from parity_tests.twins import (flax_module, flax_params, jax_carry, jax_loss_grad, neutral_from_flax, torch_hidden,
                                torch_loss_and_grads, torch_module, worst_relative_diff, worst_scaled_diff,
                                zeros_stacked)

pytestmark = pytest.mark.slow  # tens of seconds each on a 2-core CPU

# A mean of 50 float32 BCE terms near 0.69: one float32 ulp there is 6e-8; 1e-6 allows a few ulps of the
# differently rounded forward passes and nothing more.
LOSS_TOL = 1e-6
# Gradients are sums over B·T terms rounded in different orders; measured 1e-10 to 2e-8 absolute for
# max|g| from 1e-4 (embedding) to 1e-2 (fc). The suite's bound: 1e-5 × max(1, max|g|).
GRAD_TOL = 1e-5
# That bound is loose for gradients far below 1 (1e-5 is 12% of the embedding's largest gradient, 8.6e-5),
# so each gradient is also held to its own scale: max|Δg| / max|g| ≤ 1e-4. Measured: ~1.5e-6 (float32
# rounding of long sums), so 1e-4 leaves 60x room and still catches a 0.01% semantic error.
REL_GRAD_TOL = 1e-4

CASES = [("left", "zero"), ("right", "zero"), ("left", "non-zero"), ("right", "non-zero")]


@pytest.fixture(scope="module")
def grad_fns(seed_setup):
    """One compiled value-and-grad per padding (the loss function differs: lengths are used or not)."""
    fns = {}
    for padding in ("left", "right"):
        cfg = seed_setup.cfg.replace(padding=padding)
        fns[padding] = jax_loss_grad(flax_module(cfg, seed_setup.vocab_size), cfg)
    return fns


@pytest.fixture(scope="module")
def torch_model(seed_setup):
    return torch_module(seed_setup.cfg, seed_setup.neutral, seed_setup.vocab_size)


@pytest.mark.parametrize("padding,start", CASES, ids=[f"{p}-{s}" for p, s in CASES])
def test_loss_and_every_gradient_agree(seed_setup, grad_fns, torch_model, padding, start):
    cfg, batch = seed_setup.cfg, seed_setup.batch(padding)
    carry0 = zeros_stacked(cfg, batch.size) if start == "zero" else nonzero_carry(cfg.layers, batch.size,
                                                                                  cfg.hidden_dim)
    loss_t, grads_t = torch_loss_and_grads(torch_model, batch, torch_hidden(carry0),
                                            cfg.replace(padding=padding))
    (loss_j, _), grads = grad_fns[padding](flax_params(seed_setup.neutral), jax_carry(carry0),
                                           jax_classifier.to_device(batch), jax.random.key(0))
    grads_j = neutral_from_flax(grads)

    label = f"loss/grad {padding} T200, {start} carry"
    report.within(f"{label}: loss", abs(loss_t - float(loss_j)), LOSS_TOL)
    assert list(grads_t) == list(grads_j) and "embedding.weight" in grads_t  # all 11, the embedding's too
    worst, where = worst_scaled_diff(grads_t, grads_j)
    report.within(f"{label}: 11 grads, worst {where}", worst, GRAD_TOL)
    worst, where = worst_relative_diff(grads_t, grads_j)
    report.within(f"{label}: 11 grads rel., worst {where}", worst, REL_GRAD_TOL)
    # The embedding's is the largest and sparsest gradient (scatter-add in JAX, index_add in PyTorch).
    worst, _ = worst_relative_diff({"e": grads_t["embedding.weight"]}, {"e": grads_j["embedding.weight"]})
    report.within(f"{label}: embedding grad rel.", worst, REL_GRAD_TOL)

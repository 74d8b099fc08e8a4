"""One step of each twin's own ``train_step`` (PyTorch: ``torch_impl.step.train_step`` with
``make_optimizer``; JAX: the JAX twin's ``train_step`` from its ``init_state``), with the global
gradient norm above and below the clip threshold.

The clip coefficient each twin *applied* is read back from its Adam state: after the first step Adam's first
moment is ``(1 - β1) · coef · g``, so ``coef = <m, g> / ((1 - β1) <g, g>)`` with ``g`` the twin's own unclipped
gradient. Configuration: the trajectory one (real corpus, B 50, T 100, E 32, H 32, L 2), first batch of epoch 0,
zero carry, dropout 0.
"""
from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from parity_tests import report
from common.batches import batches
from jax_impl import classifier as jax_classifier
from parity_tests.twins import (flax_module, flax_params, jax_carry, jax_loss_grad, neutral_from_flax,
                                torch_loss_and_grads, torch_module, zeros_stacked)
from torch_impl.model import export_params
from torch_impl.classifier import train_step
from torch_impl.step import TrainState, make_optimizer

pytestmark = pytest.mark.slow  # tens of seconds each on a 2-core CPU

# Read-back precision of the coefficient: m and g are float32 (relative rounding 6e-8 per element), and the
# estimate averages them over 60k elements; measured agreement is ~1e-8. 1e-7 is the suite's bound.
COEF_TOL = 1e-7
# First Adam step: each parameter moves by lr · g / (|g| + eps) ≈ ±1e-3. Gradients that agree to 1e-8
# give updates that agree to ~1e-9, except where |g| is near eps (1e-8), where the update's size depends on
# g itself (measured worst 1.8e-6 at E 64, H 64). 1e-5 is the suite's bound, 1% of a step.
PARAM_TOL = 1e-5
# Adam's steps on the same gradients: the parameters within 4 float32 ulps of the largest (torch rounds the bias
# corrections from float64, the JAX twin computes them in float32 without cancellation).
ADAM_TOL = 5e-7
BETA1 = 0.9
ONE_MINUS_BETA1 = float(np.float32(1 - BETA1))  # both frameworks scale g by (1 - β1) rounded to float32


def applied_coefficient(moment: dict, grads: dict) -> float:
    names = list(grads)
    num = sum(float(np.sum(np.asarray(moment[n], np.float64) * grads[n])) for n in names)
    den = sum(float(np.sum(np.square(grads[n]))) for n in names)
    return num / (ONE_MINUS_BETA1 * den)


def torch_one_step(cfg, setup, batch):
    """PyTorch: the unclipped gradient, then one real train_step; (grads, coefficient, params after)."""
    model = torch_module(cfg, setup.neutral, setup.vocab_size)
    _, grads = torch_loss_and_grads(model, batch, model.init_hidden(batch.size), cfg)
    optimizer = make_optimizer(model, cfg)
    train_step(TrainState(model, optimizer), model.init_hidden(batch.size), batch, cfg)
    moment = {name: optimizer.state[p]["exp_avg"].numpy() for name, p in model.named_parameters()}
    return grads, applied_coefficient(moment, grads), export_params(model)


@pytest.fixture(scope="module")
def setup_and_batch(trajectory_setup):
    batch = next(batches(trajectory_setup.left.train, trajectory_setup.cfg.batch_size,
                         shuffle_seed=trajectory_setup.cfg.seed, epoch=0))
    return trajectory_setup, batch


@pytest.fixture(scope="module")
def jax_raw_grads(setup_and_batch):
    """JAX's unclipped gradient of the first batch (the clip setting does not enter the loss)."""
    setup, batch = setup_and_batch
    cfg = setup.cfg
    grad_fn = jax_loss_grad(flax_module(cfg, setup.vocab_size), cfg)
    _, grads = grad_fn(flax_params(setup.neutral), jax_carry(zeros_stacked(cfg, batch.size)),
                       jax_classifier.to_device(batch), jax.random.key(cfg.seed))
    return neutral_from_flax(grads)


@pytest.mark.parametrize("regime", ["below", "above"])
def test_one_adam_step_clips_and_updates_alike(setup_and_batch, jax_twins, jax_raw_grads, regime):
    setup, batch = setup_and_batch
    norm = float(np.sqrt(sum(np.sum(np.square(g)) for g in jax_raw_grads.values())))
    # Below: the seed's clip 5. Above: a threshold at about half the norm, so the coefficient is about 0.5.
    clip = setup.cfg.clip if regime == "below" else float(f"{norm / 2:.3g}")
    cfg = setup.cfg.replace(clip=clip)
    assert (norm < clip) == (regime == "below")

    grads_t, coef_t, params_t = torch_one_step(cfg, setup, batch)

    twin = jax_twins(cfg)
    state, _, _ = twin.train_step(twin.init_state(setup.neutral), twin.init_carry(), batch)
    coef_j = applied_coefficient(neutral_from_flax(optax.tree_utils.tree_get(state.opt_state, "mu")),
                                 jax_raw_grads)
    params_j = twin.export_params(state)

    expected = min(1.0, clip / (norm + 1e-6))  # the formula both twins implement, for the sanity of the case
    assert abs(coef_t - expected) < 1e-6 and abs(coef_j - expected) < 1e-6
    label = f"1 Adam step, |g| {norm:.3g} {'<' if regime == 'below' else '>'} clip {clip:g}"
    report.within(f"{label}: clip coefficient applied", abs(coef_t - coef_j), COEF_TOL)
    report.within(f"{label}: params after step",
                  max(report.max_abs_diff(params_t[n], params_j[n]) for n in params_t), PARAM_TOL)


def test_adam_takes_pytorchs_steps_given_the_same_gradients():
    # 100 steps on fixed gradients of every scale (1e-9 to 1e3, a tenth of them 0): the parameters after each step,
    # against torch.optim.Adam's, relative to the largest parameter, in float32 (float64: the trajectories' tests).
    # Measured 1.2e-7; optax.adam, 1.0e-6.
    import jax.numpy as jnp
    import torch

    from common.config import Config
    from jax_impl.optim import make_optimizer as jax_optimizer

    dtype = "float32"
    rng = np.random.default_rng(0)
    start = rng.standard_normal((64, 33)).astype(dtype)
    grads = [rng.standard_normal(start.shape) * 10.0 ** rng.uniform(-9, 3, start.shape)
             * (rng.random(start.shape) > 0.1) for _ in range(100)]
    cfg = Config(clip=0.0, lr=1e-2, dtype=dtype)
    torch_param = torch.nn.Parameter(torch.tensor(start))
    torch_adam = torch.optim.Adam([torch_param], lr=cfg.lr)
    tx = jax_optimizer(cfg)
    param = jnp.asarray(start)
    state = tx.init(param)
    worst = 0.0
    for g in grads:
        torch_param.grad = torch.tensor(g.astype(dtype))
        torch_adam.step()
        updates, state = tx.update(jnp.asarray(g.astype(dtype)), state, param)
        param = param + updates
        expected = torch_param.detach().numpy()
        worst = max(worst, float(np.max(np.abs(np.asarray(param) - expected)) / np.max(np.abs(expected))))
    report.within("Adam, 100 steps on the same gradients: parameters rel.", worst, ADAM_TOL)

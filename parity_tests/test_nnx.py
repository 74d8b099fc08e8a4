"""The classifier written in Flax NNX (``--flax-api nnx``: ``nnx.RNN`` over Flax's stock ``nnx.OptimizedLSTMCell``,
stepped by ``nnx.jit`` and ``nnx.Optimizer``) against the PyTorch twin, held to the bounds the default JAX stack is held
to: the loss and every gradient at the seed's shapes (each of PyTorch's two biases gets its own gradient), and the
200-step trajectories of the modes where NNX's code differs from linen's: the seed's, right padding (``nnx.RNN``'s
``seq_lengths``), ``--tbptt 50`` (the model split and merged inside ``lax.scan``) and clip 0.1 (the clip binds, over a
norm that counts both biases' gradients). The other modes run the loop's code, which every twin shares.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jax_impl import convert, nnx_model, nnx_step
from jax_impl import classifier as jax_classifier
from jax_impl.recurrences.choice import Run, nnx_obstacle
from parity_tests import report
from parity_tests.configs import TRAJECTORY_MODES, TRAJECTORY_STEPS
from parity_tests.test_loss_grads import GRAD_TOL, LOSS_TOL, REL_GRAD_TOL
from parity_tests.test_trajectories import LOSS_TOL as TRAJECTORY_TOL
from parity_tests.twins import (jax_carry, torch_hidden, torch_loss_and_grads, torch_module, trajectory,
                                worst_relative_diff, worst_scaled_diff, zeros_stacked)

pytestmark = [pytest.mark.slow,  # the seed's shapes, and 200 steps a mode
              pytest.mark.skipif(nnx_obstacle(Run(flax_api="nnx")) is not None,
                                 reason=str(nnx_obstacle(Run(flax_api="nnx"))))]

NNX_MODES = ("stateful (seed)", "padding right", "tbptt 50", "clip 0.1 (binds)")


def test_loss_and_every_gradient_agree_at_the_seeds_shapes(seed_setup):
    cfg = seed_setup.cfg.replace(flax_api="nnx")
    batch = seed_setup.batch("left")
    carry0 = zeros_stacked(cfg, batch.size)
    torch_model = torch_module(cfg, seed_setup.neutral, seed_setup.vocab_size)
    loss_t, grads_t = torch_loss_and_grads(torch_model, batch, torch_hidden(carry0), cfg)
    state = nnx_step.create_train_state(nnx_model.model_from_config(cfg, seed_setup.vocab_size), cfg,
                                        seed_setup.neutral)
    loss_and_grads = nnx.jit(nnx.value_and_grad(nnx_step.make_loss_fn(cfg), has_aux=True))
    (loss_j, _), grads = loss_and_grads(state.model, jax_carry(carry0), jax_classifier.to_device(batch),
                                        jax.random.key(0))
    grads_j = {k: v.astype(np.float64) for k, v in convert.from_nnx(jax.device_get(nnx.to_pure_dict(grads))).items()}
    report.within("nnx: loss/grad left T200, zero carry: loss", abs(loss_t - float(loss_j)), LOSS_TOL)
    worst, where = worst_scaled_diff(grads_t, grads_j)
    report.within(f"nnx: loss/grad left T200, zero carry: 11 grads, worst {where}", worst, GRAD_TOL)
    worst, where = worst_relative_diff(grads_t, grads_j)
    report.within(f"nnx: loss/grad left T200, zero carry: 11 grads rel., worst {where}", worst, REL_GRAD_TOL)


@pytest.mark.parametrize("mode", NNX_MODES)
def test_training_trajectories_agree_for_200_steps(trajectory_setup, jax_twins, torch_losses, mode):
    cfg = trajectory_setup.cfg.replace(**TRAJECTORY_MODES[mode], flax_api="nnx")
    losses_j = np.array(trajectory(jax_twins(cfg), cfg, trajectory_setup.data(cfg), trajectory_setup.neutral,
                                   TRAJECTORY_STEPS)[0])
    losses_t = torch_losses(mode)
    assert len(losses_j) == TRAJECTORY_STEPS and losses_t[:10].mean() - losses_t[-20:].mean() > 0.02
    report.within(f"nnx: {TRAJECTORY_STEPS} steps {mode}: max per-step |loss diff|", np.abs(losses_t - losses_j).max(),
                  TRAJECTORY_TOL)

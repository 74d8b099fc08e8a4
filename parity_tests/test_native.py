"""The JAX stacks the default rows do not run, against the PyTorch twin, held to the bounds the default stack is held
to: of ``--lstm-impl fused`` (XLA's fused recurrence), ``onednn`` (oneDNN's LSTM primitive through XLA's FFI, the
kernel torch's nn.LSTM runs) and ``kernel`` (our own recurrence kernel through XLA's FFI), every one but the one
``--lstm-impl auto`` picks here (the kernel on one AVX-512 CPU device, else fused), at the seed's shapes in one forward
pass and in the loss and every gradient, and in the 200-step trajectories of every carry mode. So each runs once,
whichever the default is. A machine where a native library was not built skips its rows, saying why.

oneDNN's primitive takes no sequence lengths, so ``--padding right`` is refused in one line (PyTorch runs packed
sequences on its ATen cell, not on oneDNN): that refusal is a row here too. It has no float64 either. Our kernel
takes sequence lengths, so it runs both paddings; it computes float32 only.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from common.batches import Batch
from common.errors import UnsupportedError
from jax_impl.recurrences import native
from jax_impl import classifier as jax_classifier
from jax_impl.loss import sigmoid
from jax_impl.recurrences.choice import Run, auto
from parity_tests import report
from parity_tests.configs import TRAJECTORY_MODES, TRAJECTORY_STEPS
from parity_tests.conftest import nonzero_carry
from parity_tests.test_forward import FORWARD_TOL
from parity_tests.test_loss_grads import GRAD_TOL, LOSS_TOL, REL_GRAD_TOL
from parity_tests.test_trajectories import LOSS_TOL as TRAJECTORY_TOL
from parity_tests.twins import (flax_module, flax_params, jax_carry, jax_loss_grad, neutral_from_flax, stacked_from_jax,
                                stacked_from_torch, torch_hidden, torch_loss_and_grads, torch_module, trajectory,
                                worst_relative_diff, worst_scaled_diff, zeros_stacked)
from torch_impl.classifier import to_device

LIBRARIES = {"fused": None, "onednn": "onednn_lstm", "kernel": "lstm_kernel"}  # the native library each needs
DEFAULT = auto(Run(platform="cpu"))[0]  # the default rows' implementation (test_forward, test_trajectories...)
# The paddings each computes, for every implementation but the default's.
PADDINGS = {impl: paddings for impl, paddings in
            {"fused": ("left", "right"), "onednn": ("left",), "kernel": ("left", "right")}.items() if impl != DEFAULT}


def needs_library(impl: str) -> None:
    reason = LIBRARIES[impl] and native.unavailable(LIBRARIES[impl])
    if reason:
        pytest.skip(reason)


def cases(kind: str) -> list:
    """Every (impl, padding, start) a test of ``kind`` runs: both paddings where the impl computes them."""
    steps = {"forward": {"zero": 200, "carried": 16}, "grads": {"zero": 200, "carried": 200}}[kind]
    return [pytest.param(impl, padding, start, t, id=f"{impl}-{padding}-{start}")
            for impl, paddings in PADDINGS.items() for padding in paddings for start, t in steps.items()]


def incoming(cfg, batch, start: str):
    return zeros_stacked(cfg, batch.size) if start == "zero" else nonzero_carry(cfg.layers, batch.size, cfg.hidden_dim)


@pytest.mark.parametrize("impl,padding,start,steps", cases("forward"))
def test_forward_probabilities_and_final_states_agree(seed_setup, impl, padding, start, steps):
    """As test_forward's cases: from a zero carry over T 200, and from a non-zero one over the last 16 columns,
    where an incoming carry still moves the final states."""
    needs_library(impl)
    cfg = seed_setup.cfg.replace(padding=padding, lstm_impl=impl)
    batch = seed_setup.batch(padding)
    batch = Batch(batch.tokens[:, -steps:], batch.labels, np.minimum(batch.lengths, steps))
    carry0 = incoming(cfg, batch, start)
    torch_model = torch_module(cfg.replace(lstm_impl="auto"), seed_setup.neutral, seed_setup.vocab_size).eval()
    tokens, _, lengths = to_device(batch, torch_model)
    lengths = lengths if padding == "right" else None
    with torch.no_grad():
        probs_t, hidden_t = torch_model(tokens, torch_hidden(carry0), lengths)
    model = flax_module(cfg, seed_setup.vocab_size)
    logits_j, carry_j = jax.jit(model.apply)({"params": flax_params(seed_setup.neutral)}, batch.tokens,
                                             jax_carry(carry0), None if lengths is None else batch.lengths)
    label = f"{impl}: forward {padding} T{steps}, {start} carry"
    report.within(f"{label}: P(positive)", report.max_abs_diff(probs_t.numpy(), sigmoid(logits_j)), FORWARD_TOL)
    (h_t, c_t), (h_j, c_j) = stacked_from_torch(hidden_t), stacked_from_jax(carry_j)
    diff = max(max(report.max_abs_diff(h_t[k], h_j[k]), report.max_abs_diff(c_t[k], c_j[k])) for k in range(2))
    report.within(f"{label}: final (h, c) of both layers", diff, FORWARD_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("impl,padding,start,steps", cases("grads"))
def test_loss_and_every_gradient_agree(seed_setup, impl, padding, start, steps):
    needs_library(impl)
    cfg = seed_setup.cfg.replace(padding=padding, lstm_impl=impl)
    batch = seed_setup.batch(padding)
    carry0 = incoming(cfg, batch, start)
    torch_model = torch_module(cfg.replace(lstm_impl="auto"), seed_setup.neutral, seed_setup.vocab_size)
    loss_t, grads_t = torch_loss_and_grads(torch_model, batch, torch_hidden(carry0), cfg)
    (loss_j, _), grads = jax_loss_grad(flax_module(cfg, seed_setup.vocab_size), cfg)(
        flax_params(seed_setup.neutral), jax_carry(carry0), jax_classifier.to_device(batch), jax.random.key(0))
    grads_j = neutral_from_flax(grads)
    label = f"{impl}: loss/grad {padding} T{steps}, {start} carry"
    report.within(f"{label}: loss", abs(loss_t - float(loss_j)), LOSS_TOL)
    worst, where = worst_scaled_diff(grads_t, grads_j)
    report.within(f"{label}: 11 grads, worst {where}", worst, GRAD_TOL)
    worst, where = worst_relative_diff(grads_t, grads_j)
    report.within(f"{label}: 11 grads rel., worst {where}", worst, REL_GRAD_TOL)


TRAJECTORIES = [pytest.param(impl, mode, id=f"{impl}-{mode}") for impl, paddings in PADDINGS.items()
                for mode, changes in TRAJECTORY_MODES.items() if changes.get("padding", "left") in paddings]


@pytest.mark.slow
@pytest.mark.parametrize("impl,mode", TRAJECTORIES)
def test_training_trajectories_agree_for_200_steps(trajectory_setup, jax_twins, torch_losses, impl, mode):
    needs_library(impl)
    cfg = trajectory_setup.cfg.replace(**TRAJECTORY_MODES[mode], lstm_impl=impl)
    losses_j = np.array(trajectory(jax_twins(cfg), cfg, trajectory_setup.data(cfg), trajectory_setup.neutral,
                                   TRAJECTORY_STEPS)[0])
    losses_t = torch_losses(mode)
    assert len(losses_j) == TRAJECTORY_STEPS and losses_t[:10].mean() - losses_t[-20:].mean() > 0.02
    report.within(f"{impl}: {TRAJECTORY_STEPS} steps {mode}: max per-step |loss diff|",
                  np.abs(losses_t - losses_j).max(), TRAJECTORY_TOL)


def test_onednn_refuses_right_padding_in_one_line(seed_setup):
    needs_library("onednn")
    refusal = r"^--lstm-impl onednn: it takes no sequence lengths \(--padding right\)"
    with pytest.raises(UnsupportedError, match=refusal):
        flax_module(seed_setup.cfg.replace(lstm_impl="onednn", padding="right"), seed_setup.vocab_size)

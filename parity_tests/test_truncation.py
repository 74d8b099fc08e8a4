"""Truncation semantics. Where the gradient stops (PyTorch: ``detach``; JAX: ``stop_gradient``) and
where it does not, both twins differentiate the same function.

* After a carried state: PyTorch's ``train_step`` detaches the incoming hidden (``repackage_hidden``); JAX's
  loss function puts ``stop_gradient`` on it. To give the stop something to stop, JAX differentiates through
  the previous batch's forward pass too, and PyTorch's hidden still points into that batch's graph.
* No truncation (``--no-detach``): JAX differentiates through both batches' forward passes in one function;
  PyTorch runs both forwards without detaching and calls ``backward()`` once on the second batch's loss.
* ``--tbptt K``: JAX's in-graph ``stop_gradient`` at each chunk boundary vs PyTorch's detached chunks.

Small word corpus written in code: E 8, H 16, T 12, B 8, L 2, dropout 0, no clipping (so PyTorch's
``p.grad`` after its ``train_step`` is the raw gradient). The incoming state matters at T 12.
"""
from __future__ import annotations

from itertools import islice

import jax
import pytest
from torch import nn

from common.batches import batches
from common.data import prepare_data
from common.params import init_params
from parity_tests import report
from parity_tests.conftest import nonzero_carry, small_config
from jax_impl import classifier as jax_classifier
from parity_tests.twins import (flax_params, jax_carry, jax_loss_grad, flax_module, neutral_from_flax,
                                stacked_from_jax, stacked_from_torch, torch_grads, torch_hidden, torch_module,
                                worst_relative_diff, zeros_stacked)
from torch_impl.classifier import to_device, train_step
from torch_impl.step import TrainState, make_optimizer

pytestmark = pytest.mark.slow  # tens of seconds each on a 2-core CPU

# Each parameter's gradient against its own scale, max|Δg| / max|g|: these gradients are 1e-4 to 1e-2, so
# the seed-shape bound 1e-5 × max(1, max|g|) would allow a 1-10% error here and could not tell a truncation
# (which moves some gradients by 2%) from none. Measured agreement: 2-4e-6 relative (float32 rounding
# through 12-24 steps); 1e-4 leaves 25x room.
GRAD_TOL = 1e-4
# Where a check says "this truncation matters", some gradient must move by at least 1% of its scale:
# 100 times GRAD_TOL, so agreement cannot be the accident of a stop that changes nothing.
EFFECT = 1e-2


class Setup:
    def __init__(self, corpus):
        self.cfg = small_config(corpus)
        self.data = prepare_data(self.cfg)
        self.vocab_size = len(self.data.vocab)
        self.neutral = init_params(self.vocab_size, self.cfg.embed_dim, self.cfg.hidden_dim, self.cfg.layers,
                                   seed=self.cfg.seed)
        self.first, self.second = islice(batches(self.data.train, self.cfg.batch_size, shuffle_seed=self.cfg.seed,
                                                 epoch=0), 2)
        self.key = jax.random.key(0)


@pytest.fixture(scope="module")
def setup(small_corpus):
    return Setup(small_corpus)


def jax_two_batch_grads(setup: Setup, detach: bool):
    """JAX: d(loss of the second batch)/d(params), the carry coming out of the first batch's forward pass
    inside the same function, through the twin's ``forward`` and ``make_loss_fn``."""
    cfg = setup.cfg.replace(detach=detach)
    model = flax_module(cfg, setup.vocab_size)
    loss_fn = jax_classifier.make_loss_fn(model, cfg)
    first, second = (jax_classifier.to_device(b) for b in (setup.first, setup.second))

    def two_batches(params):
        _, carry = jax_classifier.forward(model, params, first, jax_carry(zeros_stacked(cfg, setup.first.size)),
                                     setup.key, train=True, use_lengths=False)
        return loss_fn(params, carry, second, setup.key)

    (loss, carry), grads = jax.jit(jax.value_and_grad(two_batches, has_aux=True))(flax_params(setup.neutral))
    return float(loss), neutral_from_flax(grads), stacked_from_jax(carry)


def test_detach_and_stop_gradient_after_a_carried_state_give_the_same_gradients(setup):
    cfg = setup.cfg.replace(detach=True)
    model = torch_module(cfg, setup.neutral, setup.vocab_size)
    model.train()
    tokens, _, _ = to_device(setup.first, model)
    _, hidden = model(tokens, model.init_hidden(setup.first.size))  # still attached to the first batch's graph
    assert hidden[0].grad_fn is not None
    _, new_hidden, loss_t = train_step(TrainState(model, make_optimizer(model, cfg)), hidden, setup.second,
                                       cfg)  # detaches
    grads_t = torch_grads(model)  # clip 0: the raw gradient (the optimizer step does not touch .grad)

    loss_j, grads_j, carry_j = jax_two_batch_grads(setup, detach=True)
    worst, where = worst_relative_diff(grads_t, grads_j)
    report.within(f"truncate at batch (detach | stop_gradient): grads rel., worst {where}", worst, GRAD_TOL)
    report.within("truncate at batch: loss", abs(float(loss_t) - loss_j), 1e-6)  # a few float32 ulps
    new_t = stacked_from_torch(new_hidden)
    report.within("truncate at batch: carry passed on",
                  max(report.max_abs_diff(new_t[i], carry_j[i]) for i in range(2)), 1e-6)  # float32, 24 steps


def test_untruncated_gradient_through_two_batches_agrees(setup):
    model = torch_module(setup.cfg, setup.neutral, setup.vocab_size)
    model.train()
    first_tokens = to_device(setup.first, model)[0]
    tokens, labels, _ = to_device(setup.second, model)
    _, hidden = model(first_tokens, model.init_hidden(setup.first.size))
    probs, _ = model(tokens, hidden)  # no detach: one unbroken graph over both batches
    nn.BCELoss()(probs, labels).backward()
    grads_t = torch_grads(model)

    _, grads_j, _ = jax_two_batch_grads(setup, detach=False)
    _, truncated_j, _ = jax_two_batch_grads(setup, detach=True)
    worst, where = worst_relative_diff(grads_t, grads_j)
    report.within(f"no truncation, through 2 batches: grads rel., worst {where}", worst, GRAD_TOL)
    report.at_least("truncate at batch: changes grads (effect)", worst_relative_diff(grads_j, truncated_j)[0],
                    EFFECT)


@pytest.mark.parametrize("chunk", [5, 4], ids=["K5-of-12-uneven", "K4-of-12-even"])
def test_tbptt_chunk_truncation_gives_the_same_gradients(setup, chunk):
    cfg = setup.cfg.replace(tbptt=chunk)
    carry0 = nonzero_carry(cfg.layers, setup.second.size, cfg.hidden_dim)
    model = torch_module(cfg, setup.neutral, setup.vocab_size)
    state = TrainState(model, make_optimizer(model, cfg))
    train_step(state, torch_hidden(carry0), setup.second, cfg)  # detached chunks
    grads_t = torch_grads(model)

    jax_model = flax_module(cfg, setup.vocab_size)
    args = (flax_params(setup.neutral), jax_carry(carry0), jax_classifier.to_device(setup.second), setup.key)
    grads_j = neutral_from_flax(jax_loss_grad(jax_model, cfg)(*args)[1])  # in-graph stop_gradient per chunk
    whole_j = neutral_from_flax(jax_loss_grad(jax_model, cfg, truncate_chunks=False)(*args)[1])

    worst, where = worst_relative_diff(grads_t, grads_j)
    report.within(f"tbptt {chunk} of T12: grads rel., worst {where}", worst, GRAD_TOL)
    report.at_least(f"tbptt {chunk}: chunk stop changes grads (effect)", worst_relative_diff(grads_j, whole_j)[0],
                    EFFECT)

    # Chunking without truncation is the whole-sequence gradient: PyTorch's plain step (tbptt 0).
    plain = setup.cfg
    model = torch_module(plain, setup.neutral, setup.vocab_size)
    train_step(TrainState(model, make_optimizer(model, plain)), torch_hidden(carry0), setup.second, plain)
    worst, where = worst_relative_diff(torch_grads(model), whole_j)
    report.within(f"tbptt {chunk}, no chunk stop = full BPTT: grads rel.", worst, GRAD_TOL)

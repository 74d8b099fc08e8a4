"""Dropout on, in expectation: the twins' gradients agree in distribution.

The two frameworks draw their dropout masks from different generators, so with dropout on no single step
can match. What must match is the distribution: the expected loss and the expected gradient of every
parameter over the dropout draws, at fixed weights, carry and batch. Each twin's own training loss and
gradient (``torch_impl``: the model in training mode and ``nn.BCELoss``; ``jax_impl``: ``make_loss_fn``, the
function its jitted ``train_step`` differentiates) is averaged over N independent draws, and every element
is compared by its z-score, the difference of the two means over its standard error. A dropout placed on
another tensor, at another rate or with a wrong backward through its mask shifts some expected gradients; a
check below measures that swapping the two rates moves the worst element by well over twice the bound.

Sizes: E 8, H 16, L 2, T 6, B 4, vocabulary 20 (about 4,000 gradient elements); the seed's rates 0.5 and 0.3.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from common.batches import Batch
from common.params import init_params
from jax_impl import classifier as jax_classifier
from parity_tests import report
from parity_tests.configs import SEED_CFG
from parity_tests.twins import (flax_params, jax_carry, neutral_from_flax, torch_hidden, torch_loss_and_grads,
                                torch_module)

pytestmark = pytest.mark.slow  # tens of seconds each on a 2-core CPU

CFG = SEED_CFG.replace(embed_dim=8, hidden_dim=16, layers=2, seq_len=6, batch_size=4, dropout=0.5, fc_dropout=0.3)
VOCAB = 20
DRAWS = 3000
# max |z| over ~4,000 standard normal elements is ~3.9 typically; |z| > 6 has probability 2e-9 per element, under
# 1e-5 over all of them (the draws are seeded, so the verdict is the same on every run).
Z_BOUND = 6.0


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    params = init_params(VOCAB, CFG.embed_dim, CFG.hidden_dim, CFG.layers, seed=0)
    tokens = rng.integers(2, VOCAB, (CFG.batch_size, CFG.seq_len)).astype(np.int64)
    batch = Batch(tokens=tokens, labels=np.array([1, 0, 1, 0], np.float32),
                  lengths=np.full(CFG.batch_size, CFG.seq_len, np.int64))
    shape = (CFG.layers, CFG.batch_size, CFG.hidden_dim)
    carry = (rng.normal(0, 0.5, shape).astype(np.float32), rng.normal(0, 0.5, shape).astype(np.float32))
    return params, batch, carry


def moments(samples: list[dict[str, np.ndarray]]) -> tuple[dict, dict]:
    stacked = {name: np.stack([s[name] for s in samples]) for name in samples[0]}
    return ({n: a.mean(0) for n, a in stacked.items()}, {n: a.var(0, ddof=1) for n, a in stacked.items()})


def torch_moments(setup, cfg=CFG):
    """Mean and variance over DRAWS dropout draws of PyTorch's loss and gradients."""
    params, batch, carry = setup
    model = torch_module(cfg, params, VOCAB)
    samples = []
    for draw in range(DRAWS):
        torch.manual_seed(draw)
        loss, grads = torch_loss_and_grads(model, batch, torch_hidden(carry), cfg)
        samples.append({**grads, "loss": np.array(loss)})
    return moments(samples)


def jax_moments(setup, cfg=CFG):
    """Mean and variance over DRAWS dropout keys of the JAX twin's training loss and gradients."""
    params, batch, carry = setup
    model = jax_classifier.model_from_config(cfg, VOCAB)
    loss_fn = jax_classifier.make_loss_fn(model, cfg)
    device_batch = jax_classifier.to_device(batch)

    def one(key):
        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(flax_params(params), jax_carry(carry),
                                                                     device_batch, key)
        return loss, grads

    keys = jax.random.split(jax.random.key(1), DRAWS)
    losses, grads = jax.jit(jax.vmap(one))(keys)
    mean = jax.tree.map(lambda g: jnp.mean(g, 0), grads)
    var = jax.tree.map(lambda g: jnp.var(g, 0, ddof=1), grads)
    losses = np.asarray(losses, np.float64)
    return ({**neutral_from_flax(mean), "loss": np.array(losses.mean())},
            {**neutral_from_flax(var), "loss": np.array(losses.var(ddof=1))})


def worst_z(a, b) -> tuple[float, str]:
    """max over elements of |mean_a - mean_b| / standard error, and where; elements with no spread on either
    side (a token absent from the batch: gradient exactly 0) must agree to rounding instead."""
    (mean_a, var_a), (mean_b, var_b) = a, b
    worst, where = 0.0, ""
    for name in mean_a:
        diff = np.abs(mean_a[name] - mean_b[name])
        se = np.sqrt((var_a[name] + var_b[name]) / DRAWS)
        spread = se > 1e-12
        assert np.all(diff[~spread] <= 1e-6), f"{name}: an element without spread differs"
        if spread.any():
            z = float((diff[spread] / se[spread]).max())
            if z > worst:
                worst, where = z, name
    return worst, where


@pytest.fixture(scope="module")
def torch_draws(setup):
    return torch_moments(setup)


@pytest.mark.parametrize("lstm_impl", ["fused", "scan"])
def test_expected_loss_and_gradients_with_dropout_agree_between_the_twins(setup, torch_draws, lstm_impl):
    z, where = worst_z(torch_draws, jax_moments(setup, CFG.replace(lstm_impl=lstm_impl)))
    report.within(f"dropout on, E[grad] over {DRAWS} draws: max |z| ({lstm_impl}; at {where})", z, Z_BOUND)


def test_the_expectation_check_sees_a_dropout_on_the_wrong_tensor(setup, torch_draws):
    # The power of the check above: the rates swapped (0.3 between the layers, 0.5 before fc) is caught.
    swapped = CFG.replace(dropout=CFG.fc_dropout, fc_dropout=CFG.dropout)
    z, where = worst_z(torch_draws, jax_moments(setup, swapped))
    report.at_least(f"dropout rates swapped in JAX: max |z| (effect; at {where})", z, 2 * Z_BOUND)

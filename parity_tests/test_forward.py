"""The forward pass at the seed's shapes (B 50, T 200, E 400, H 256, L 2, V 4398 from the real
corpus): PyTorch's probabilities vs sigmoid of JAX's logits, and every layer's final (h, c).

Cases: left padding (the seed) and right padding with masking (PyTorch packs with the lengths, JAX stops the
carry past each length) from a zero carry; and both from a non-zero incoming carry, converted between
PyTorch's (L, B, H) stacks and JAX's per-layer pairs with parity_tests.twins.jax_carry/stacked_from_jax.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from common.batches import Batch
from jax_impl.loss import sigmoid
from parity_tests import report
from parity_tests.conftest import nonzero_carry
from parity_tests.twins import (flax_params, jax_carry, flax_module, stacked_from_jax, stacked_from_torch,
                                torch_hidden, torch_module, zeros_stacked)
from torch_impl.classifier import to_device

# Float32 through 200 time steps and two layers: each side rounds differently (PyTorch's fused gates vs
# XLA's), and the differences do not grow in a contracting LSTM: measured ≤ 7e-7 in (h, c), 6e-8 in the
# probabilities. 1e-5 is the suite's bound, far below any semantic difference (a wrong mask, gate order or
# carry moves these values by 1e-3 to 1e-1, see the "effect" rows).
FORWARD_TOL = 1e-5

# (padding, incoming carry, time steps). At T 200 a left-padded batch has forgotten any incoming carry by its
# last step (the forget gates, about 0.5 at initialisation, multiply it away: measured influence on the final
# states 2e-7, i.e. rounding), so the left-padded carried case reads the batch's last 16 columns, where the
# carry still moves the top layer's final h by 2.5e-3. Right padding ends short texts early: T 200 is fine.
CASES = [("left", "zero", 200), ("right", "zero", 200), ("right", "carried", 200), ("left", "carried", 16)]


@pytest.fixture(scope="module")
def twins(seed_setup):
    cfg = seed_setup.cfg
    torch_model = torch_module(cfg, seed_setup.neutral, seed_setup.vocab_size).eval()
    model = flax_module(cfg, seed_setup.vocab_size)
    apply = jax.jit(lambda p, tokens, carry, lengths: model.apply({"params": p}, tokens, carry, lengths))
    return torch_model, apply, flax_params(seed_setup.neutral)


@pytest.mark.parametrize("padding,start,steps", CASES, ids=[f"{p}-{s}-T{t}" for p, s, t in CASES])
def test_forward_probabilities_and_final_states_agree(seed_setup, twins, padding, start, steps):
    torch_model, apply, params = twins
    cfg, batch = seed_setup.cfg, seed_setup.batch(padding)
    if steps < batch.tokens.shape[1]:
        batch = Batch(batch.tokens[:, -steps:], batch.labels, np.minimum(batch.lengths, steps))
    if padding == "right":
        # The case must exercise the mask: many different lengths, from a few tokens to most of T.
        assert len(np.unique(batch.lengths)) > 20
        assert batch.lengths.min() < cfg.seq_len // 10 and batch.lengths.max() > cfg.seq_len * 3 // 4
    carry0 = zeros_stacked(cfg, batch.size) if start == "zero" else nonzero_carry(cfg.layers, batch.size,
                                                                                  cfg.hidden_dim)

    tokens, _, lengths = to_device(batch, torch_model)
    with torch.no_grad():
        probs_t, hidden_t = torch_model(tokens, torch_hidden(carry0), lengths if padding == "right" else None)
    logits_j, carry_j = apply(params, batch.tokens, jax_carry(carry0),
                              batch.lengths if padding == "right" else None)

    label = f"forward {padding} T{steps}, {'zero' if start == 'zero' else 'non-zero'} carry"
    report.within(f"{label}: P(positive)", report.max_abs_diff(probs_t.numpy(), sigmoid(logits_j)), FORWARD_TOL)
    (h_t, c_t), (h_j, c_j) = stacked_from_torch(hidden_t), stacked_from_jax(carry_j)
    for k in range(cfg.layers):
        diff = max(report.max_abs_diff(h_t[k], h_j[k]), report.max_abs_diff(c_t[k], c_j[k]))
        report.within(f"{label}: layer {k} final (h, c)", diff, FORWARD_TOL)
    if start == "carried":
        # The incoming state must matter for the case to test it: the top layer's final state moves.
        h_zero = stacked_from_jax(apply(params, batch.tokens, jax_carry(zeros_stacked(cfg, batch.size)),
                                        batch.lengths if padding == "right" else None)[1])[0]
        report.at_least(f"{label}: carry moves top h (effect)", np.abs(h_zero[-1] - h_j[-1]).max(), 1e-3)

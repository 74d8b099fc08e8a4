"""Dropout, tested in each twin by its statistics (the masks come from different generators and
cannot be shared): keep rate ≈ 1 - p, kept values scaled by 1/(1 - p), training only, and placement.

The tensor that feeds the second LSTM layer is inside ``nn.LSTM`` in PyTorch, so both twins are observed the
same way, through their public forward pass: layer 1 is made a memoryless probe (input gate and output gate
open, forget gate shut, recurrent weights 0, candidate g = tanh(x / 4)), so its final h is
``tanh(tanh(x_T / 4))`` of exactly the value that entered it at the last step: 0 where dropout dropped it,
``h0_T / (1 - p)`` where it kept it, with ``h0_T`` layer 0's final h (which both twins return). The tensor
that feeds the output layer is observed directly: a forward pre-hook on PyTorch's ``fc``, a Flax method
interceptor on the JAX twin's ``fc`` (the module ``jax_impl.convert`` maps ``fc.weight`` to).
"""
from __future__ import annotations

import math

import flax.linen as flax_nn
import jax
import numpy as np
import pytest
import torch

from common.params import init_params
from parity_tests import report
from parity_tests.configs import SEED_CFG
from parity_tests.twins import flax_params, jax_carry, flax_module, stacked_from_jax, torch_hidden, torch_module

P_BETWEEN, P_FC = 0.5, 0.3  # the seed's rates
# B 2048 × H 32: 65536 Bernoulli draws per keep-rate check (from the last step, or the classifier's input).
CFG = SEED_CFG.replace(embed_dim=8, hidden_dim=32, layers=2, seq_len=4, batch_size=2048)
VOCAB = 20
PROBE_SCALE = 0.25
GATE_OPEN = 30.0  # sigmoid(30) is exactly 1.0 in float32; sigmoid(-30) = 9e-14


def binomial_tolerance(p_drop: float, draws: int) -> float:
    """5 standard deviations of the kept fraction over ``draws`` draws (two-sided: a false alarm about once
    in 1.7 million; the draws are seeded, so the verdict is the same on every run)."""
    return 5 * math.sqrt(p_drop * (1 - p_drop) / draws)


def readable(values: np.ndarray) -> np.ndarray:
    """The elements far enough from 0 that "dropped" (exactly 0) and "kept" (scaled) cannot be confused.
    A handful of LSTM outputs are ~1e-6 by chance; all but those (> 99%) are used."""
    mask = np.abs(values) > 1e-4
    assert mask.mean() > 0.99
    return mask


def probe_params() -> dict[str, np.ndarray]:
    """init_params with layer 1 replaced by the memoryless probe described in the module docstring."""
    params = init_params(VOCAB, CFG.embed_dim, CFG.hidden_dim, CFG.layers, seed=0)
    h = CFG.hidden_dim
    w_ih = np.zeros((4 * h, h), np.float32)
    w_ih[2 * h:3 * h] = PROBE_SCALE * np.eye(h, dtype=np.float32)  # g = tanh(x / 4), one unit per input
    b_ih = np.zeros(4 * h, np.float32)
    b_ih[:h], b_ih[h:2 * h], b_ih[3 * h:] = GATE_OPEN, -GATE_OPEN, GATE_OPEN  # i open, f shut, o open
    params.update({"lstm.weight_ih_l1": w_ih, "lstm.bias_ih_l1": b_ih,
                   "lstm.weight_hh_l1": np.zeros((4 * h, h), np.float32),
                   "lstm.bias_hh_l1": np.zeros(4 * h, np.float32)})
    return params


def probe_input(h1: np.ndarray) -> np.ndarray:
    """The value that entered the probe layer at the last step, from its final h."""
    return np.arctanh(np.arctanh(np.asarray(h1, np.float64))) / PROBE_SCALE


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(2, VOCAB, (CFG.batch_size, CFG.seq_len)).astype(np.int32)


def zeros() -> tuple[np.ndarray, np.ndarray]:
    shape = (CFG.layers, CFG.batch_size, CFG.hidden_dim)
    return np.zeros(shape, np.float32), np.zeros(shape, np.float32)


# ---------------------------------------------------------------- each twin's forward, seen from outside


def torch_forward(params, tokens, dropout, fc_dropout, *, train, seed=0):
    """``(probs (B,), h_n (L, B, H), fc input (B, H))`` of the PyTorch twin."""
    model = torch_module(CFG.replace(dropout=dropout, fc_dropout=fc_dropout), params, VOCAB)
    model.train(train)
    seen = []
    model.fc.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().numpy().copy()))
    torch.manual_seed(seed)
    with torch.no_grad():
        probs, (h_n, _) = model(torch.from_numpy(tokens).long(), torch_hidden(zeros()))
    return probs.numpy(), h_n.numpy().astype(np.float64), seen[0].astype(np.float64)


def jax_forward(params, tokens, dropout, fc_dropout, *, train, seed=0):
    """``(P(positive) (B,), final h (L, B, H), fc input (B, H))`` of the JAX twin."""
    model = flax_module(CFG.replace(dropout=dropout, fc_dropout=fc_dropout), VOCAB)
    seen = []

    def watch_fc(next_fun, args, kwargs, context):
        if context.module.name == "fc" and context.method_name == "__call__":
            seen.append(np.asarray(args[0], np.float64))
        return next_fun(*args, **kwargs)

    with flax_nn.intercept_methods(watch_fc):
        logits, carry = model.apply({"params": flax_params(params)}, tokens, jax_carry(zeros()), None, train=train,
                                    rngs={"dropout": jax.random.key(seed)})
    return np.asarray(jax.nn.sigmoid(logits)), stacked_from_jax(carry)[0], seen[0]


TWINS = {"torch": torch_forward, "jax": jax_forward}


# ---------------------------------------------------------------- the checks


@pytest.mark.parametrize("twin", list(TWINS))
def test_dropout_between_layers_keeps_1_minus_p_scales_kept_values_and_spares_layer_0(twin, tokens):
    forward, params = TWINS[twin], probe_params()
    _, h_train, _ = forward(params, tokens, P_BETWEEN, 0.0, train=True)
    _, h_eval, _ = forward(params, tokens, P_BETWEEN, 0.0, train=False)
    label = f"dropout between layers ({twin}, p {P_BETWEEN})"

    # Placement: layer 0's output is the same in training and evaluation (no dropout on the embedding or
    # inside layer 0); float32 rounding only (training and inference may take different kernels).
    report.within(f"{label}: layer 0 unaffected", report.max_abs_diff(h_train[0], h_eval[0]), 1e-6)
    # In evaluation the probe sees layer 0's output unchanged (the probe's inversion: two float32 tanh).
    report.within(f"{label}: eval passes x unscaled (rel.)",
                  np.max(np.abs(probe_input(h_eval[1]) / h_eval[0] - 1)), 1e-4)

    use = readable(h_train[0])
    h0, entered = h_train[0][use], probe_input(h_train[1])[use]
    kept = np.abs(entered) > 1e-9  # dropped: the probe saw exactly 0 (its h is ~1e-13 from the shut f gate)
    report.within(f"{label}: keep rate - (1-p)", abs(kept.mean() - (1 - P_BETWEEN)),
                  binomial_tolerance(P_BETWEEN, kept.size))
    report.within(f"{label}: kept x = h0/(1-p) (rel.)",
                  np.max(np.abs(entered[kept] / h0[kept] * (1 - P_BETWEEN) - 1)), 1e-4)


@pytest.mark.parametrize("twin", list(TWINS))
def test_dropout_before_the_output_layer_drops_only_the_classifier_input(twin, tokens):
    forward = TWINS[twin]
    params = init_params(VOCAB, CFG.embed_dim, CFG.hidden_dim, CFG.layers, seed=0)
    _, h_train, fc_in = forward(params, tokens, 0.0, P_FC, train=True)
    _, h_eval, fc_eval = forward(params, tokens, 0.0, P_FC, train=False)
    label = f"dropout before fc ({twin}, p {P_FC})"

    # The carried state is not dropped: every layer's final h is the evaluation one (rounding only).
    report.within(f"{label}: carried h unaffected", report.max_abs_diff(h_train, h_eval), 1e-6)
    report.within(f"{label}: eval feeds fc the top h", report.max_abs_diff(fc_eval, h_eval[-1]), 0.0)
    use = readable(h_train[-1])
    top, fc_in = h_train[-1][use], fc_in[use]
    kept = fc_in != 0
    report.within(f"{label}: keep rate - (1-p)", abs(kept.mean() - (1 - P_FC)), binomial_tolerance(P_FC, kept.size))
    # One float32 multiply (PyTorch: x * (mask / (1-p))) or divide (Flax: x / (1-p)): a few ulps.
    report.within(f"{label}: kept x = h/(1-p) (rel.)", np.max(np.abs(fc_in[kept] / top[kept] * (1 - P_FC) - 1)),
                  1e-6)


@pytest.mark.parametrize("twin", list(TWINS))
def test_dropout_acts_in_training_only(twin, tokens):
    forward = TWINS[twin]
    params = init_params(VOCAB, CFG.embed_dim, CFG.hidden_dim, CFG.layers, seed=0)
    eval_a = forward(params, tokens, P_BETWEEN, P_FC, train=False, seed=0)[0]
    eval_b = forward(params, tokens, P_BETWEEN, P_FC, train=False, seed=1)[0]
    no_dropout = forward(params, tokens, 0.0, 0.0, train=False)[0]
    train_a = forward(params, tokens, P_BETWEEN, P_FC, train=True, seed=0)[0]
    train_b = forward(params, tokens, P_BETWEEN, P_FC, train=True, seed=1)[0]
    # Evaluation is deterministic and is the dropout-free model, bit for bit (same ops, no randomness).
    report.within(f"dropout ({twin}): eval = no-dropout model, any seed",
                  max(report.max_abs_diff(eval_a, no_dropout), report.max_abs_diff(eval_b, no_dropout)), 0.0)
    report.at_least(f"dropout ({twin}): training outputs depend on the seed (effect)",
                    report.max_abs_diff(train_a, train_b), 1e-3)

"""bfloat16: each twin's mixed precision against its own float32, and the two against each other. Float32 parity is
rounding; bfloat16 parity is a band, measured here and held with a factor of safety. What each twin computes in
bfloat16 (``common.precision``) was found by replaying PyTorch's autocast exactly (docs/mixed-precision.md); the JAX
scan stack follows it (:class:`jax_impl.recurrences.scan.AutocastLSTMCell`), so one forward pass agrees to a few
float32-level flips of a bfloat16 rounding, and 50 training steps stay within a band a quarter of each twin's own
bfloat16 drift.

Configuration: the trajectory one (real corpus, B 50, T 100, E 32, H 32, L 2, dropout 0), the seed's left padding
(oneDNN's rules in both twins) and right padding (packed: PyTorch's ATen cell, and its rules in JAX).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from common.config import Config
from jax_impl.recurrences import scan
from jax_impl import classifier as jax_classifier
from jax_impl.loss import sigmoid
from jax_impl.numerics import bfloat16_dot, round_to, to_bfloat16
from parity_tests import report
from parity_tests.configs import BFLOAT16_STEPS
from parity_tests.conftest import nonzero_carry
from parity_tests.test_native import needs_library
from parity_tests.twins import (flax_module, flax_params, jax_carry, make_twin, stacked_from_jax, stacked_from_torch,
                                torch_hidden, torch_module, trajectory)
from torch_impl.numerics import autocast, lacks_bfloat16_lstm
from torch_impl.classifier import to_device

CPU = torch.device("cpu")
needs_onednn_bfloat16 = pytest.mark.skipif(lacks_bfloat16_lstm(CPU), reason="this CPU has no oneDNN bfloat16: PyTorch "
                                           "runs its ATen cell for every batch here, and the JAX twin oneDNN's rules")

# One forward pass, same weights, batch and non-zero carry. Measured: every probability equal, and 0.34% of the final
# h and c elements one bfloat16 step apart (float32-level differences in exp and tanh that tip a rounding), the rest
# equal; with packing both keep c and h in float32 and differ by float32 rounding (1.2e-7). Bands: probabilities at
# most one bfloat16 step at 1 (2^-8), and at most 2% of (h, c) elements apart by more than float32 rounding (1e-6
# relative). Carrying c in float32 in one twin (its power row) sets 28% of h and all of c apart.
PROBS_TOL = 2.0 ** -8
SHARE_TOL = 0.02
SHARE_EFFECT = 0.2

# Per-step losses over 50 steps. Measured in the five trajectory modes: each twin's bfloat16 against its own float32
# ≤ 1.0e-3 (the probabilities are rounded to 2^-9 near 0.5, and Adam carries that into the weights); the two twins
# in bfloat16 1.7e-4 to 3.0e-4 (the backward passes round differently: oneDNN's own, JAX's autodiff of the same
# forward), and 3.5e-4 where PyTorch runs the ATen cell for left padding too (a CPU without oneDNN's bfloat16).
# Bands with a factor of about 3: 3e-3 and 1e-3. The loss computed in bfloat16 in one twin (the power row) moves
# the trajectory by 3.4e-3 from the other twin's: it must land beyond twice the twins' band.
DRIFT_BAND = 3e-3
TWIN_BAND = 1e-3


def share_apart(a: np.ndarray, b: np.ndarray) -> float:
    """The share of elements whose difference exceeds float32 rounding (1e-6 relative, 1e-6 absolute below 1)."""
    return float(np.mean(np.abs(a - b) > 1e-6 * np.maximum(1.0, np.abs(a))))


class CellStateInFloat32(scan.AutocastLSTMCell):
    """A deliberate semantic change: oneDNN's cell, but c carried from step to step in float32."""

    @nn.compact
    def __call__(self, state, gates_x):
        h, c = state
        i, f, g, o = jnp.split(gates_x + bfloat16_dot(h, self.w_hh_t, self.precision), 4, axis=-1)
        c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_new = to_bfloat16(jax.nn.sigmoid(o) * jnp.tanh(c_new))
        return (h_new, c_new), h_new


def bce_in_bfloat16(logits, labels):
    """A deliberate semantic change: PyTorch's BCE, every operation rounded to bfloat16, differentiated by JAX."""
    r = lambda x: round_to(x, jnp.bfloat16)  # noqa: E731
    p = r(jax.nn.sigmoid(logits.astype(jnp.float32)))
    return r(jnp.mean(r(r((labels - 1) * r(jnp.maximum(r(jnp.log1p(-p)), -100)))
                        - r(labels * r(jnp.maximum(r(jnp.log(p)), -100))))))


def forward_both(setup, padding, lstm_impl="auto"):
    cfg = setup.cfg.replace(dtype="bfloat16", padding=padding, lstm_impl=lstm_impl)
    batch = setup.batch(padding)
    carry0 = nonzero_carry(cfg.layers, batch.size, cfg.hidden_dim)
    torch_model = torch_module(cfg.replace(lstm_impl="auto"), setup.neutral, setup.vocab_size).eval()
    tokens, _, lengths = to_device(batch, torch_model)
    with torch.no_grad(), autocast(cfg.dtype, CPU):
        probs, hidden = torch_model(tokens, torch_hidden(carry0), lengths if padding == "right" else None)
    model = flax_module(cfg, setup.vocab_size)
    logits, carry = jax.jit(lambda p, t, c, n: model.apply({"params": p}, t, c, n))(
        flax_params(setup.neutral), jnp.asarray(batch.tokens), jax_carry(carry0),
        jnp.asarray(batch.lengths) if padding == "right" else None)
    return (probs.float().numpy(), stacked_from_torch(hidden)), (np.asarray(sigmoid(logits)), stacked_from_jax(carry))


@pytest.mark.parametrize("padding", [pytest.param("left", marks=needs_onednn_bfloat16), "right"])
def test_one_bfloat16_forward_pass_agrees_with_pytorchs_autocast(trajectory_setup, padding):
    (probs_t, states_t), (probs_j, states_j) = forward_both(trajectory_setup, padding)
    rules = "oneDNN" if padding == "left" else "ATen cell"
    report.within(f"bfloat16 forward, {rules}: P(positive)", report.max_abs_diff(probs_t, probs_j), PROBS_TOL)
    report.within(f"bfloat16 forward, {rules}: share of final (h, c) apart",
                  max(share_apart(a, b) for a, b in zip(states_t, states_j)), SHARE_TOL)


@needs_onednn_bfloat16
def test_the_onednn_stack_in_bfloat16_computes_what_pytorchs_autocast_computes_bit_for_bit(trajectory_setup):
    # The same kernel (ATen's mkldnn_rnn_layer) on the same bfloat16 input, weights, biases and carry, and the same
    # classifier rules: measured equal in every probability and every final h and c element.
    needs_library("onednn")
    (probs_t, states_t), (probs_j, states_j) = forward_both(trajectory_setup, "left", "onednn")
    report.within("bfloat16 forward, oneDNN through XLA's FFI: P(positive)", report.max_abs_diff(probs_t, probs_j),
                  0.0)
    report.within("bfloat16 forward, oneDNN through XLA's FFI: final (h, c) of both layers",
                  max(report.max_abs_diff(a, b) for a, b in zip(states_t, states_j)), 0.0)


@needs_onednn_bfloat16
def test_a_float32_cell_state_in_one_twin_falls_outside_the_forward_band(trajectory_setup, monkeypatch):
    monkeypatch.setattr(scan, "AutocastLSTMCell", CellStateInFloat32)
    (_, (h_t, _)), (_, (h_j, _)) = forward_both(trajectory_setup, "left")
    report.at_least("bfloat16 forward, JAX carrying c in float32: share of final h apart (effect)",
                    share_apart(h_t, h_j), SHARE_EFFECT)


@pytest.mark.parametrize("padding, expected", [pytest.param("left", 1.0, marks=needs_onednn_bfloat16),
                                               ("right", 1.0 + 100 * 0.00099945)])
def test_onednn_rounds_the_cell_state_between_steps_and_the_aten_cell_does_not(padding, expected):
    # i and f saturate at 1 and g = tanh(0.001): c = 1 grows by 0.001 a step, below bfloat16's spacing at 1 (2^-7).
    # Carried in bfloat16 it never moves; in float32 it reaches 1 + 100 g after 100 steps (g rounded: 0.00099945).
    # Two texts of different lengths: PyTorch runs a packed batch on oneDNN when all its lengths are equal.
    cfg = Config(embed_dim=1, hidden_dim=1, layers=1, seq_len=100, dropout=0.0, fc_dropout=0.0, dtype="bfloat16",
                 padding=padding)
    zero = np.zeros((4, 1), np.float32)
    neutral = {"embedding.weight": np.zeros((2, 1), np.float32), "lstm.weight_ih_l0": zero, "lstm.weight_hh_l0": zero,
               "lstm.bias_ih_l0": np.array([20.0, 20.0, 0.001, 0.0], np.float32),
               "lstm.bias_hh_l0": np.zeros(4, np.float32), "fc.weight": np.ones((1, 1), np.float32),
               "fc.bias": np.zeros(1, np.float32)}
    tokens, carry0 = np.ones((2, 100), np.int32), (np.zeros((1, 2, 1), np.float32), np.ones((1, 2, 1), np.float32))
    lengths = np.array([100, 99]) if padding == "right" else None
    with torch.no_grad(), autocast("bfloat16", CPU):
        _, (_, c_t) = torch_module(cfg, neutral, 2)(torch.from_numpy(tokens).long(), torch_hidden(carry0),
                                                      None if lengths is None else torch.from_numpy(lengths))
    _, carry = flax_module(cfg, 2).apply({"params": flax_params(neutral)}, jnp.asarray(tokens), jax_carry(carry0),
                                         None if lengths is None else jnp.asarray(lengths))
    # oneDNN: exactly 1; the ATen cell: 1 + 100 g, to float32's rounding over 100 additions (1e-5).
    np.testing.assert_allclose([float(c_t[0, 0, 0]), float(carry[0][1][0, 0])], [expected] * 2, atol=1e-5)


@pytest.fixture(scope="module")
def losses(trajectory_setup, jax_twins):
    """Per-step losses of ``(framework, dtype, padding, lstm_impl)`` over BFLOAT16_STEPS steps, computed once."""
    cache: dict[tuple[str, str, str, str], np.ndarray] = {}

    def get(framework: str, dtype: str, padding: str, lstm_impl: str = "auto") -> np.ndarray:
        key = (framework, dtype, padding, lstm_impl)
        if key not in cache:
            cfg = trajectory_setup.cfg.replace(dtype=dtype, padding=padding, lstm_impl=lstm_impl)
            twin = jax_twins(cfg) if framework == "jax" else make_twin("torch", cfg, trajectory_setup.vocab_size)
            cache[key] = np.array(trajectory(
                twin, cfg, trajectory_setup.data(cfg), trajectory_setup.neutral, BFLOAT16_STEPS)[0])
        return cache[key]

    return get


def max_dloss(a: np.ndarray, b: np.ndarray) -> float:
    assert len(a) == len(b) == BFLOAT16_STEPS
    return float(np.abs(a - b).max())


@pytest.mark.slow
@pytest.mark.parametrize("padding", ["left", "right"])
def test_bfloat16_trajectories_stay_within_their_bands(losses, padding):
    rules = "oneDNN" if padding == "left" else "ATen cell"
    for framework in ("torch", "jax"):
        report.within(f"{BFLOAT16_STEPS} steps, {rules}: {framework} bfloat16 vs its float32, max |loss diff|",
                      max_dloss(losses(framework, "bfloat16", padding), losses(framework, "float32", padding)),
                      DRIFT_BAND)
    report.within(f"{BFLOAT16_STEPS} steps, {rules}: torch vs JAX in bfloat16, max |loss diff|",
                  max_dloss(losses("torch", "bfloat16", padding), losses("jax", "bfloat16", padding)), TWIN_BAND)


@pytest.mark.slow
def test_the_loss_computed_in_bfloat16_in_one_twin_falls_outside_the_twins_band(trajectory_setup, losses, monkeypatch):
    monkeypatch.setattr(jax_classifier, "bce_loss", bce_in_bfloat16)
    cfg = trajectory_setup.cfg.replace(dtype="bfloat16")
    twin = make_twin("jax", cfg, trajectory_setup.vocab_size)  # a twin of its own: it traces the patched loss
    changed = np.array(trajectory(twin, cfg, trajectory_setup.data(cfg), trajectory_setup.neutral, BFLOAT16_STEPS)[0])
    report.at_least(f"{BFLOAT16_STEPS} steps: JAX's loss in bfloat16 vs torch (effect)",
                    max_dloss(changed, losses("torch", "bfloat16", "left")), 2 * TWIN_BAND)


@pytest.mark.slow
@needs_onednn_bfloat16
def test_the_onednn_stacks_bfloat16_trajectory_stays_within_the_bands(losses):
    # Measured: 1.8e-4 from PyTorch's (its LSTM forward equal, the classifier's and the loss's backward rounded as JAX
    # rounds them) and 1.0e-3 from its own float32: the scan stack's bands hold it.
    needs_library("onednn")
    onednn = losses("jax", "bfloat16", "left", "onednn")
    report.within(f"{BFLOAT16_STEPS} steps, oneDNN through XLA's FFI: JAX bfloat16 vs its float32, max |loss diff|",
                  max_dloss(onednn, losses("jax", "float32", "left", "onednn")), DRIFT_BAND)
    report.within(f"{BFLOAT16_STEPS} steps, oneDNN through XLA's FFI: torch vs JAX in bfloat16, max |loss diff|",
                  max_dloss(losses("torch", "bfloat16", "left"), onednn), TWIN_BAND)

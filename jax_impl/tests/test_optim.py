"""Clipping with PyTorch's clip_grad_norm_ formula, then Adam."""
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from common.config import Config
from jax_impl.optim import clip_by_global_norm_torch, clip_coefficient, global_norm_torch, make_optimizer

GRADS = {"a": jnp.array([[3.0, 4.0], [0.0, 12.0]], jnp.float32), "b": jnp.array([84.0], jnp.float32)}
NORM = np.sqrt(9 + 16 + 144 + 84 ** 2)  # = 85


def test_global_norm_is_the_norm_of_all_gradients():
    assert float(global_norm_torch(GRADS)) == pytest.approx(NORM, rel=1e-7)


@pytest.mark.parametrize("max_norm", [5.0, 85.0, 1000.0])
def test_clip_multiplies_by_min_one_max_norm_over_norm_plus_eps(max_norm):
    expected_coef = min(1.0, max_norm / (NORM + 1e-6))  # hand computation of PyTorch's formula
    assert float(clip_coefficient(GRADS, max_norm)) == pytest.approx(expected_coef, rel=1e-7)
    tx = clip_by_global_norm_torch(max_norm)
    clipped, _ = tx.update(GRADS, tx.init(GRADS))
    for name in GRADS:
        np.testing.assert_allclose(np.asarray(clipped[name]), np.asarray(GRADS[name]) * expected_coef, rtol=1e-6)


def test_at_exactly_max_norm_the_coefficient_is_just_below_one():
    # PyTorch always multiplies: at norm == max_norm the factor is 85 / (85 + 1e-6), not 1 (optax would skip).
    assert float(clip_coefficient(GRADS, 85.0)) == pytest.approx(85.0 / (85.0 + 1e-6), rel=1e-7)


def test_clip_zero_means_adam_alone():
    params = {"w": jnp.array([1.0, -2.0], jnp.float32)}
    grads = {"w": jnp.array([1000.0, -0.001], jnp.float32)}
    tx = make_optimizer(Config(clip=0.0, lr=0.01))
    updates, _ = tx.update(grads, tx.init(params), params)
    # Adam's first step is -lr * g/|g| (bias-corrected m/sqrt(v) = sign(g)) up to eps: 1e-8 / 1e-3 relative.
    np.testing.assert_allclose(np.asarray(updates["w"]), [-0.01, 0.01], rtol=2e-5)


def test_optimizer_clips_before_adam():
    params = {"w": jnp.array([1.0, -2.0], jnp.float32)}
    grads = {"w": jnp.array([3.0, 4.0], jnp.float32)}  # norm 5
    tx = make_optimizer(Config(clip=1.0, lr=0.1))
    state = tx.init(params)
    _, state = tx.update(grads, state, params)
    mu = [s for s in optax.tree_utils.tree_get_all_with_path(state, "mu")][0][1]
    # Adam's first moment after one step is (1 - 0.9) * clipped g, with g clipped to norm 1: (0.6, 0.8).
    np.testing.assert_allclose(np.asarray(mu["w"]), [0.06, 0.08], rtol=1e-5)


def test_adam_first_moment_scales_by_one_minus_beta1_rounded_as_pytorch():
    # PyTorch's lerp weight is the Python float 1 - 0.9 rounded once to float32; a float32 β1 would give
    # 1 - float32(0.9) = 0.100000024 instead, 2.4e-7 apart in every moment.
    params = {"w": jnp.array([1.0, -2.0], jnp.float32)}
    grads = {"w": jnp.array([3.0, 4.0], jnp.float32)}
    tx = make_optimizer(Config(clip=0.0, lr=0.1))
    _, state = tx.update(grads, tx.init(params), params)
    mu = optax.tree_utils.tree_get(state, "mu")
    np.testing.assert_array_equal(np.asarray(mu["w"]), np.float32(1 - 0.9) * np.asarray(grads["w"]))
    assert set(optax.tree_utils.tree_get(state, "hyperparams")) == {"learning_rate"}

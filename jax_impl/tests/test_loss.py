"""The loss has PyTorch BCELoss semantics: clamped logs forward, PyTorch's own gradient formula backward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_impl.loss import bce_loss, bce_per_example, predictions

grad_of_loss = jax.jit(jax.grad(bce_loss))


@pytest.mark.parametrize("logit, label, loss, grad_times_n", [
    (20.0, 0.0, 100.0, 0.0),     # p rounds to 1.0: log1p(-1) = -inf is clamped; PyTorch's gradient is 0
    (20.0, 1.0, 0.0, 0.0),
    (-20.0, 1.0, 20.0, -1.0),    # p = 2.06e-9 is representable: loss -log(p) = 20, gradient p - 1
    (-20.0, 0.0, 2.06e-9, 2.06e-9),
    (120.0, 0.0, 100.0, 0.0),
    (120.0, 1.0, 0.0, 0.0),
    (-120.0, 1.0, 100.0, 0.0),   # p underflows to 0: log(0) clamped at -100, gradient 0 (not NaN)
    (-120.0, 0.0, 0.0, 0.0),
])
def test_saturated_logits_give_pytorch_loss_and_finite_gradient(logit, label, loss, grad_times_n):
    # A batch of 4 copies: the mean is the per-example value and the gradient is divided by N = 4.
    logits = jnp.full((4,), logit, jnp.float32)
    labels = jnp.full((4,), label, jnp.float32)
    value = float(bce_loss(logits, labels))
    grads = np.asarray(grad_of_loss(logits, labels))
    assert np.all(np.isfinite(grads))
    # float32 rounding of log/sigmoid: relative 1e-5, and 1e-9 absolute for the tiny values.
    assert value == pytest.approx(loss, rel=1e-5, abs=1e-9)
    np.testing.assert_allclose(grads, grad_times_n / 4, rtol=1e-5, atol=1e-9)


def test_gradient_is_p_minus_y_over_n_away_from_saturation():
    logits = jnp.array([-3.0, -0.5, 0.0, 0.7, 2.5], jnp.float32)
    labels = jnp.array([1.0, 0.0, 1.0, 1.0, 0.0], jnp.float32)
    p = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
    expected = (p - np.asarray(labels)) / 5
    # PyTorch's formula divides by p(1-p) and multiplies by it again: equal to (p - y)/N up to float32 rounding.
    np.testing.assert_allclose(np.asarray(grad_of_loss(logits, labels)), expected, rtol=1e-5, atol=1e-7)


def test_loss_matches_the_textbook_formula_in_float64_terms():
    logits = jnp.array([-3.0, -0.5, 0.0, 0.7, 2.5], jnp.float32)
    labels = jnp.array([1.0, 0.0, 1.0, 1.0, 0.0], jnp.float32)
    p = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
    y = np.asarray(labels, np.float64)
    expected = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    np.testing.assert_allclose(np.asarray(bce_per_example(logits, labels)), expected, rtol=1e-6)
    assert float(bce_loss(logits, labels)) == pytest.approx(expected.mean(), rel=1e-6)


def test_predictions_round_sigmoid_with_half_going_to_zero():
    # round(sigmoid(z)) as the seed does: exactly 0.5 (z = 0) rounds to even, i.e. negative.
    logits = jnp.array([-1.0, 0.0, 1e-9, 0.01, 3.0], jnp.float32)
    assert np.asarray(predictions(logits)).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]

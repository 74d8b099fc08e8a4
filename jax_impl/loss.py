"""The two workloads' losses. The classifier's: binary cross-entropy of ``sigmoid(logit)`` with PyTorch ``BCELoss``
semantics, forward and backward. The language model's: :func:`cross_entropy`, ``nn.CrossEntropyLoss``'s.

PyTorch computes ``p = sigmoid(z)`` in the compute dtype, then
``loss = (y - 1) * max(log1p(-p), -100) - y * max(log(p), -100)`` (mean over the batch), and differentiates
it with its own formula, not by autodiff of the clamped logs:

    dL/dp = (p - y) / max((1 - p) * p, 1e-12) / N        (binary_cross_entropy_backward, mean)
    dL/dz = dL/dp * (1 - p) * p                          (sigmoid_backward)

So a saturated logit has a finite loss (at most 100) and a finite gradient: at z = 20, p rounds to 1.0 in
float32, and for y = 0 the loss is 100 with gradient 0 (PyTorch's answer, which the seed trains with).
Autodiff of the same forward would give NaN there (0 * inf), hence the ``jax.custom_vjp``.

Under bfloat16 the logits are bfloat16 (autocast's Linear) and PyTorch's recipe computes the loss in float32 on the
bfloat16 probabilities: ``p`` is rounded to bfloat16, the rest is float32, and the backward rounds dL/dp (the cast's
backward) and dL/dz (bfloat16's ``sigmoid_backward``) to bfloat16 once each.
"""
import jax
import jax.numpy as jnp
import optax

from jax_impl.numerics import round_to

LOG_CLAMP = -100.0  # PyTorch clamps each log at -100
GRAD_EPS = 1e-12  # PyTorch's EPSILON in binary_cross_entropy_backward


def sigmoid(logits: jax.Array) -> jax.Array:
    """P(positive) in the logits' precision, in the loss's dtype (float32 or wider): computed in that dtype and rounded
    once to the logits' (PyTorch's sigmoid of bfloat16 logits)."""
    wide = jnp.promote_types(logits.dtype, jnp.float32)
    return round_to(jax.nn.sigmoid(logits.astype(wide)), logits.dtype)


def bce_per_example(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """(B,) losses, PyTorch's forward (no gradient rule attached: use for evaluation)."""
    p = sigmoid(logits)
    y = labels.astype(p.dtype)
    return (y - 1) * jnp.maximum(jnp.log1p(-p), LOG_CLAMP) - y * jnp.maximum(jnp.log(p), LOG_CLAMP)


@jax.custom_vjp
def bce_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Scalar mean BCE of ``sigmoid(logits (B,))`` against ``labels (B,)`` (1 positive, 0 negative)."""
    return jnp.mean(bce_per_example(logits, labels))


def _bce_forward(logits: jax.Array, labels: jax.Array):
    return jnp.mean(bce_per_example(logits, labels)), (sigmoid(logits).astype(logits.dtype), labels)


def _bce_backward(residuals, g: jax.Array):
    p_logits, labels = residuals  # P(positive) in the logits' dtype
    p = p_logits.astype(jnp.promote_types(p_logits.dtype, jnp.float32))
    y = labels.astype(p.dtype)
    # The same operations in the same order as PyTorch's two backward kernels, so the rounding matches too.
    grad_p = g * (p - y) / jnp.maximum((1 - p) * p, jnp.asarray(GRAD_EPS, p.dtype)) / p.shape[0]
    grad_z = round_to(round_to(grad_p, p_logits.dtype) * (1 - p) * p, p_logits.dtype)
    return grad_z.astype(p_logits.dtype), jnp.zeros_like(labels)


bce_loss.defvjp(_bce_forward, _bce_backward)


def predictions(logits: jax.Array) -> jax.Array:
    """(B,) 0/1 labels by the project's one rule (``common.predict.is_positive``): 1 iff sigmoid(z) > 0.5, which
    is the seed's ``round(sigmoid(z))`` (0.5 rounds to even, 0)."""
    return (sigmoid(logits) > 0.5).astype(logits.dtype)


def bce_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(loss_sum, correct)`` of ``logits`` (B,) over the rows whose ``weights`` (B,) are > 0: the BCE sum and the
    number of right predictions."""
    real = weights > 0
    losses = jnp.where(real, bce_per_example(logits, labels), 0)
    correct = jnp.where(real, predictions(logits) == labels.astype(logits.dtype), False)
    return jnp.sum(losses), jnp.sum(correct.astype(jnp.int32))


def cross_entropy(logits: jax.Array, targets: jax.Array, reduction: str = "mean") -> jax.Array:
    """``nn.CrossEntropyLoss`` of ``logits`` (..., V) against integer ``targets`` (...), the log-softmax in float32
    or wider: the ``"mean"`` over every target (perplexity = exp of it), or their ``"sum"``."""
    wide = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    losses = optax.softmax_cross_entropy_with_integer_labels(wide, targets)
    return losses.sum() if reduction == "sum" else losses.mean()

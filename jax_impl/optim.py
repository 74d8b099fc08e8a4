"""The optimizer: PyTorch's ``clip_grad_norm_`` formula, then PyTorch's Adam (betas 0.9, 0.999, eps 1e-8 outside the
sqrt) or plain SGD, its learning rate a hyperparameter in the state (``--lr-decay`` changes it between steps:
:func:`set_lr`).

``optax.clip_by_global_norm`` is not used: it scales by ``max_norm / norm`` only when ``norm > max_norm``,
while PyTorch always multiplies by ``min(1, max_norm / (norm + 1e-6))``. The difference is small but it is
a different function, and this project's point is to train the same one.
"""
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

TORCH_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ adds it to the norm


def global_norm_torch(grads: Any) -> jax.Array:
    """‖all grads‖₂ computed as PyTorch does: the 2-norm of the per-tensor 2-norms."""
    return jnp.linalg.norm(jnp.stack([jnp.linalg.norm(g.ravel()) for g in jax.tree_util.tree_leaves(grads)]))


def clip_coefficient(grads: Any, max_norm: float) -> jax.Array:
    """``min(1, max_norm / (‖grads‖₂ + 1e-6))``: what every gradient is multiplied by."""
    total = global_norm_torch(grads)
    return jnp.minimum(max_norm / (total + TORCH_CLIP_EPS), 1.0).astype(total.dtype)


def clip_by_global_norm_torch(max_norm: float) -> optax.GradientTransformation:
    """An optax transformation with PyTorch's ``clip_grad_norm_`` semantics (always multiplies)."""

    def scale(updates: Any, params: Any = None) -> Any:
        coef = clip_coefficient(updates, max_norm)
        return jax.tree_util.tree_map(lambda g: g * coef.astype(g.dtype), updates)

    return optax.stateless(scale)


class AdamState(NamedTuple):
    """:func:`adam_torch`'s state: the steps taken, and the first and second moments (the parameters' tree)."""

    count: jax.Array
    mu: Any
    nu: Any


def adam_torch(learning_rate: Any, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
               ) -> optax.GradientTransformation:
    """PyTorch's single-tensor Adam, operation for operation: ``m ← m + (1 - β1)(g - m)`` (its lerp),
    ``v ← v β2 + ((1 - β2) g) g`` (mul then addcmul), and the step
    ``(-lr / (1 - β1^t)) m / (√v / √(1 - β2^t) + eps)`` (addcdiv), in the parameters' dtype.

    ``optax.adam`` is not used: it computes ``1 - β2^t`` from a float32 ``β2``, which at t = 1 is 0.00099998713,
    1.3e-5 from the 0.001 PyTorch computes in float64, while its moment adds ``(1 - β2) g²`` with the 0.001: a bias
    that moves the trajectories apart step by step (docs/performance.md's log). Here ``1 - β^t = -expm1(t log β)``,
    with ``log β`` a float64 constant: no cancellation, within an ulp or two of PyTorch's float64 value rounded."""
    log_b1, log_b2 = math.log(b1), math.log(b2)

    def init(params):
        zeros = lambda: jax.tree_util.tree_map(jnp.zeros_like, params)  # noqa: E731
        return AdamState(jnp.zeros([], jnp.int32), zeros(), zeros())

    def update(grads, state, params=None):
        count = optax.safe_increment(state.count)
        mu = jax.tree_util.tree_map(lambda m, g: m + (1 - b1) * (g - m), state.mu, grads)
        nu = jax.tree_util.tree_map(lambda v, g: v * b2 + (1 - b2) * g * g, state.nu, grads)
        t = count.astype(jnp.asarray(learning_rate).dtype)
        step = learning_rate / -jnp.expm1(t * log_b1)
        correction2 = jnp.sqrt(-jnp.expm1(t * log_b2))
        updates = jax.tree_util.tree_map(
            lambda m, v: (-step.astype(m.dtype) * m) / (jnp.sqrt(v) / correction2.astype(v.dtype) + eps), mu, nu)
        return updates, AdamState(count, mu, nu)

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg) -> optax.GradientTransformation:
    """Clip at ``cfg.clip`` (skipped when 0), then ``--optimizer``: Adam as PyTorch computes it (:func:`adam_torch`)
    or SGD (``-lr * g``), at ``cfg.lr`` held in the state in the parameters' dtype (``--lr-decay``: :func:`set_lr`)."""
    clip = [clip_by_global_norm_torch(cfg.clip)] if cfg.clip else []

    # The rule takes the learning rate alone: inject_hyperparams turns every numeric argument it sees into an array.
    def rule(learning_rate):
        return optax.sgd(learning_rate) if cfg.optimizer == "sgd" else adam_torch(learning_rate)

    dtype = jnp.float64 if cfg.dtype == "float64" else jnp.float32
    return optax.chain(*clip, optax.inject_hyperparams(rule, hyperparam_dtype=dtype)(learning_rate=cfg.lr))


def set_lr(opt_state: Any, lr: float) -> Any:
    """``opt_state`` (:func:`make_optimizer`'s) stepping at ``lr`` from now on, the array in the old one's dtype and
    placement (a jitted step sees the same kind of argument, and does not compile again)."""
    old = optax.tree_utils.tree_get(opt_state, "learning_rate")
    new = jax.device_put(jnp.asarray(lr, old.dtype), old.sharding)
    return optax.tree_utils.tree_set(opt_state, learning_rate=new)

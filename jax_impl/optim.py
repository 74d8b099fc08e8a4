"""The optimizer: PyTorch's ``clip_grad_norm_`` formula, then Adam (betas 0.9, 0.999, eps 1e-8 outside the sqrt) or
plain SGD, its learning rate a hyperparameter in the state (``--lr-decay`` changes it between steps: :func:`set_lr`).

``optax.clip_by_global_norm`` is not used: it scales by ``max_norm / norm`` only when ``norm > max_norm``,
while PyTorch always multiplies by ``min(1, max_norm / (norm + 1e-6))``. The difference is small but it is
a different function, and this project's point is to train the same one.
"""
from typing import Any

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


def make_optimizer(cfg) -> optax.GradientTransformation:
    """Clip at ``cfg.clip`` (skipped when 0), then ``--optimizer``: Adam (bias-corrected, eps outside the sqrt) or SGD
    (``-lr * g``), at ``cfg.lr`` held in the state in the parameters' dtype. Betas and eps stay Python floats (as
    hyperparameter arrays, ``1 - b1`` would round differently from PyTorch's)."""
    clip = [clip_by_global_norm_torch(cfg.clip)] if cfg.clip else []

    # The rule takes the learning rate alone: inject_hyperparams turns every numeric argument it sees, a
    # partial's defaults included, into a float32 array.
    def rule(learning_rate):
        if cfg.optimizer == "sgd":
            return optax.sgd(learning_rate)
        return optax.adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8)

    dtype = jnp.float64 if cfg.dtype == "float64" else jnp.float32
    return optax.chain(*clip, optax.inject_hyperparams(rule, hyperparam_dtype=dtype)(learning_rate=cfg.lr))


def set_lr(opt_state: Any, lr: float) -> Any:
    """``opt_state`` (:func:`make_optimizer`'s) stepping at ``lr`` from now on, the array in the old one's dtype and
    placement (a jitted step sees the same kind of argument, and does not compile again)."""
    old = optax.tree_utils.tree_get(opt_state, "learning_rate")
    new = jax.device_put(jnp.asarray(lr, old.dtype), old.sharding)
    return optax.tree_utils.tree_set(opt_state, learning_rate=new)

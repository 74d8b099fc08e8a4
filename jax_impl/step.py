"""The JAX twin's step machinery, the same for every workload: the training state, the update (PyTorch's clipping,
Adam or SGD, --skip-nonfinite) and the jitted training step over a workload's loss (:mod:`jax_impl.classifier`,
:mod:`jax_impl.lm`).

    state, carry, metrics = train_step(state, carry, batch, key)   # make_train_step(loss_fn, cfg); state donated

Everything random comes from keys: the dropout key of a step is ``fold_in(key(cfg.seed), state.step)``.
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from common.config import Config
from common.errors import ConfigError
from jax_impl.convert import to_flax
from jax_impl.distributed import Where
from jax_impl.numerics import Carry, compute_dtype, param_dtype_for
from jax_impl.optim import global_norm_torch, make_optimizer


class TrainState(struct.PyTreeNode):
    """``params`` (Flax pytree), ``opt_state`` (optax, the learning rate in it), ``step`` (int32 scalar: steps taken,
    skipped included)."""

    params: Any
    opt_state: Any
    step: jax.Array


class StepMetrics(struct.PyTreeNode):
    """Per step: ``loss`` (the batch's mean loss before the update), ``finite`` (the loss and the gradient;
    when False and --skip-nonfinite, the update was not applied)."""

    loss: jax.Array
    finite: jax.Array


def resolve_device(name: str) -> jax.Device:
    """``--device`` → a JAX device: auto (JAX's default backend: an accelerator when present), cpu, gpu
    (alias cuda) or tpu. A platform JAX cannot see is a :class:`ConfigError`."""
    platform = {"auto": None, "cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "tpu": "tpu"}[name]
    try:
        # This process's first device (on several hosts, jax.devices()[0] belongs to process 0).
        return jax.local_devices(backend=platform)[0] if platform else jax.local_devices()[0]
    except RuntimeError:
        seen = ", ".join(sorted({d.platform for d in jax.devices()}))
        raise ConfigError(f"--device {name}: JAX sees no {platform} device here (it sees: {seen}); "
                          f"install the matching jax build or use --device cpu") from None


def resolve_dtype(name: str) -> Any:
    """``--dtype`` → the compute dtype; float64 refused (ConfigError) where JAX's x64 mode is off: a program switches
    it on where it starts, before any array (:func:`jax_impl.numerics.compute_dtype`)."""
    return compute_dtype(name)


def create_train_state(model: Any, cfg: Config, neutral_params: dict[str, np.ndarray],
                       device: Where | None = None, convert: Callable[..., Any] = to_flax) -> TrainState:
    """The starting state from neutral parameters (common.params.init_params or a checkpoint; ``convert``: the
    workload's neutral → Flax tree): float32 params (float64 under --dtype float64), a fresh optimizer state,
    step 0."""
    params = jax.device_put(convert(neutral_params, dtype=param_dtype_for(model.dtype)), device)
    state = TrainState(params=params, opt_state=make_optimizer(cfg).init(params), step=np.int32(0))
    # One committed placement for all of it: jit compiles again when an argument switches between committed and
    # uncommitted placement.
    return jax.device_put(state, device)


def make_update(cfg: Config) -> Callable[..., tuple[TrainState, Carry, StepMetrics]]:
    """The step's optimizer part, ``update(state, grads, loss, carry, new_carry) -> (state, carry, metrics)``:
    PyTorch's clipping and Adam (:func:`jax_impl.optim.make_optimizer`), and under --skip-nonfinite a non-finite
    step that leaves params, optimizer state and carry as they were (decided on the device)."""
    tx = make_optimizer(cfg)

    def update(state: TrainState, grads: Any, loss: jax.Array, carry: Carry, new_carry: Carry
               ) -> tuple[TrainState, Carry, StepMetrics]:
        finite = jnp.isfinite(loss) & jnp.isfinite(global_norm_torch(grads))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if cfg.skip_nonfinite:
            new, old = (params, opt_state, new_carry), (state.params, state.opt_state, carry)
            params, opt_state, new_carry = jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)
        return TrainState(params=params, opt_state=opt_state, step=state.step + 1), new_carry, StepMetrics(loss, finite)

    return update


def make_train_step(loss_fn: Callable[[Any, Any, Any, jax.Array], tuple[jax.Array, Any]], cfg: Config
                    ) -> Callable[[TrainState, Any, Any, jax.Array], tuple[TrainState, Any, StepMetrics]]:
    """The jitted pure step ``train_step(state, carry, batch, key) -> (state, carry, metrics)`` of a workload's
    ``loss_fn(params, carry, batch, dropout_key) -> (loss, new carry)``; ``state`` is donated. ``key`` is the run's
    base key; the step's dropout key is ``fold_in(key, state.step)``."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    update = make_update(cfg)

    def train_step(state: TrainState, carry: Carry, batch: Any, key: jax.Array
                   ) -> tuple[TrainState, Carry, StepMetrics]:
        (loss, new_carry), grads = grad_fn(state.params, carry, batch, jax.random.fold_in(key, state.step))
        return update(state, grads, loss, carry, new_carry)

    return jax.jit(train_step, donate_argnums=(0,))

"""The JAX twin's language-model steps, the pure functions jit compiles:

    state, carry, metrics = train_step(state, carry, window, key)   # jitted, state donated
    carry, loss_sum       = eval_step(params, carry, window)        # jitted, dropout off, the carry goes on

The carry crosses from window to window as a value; ``jax.lax.stop_gradient`` on it at the window's start is the
example's ``repackage_hidden`` (in JAX it changes no parameter gradient: the incoming carry is an input, not a graph
reaching into the previous window). Everything else of a step (clipping, SGD or Adam, --skip-nonfinite) is the
classifier's (:func:`jax_impl.step.jit_train_step`).
"""
from typing import Any, Callable

import jax
import numpy as np
import optax

from common.config import Config
from common.workloads import Window
from jax_impl.distributed import Where
from jax_impl.lm_model import LMCarry, RNNModel, cross_entropy
from jax_impl.step import StepMetrics, TrainState, jit_train_step

DeviceWindow = dict[str, jax.Array]  # "inputs" (t, B) int32, "targets" (t, B) int32


def window_to_device(window: Window, device: Where | None = None) -> DeviceWindow:
    """A numpy :class:`common.workloads.Window` on ``device`` (default: JAX's default device)."""
    return {"inputs": jax.device_put(np.asarray(window.inputs, np.int32), device),
            "targets": jax.device_put(np.asarray(window.targets, np.int32), device)}


def make_lm_loss_fn(model: RNNModel, cfg: Config) -> Callable[[Any, LMCarry, DeviceWindow, jax.Array],
                                                              tuple[jax.Array, LMCarry]]:
    """``loss_fn(params, carry, window, dropout_key) -> (mean cross-entropy per token, new carry)``, training mode."""
    def loss_fn(params: Any, carry: LMCarry, window: DeviceWindow, dropout_key: jax.Array
                ) -> tuple[jax.Array, LMCarry]:
        if cfg.detach:
            carry = jax.lax.stop_gradient(carry)  # repackage_hidden
        logits, new_carry = model.apply({"params": params}, window["inputs"], carry, train=True,
                                        rngs={"dropout": dropout_key})
        return cross_entropy(logits, window["targets"]), new_carry

    return loss_fn


def make_lm_train_step(model: RNNModel, cfg: Config
                       ) -> Callable[[TrainState, LMCarry, DeviceWindow, jax.Array], tuple[TrainState, LMCarry,
                                                                                           StepMetrics]]:
    """The language model's jitted pure step ``train_step(state, carry, window, key)``."""
    return jit_train_step(make_lm_loss_fn(model, cfg), cfg)


def make_lm_eval_step(model: RNNModel) -> Callable[[Any, LMCarry, DeviceWindow], tuple[LMCarry, jax.Array]]:
    """The jitted ``eval_step(params, carry, window) -> (carry, sum of the cross-entropy over the window's t·B
    tokens)``, dropout off (the log-softmax in float32 or wider)."""
    def eval_step(params: Any, carry: LMCarry, window: DeviceWindow) -> tuple[LMCarry, jax.Array]:
        logits, carry = model.apply({"params": params}, window["inputs"], carry, train=False)
        wide = logits.astype(jax.numpy.promote_types(logits.dtype, jax.numpy.float32))
        return carry, optax.softmax_cross_entropy_with_integer_labels(wide, window["targets"]).sum()

    return jax.jit(eval_step)

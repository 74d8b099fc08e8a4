"""Both twins side by side: what parity needs beyond the Twin protocol, and no copy of either twin's code.

Every comparison starts both twins from one neutral parameter set (``common.params.init_params``) and feeds them the
same ``common.batches`` in the same order. Trajectories step the twins the trainers build (``twin_maker``) through
``common.loop.train_steps``, the loop's own driver, so a trajectory here is the CLI's trajectory without the
evaluation passes. The rest converts between the frameworks' containers (PyTorch's (L, B, H) stacks, JAX's per-layer
pairs, float64 numpy) and calls the twins' public model and step functions.
"""
from __future__ import annotations

from itertools import islice
from typing import Any, Callable

import jax
import numpy as np
import torch
from torch import nn

from common.batches import Batch
from common.config import Config
from common.loop import Twin, train_steps
from common.params import Params
from jax_impl import convert
from jax_impl import classifier as jax_classifier
from jax_impl import model as jax_model
from jax_impl import train as jax_train
from torch_impl import classifier as torch_classifier
from torch_impl import model as torch_model
from torch_impl import numerics as torch_numerics
from torch_impl import step as torch_step
from torch_impl import train as torch_train

Stacked = tuple[np.ndarray, np.ndarray]  # PyTorch's (h, c), each (L, B, H), as numpy


# ---------------------------------------------------------------- the twins, and each framework's model


def make_twin(framework: str, cfg: Config, vocab_size: int) -> Twin:
    """The twin ``python -m {framework}_impl.train`` would build for ``cfg`` (device, dtype and numerics included)."""
    with (torch_train if framework == "torch" else jax_train).twin_maker(cfg) as make:
        return make(cfg, vocab_size)


def trajectory(twin: Twin, cfg: Config, data, neutral: Params, steps: int) -> tuple[list[float], Any]:
    """``(per-step losses, final state)`` of ``twin`` from ``neutral`` over the first ``steps`` training batches of
    ``data``, stepped by ``common.loop.train_steps``: the loop's order and its carry policy."""
    losses, state = [], twin.init_state(neutral)
    for s in islice(train_steps(twin, state, data.train, cfg), steps):
        losses.append(s.loss)
        state = s.state
    return losses, state


def torch_module(cfg: Config, neutral: Params, vocab_size: int, device: str = "cpu") -> torch_model.SentimentRNN:
    """PyTorch's ``SentimentRNN`` for ``cfg`` holding exactly ``neutral``, in ``cfg.dtype`` on ``device``."""
    model = torch_classifier.model_from_config(cfg, vocab_size)
    torch_model.load_params(model, neutral)
    return model.to(device=device, dtype=torch_numerics.resolve_dtype(cfg.dtype))


def flax_module(cfg: Config, vocab_size: int) -> jax_model.SentimentRNN:
    return jax_classifier.model_from_config(cfg, vocab_size)


def flax_params(neutral: Params, device: Any = None) -> dict:
    """The Flax params pytree of ``neutral`` (float32) as device arrays."""
    return jax.device_put(convert.to_flax(neutral), device)


# ---------------------------------------------------------------- carries


def torch_hidden(stacked: Stacked, dtype=torch.float32, device: str = "cpu"):
    """(h, c) numpy stacks (L, B, H) → PyTorch's hidden tuple."""
    return tuple(torch.tensor(np.asarray(a), dtype=dtype, device=device) for a in stacked)


def jax_carry(stacked: Stacked, device: Any = None):
    """(h, c) numpy stacks (L, B, H) → the JAX twin's carry, a tuple of L pairs ``(h, c)``, each (B, H)."""
    h, c = stacked
    return jax.device_put(tuple((np.array(h[k]), np.array(c[k])) for k in range(np.shape(h)[0])), device)


def stacked_from_torch(hidden) -> Stacked:
    return tuple(t.detach().cpu().double().numpy() for t in hidden)


def stacked_from_jax(carry) -> Stacked:
    """The JAX twin's carry as PyTorch's (h, c) stacks, each (L, B, H), in float64."""
    carry = jax.device_get(carry)
    return tuple(np.stack([np.asarray(layer[i], np.float64) for layer in carry]) for i in (0, 1))


# ---------------------------------------------------------------- gradients


def torch_grads(model: nn.Module) -> Params:
    """Every parameter's ``.grad`` under the state-dict names, as float64 numpy."""
    return {name: p.grad.detach().cpu().double().numpy() for name, p in model.named_parameters()}


def torch_loss_and_grads(model: nn.Module, batch: Batch, hidden, cfg: Config) -> tuple[float, Params]:
    """The PyTorch twin's loss and every parameter's gradient (``torch_impl.step.forward``, then ``backward``), from
    ``hidden`` (a leaf: nothing flows back into it), in training mode (callers set dropout to 0)."""
    loss, _, _ = torch_classifier.forward(model, hidden, batch, cfg)
    torch_step.backward(model, loss)
    return float(loss.detach()), torch_grads(model)


def neutral_from_flax(tree: Any) -> Params:
    """A Flax-layout float32 pytree (parameters or gradients) under the neutral names and layouts
    (``jax_impl.convert.from_flax``: transposes only, exact for float32), as float64 numpy."""
    return {name: a.astype(np.float64) for name, a in convert.from_flax(jax.device_get(tree)).items()}


def worst_scaled_diff(a: Params, b: Params) -> tuple[float, str]:
    """max over parameters of ``max|a - b| / max(1, max|a|)``, and the parameter where it is reached."""
    worst, where = -1.0, ""
    for name in a:
        x, y = np.asarray(a[name], np.float64), np.asarray(b[name], np.float64)
        d = np.abs(x - y).max() / max(1.0, np.abs(x).max())
        d = np.inf if np.isnan(d) else d
        if d > worst:
            worst, where = float(d), name
    return worst, where


def worst_relative_diff(a: Params, b: Params) -> tuple[float, str]:
    """max over parameters of ``max|a - b| / max|a|`` (each gradient against its own scale: a bound that
    stays meaningful when gradients are far below 1), and the parameter where it is reached. A parameter
    whose gradient is exactly zero on one side must be exactly zero on the other."""
    worst, where = -1.0, ""
    for name in a:
        x, y = np.asarray(a[name], np.float64), np.asarray(b[name], np.float64)
        scale = np.abs(x).max()
        d = np.abs(x - y).max() / scale if scale > 0 else (0.0 if not np.any(y) else np.inf)
        d = np.inf if np.isnan(d) else float(d)
        if d > worst:
            worst, where = d, name
    return worst, where


# ---------------------------------------------------------------- JAX's loss function


def jax_loss_grad(model: jax_model.SentimentRNN, cfg: Config, **loss_options) -> Callable:
    """``jit(value_and_grad(make_loss_fn(model, cfg)))``: ``(params, carry, batch, key) → ((loss, carry),
    grads)``, the very loss function the JAX twin's ``train_step`` differentiates."""
    return jax.jit(jax.value_and_grad(jax_classifier.make_loss_fn(model, cfg, **loss_options), has_aux=True))


def zeros_stacked(cfg: Config, batch_size: int) -> Stacked:
    shape = (cfg.layers, batch_size, cfg.hidden_dim)
    return np.zeros(shape, np.float32), np.zeros(shape, np.float32)

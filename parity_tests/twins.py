"""Both twins side by side, driven only through their public model and training functions.

Every comparison starts both twins from one neutral parameter set (``common.params.init_params``) and feeds
them the same ``common.batches`` in the same order. The helpers here convert between the two frameworks'
containers and run each twin's own ``train_step`` in the order ``common.loop.train`` runs it (zeros at each
epoch's start and under ``--carry reset``, else the returned carry passed on), so a trajectory here is the
CLI's trajectory without the evaluation passes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import jax
import numpy as np
import torch
from torch import nn

from common.batches import Batch, batches
from common.config import Config
from common.params import Params
from jax_impl import convert
from jax_impl import model as jax_model
from jax_impl import step as jax_step
from torch_impl import model as torch_model
from torch_impl import step as torch_step

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}

Stacked = tuple[np.ndarray, np.ndarray]  # PyTorch's (h, c), each (L, B, H), as numpy


# ---------------------------------------------------------------- building the twins


def torch_twin(cfg: Config, neutral: Params, vocab_size: int, device: str = "cpu") -> torch_model.SentimentRNN:
    """PyTorch's ``SentimentRNN`` for ``cfg`` holding exactly ``neutral``, in ``cfg.dtype`` on ``device``."""
    model = torch_model.model_from_config(cfg, vocab_size)
    torch_model.load_params(model, neutral)
    return model.to(device=device, dtype=TORCH_DTYPES[cfg.dtype])


def jax_twin(cfg: Config, vocab_size: int) -> jax_model.SentimentRNN:
    return jax_model.model_from_config(cfg, vocab_size)


def flax_params(neutral: Params, device: Any = None) -> dict:
    """The Flax params pytree of ``neutral`` (float32) as device arrays."""
    return jax.device_put(convert.to_flax(neutral), device)


# ---------------------------------------------------------------- carries and batches


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


def torch_inputs(batch: Batch, dtype=torch.float32, device: str = "cpu"):
    """``(tokens (B, T) long, labels (B,), lengths (B,) CPU)`` as torch_impl.train feeds its model."""
    return (torch.from_numpy(batch.tokens).long().to(device), torch.from_numpy(batch.labels).to(device, dtype),
            torch.from_numpy(batch.lengths))


def train_batches(data, cfg: Config, steps: int) -> Iterator[tuple[int, Batch]]:
    """``(epoch, batch)`` of the first ``steps`` training steps, in the twins' order for (seed, epoch)."""
    done, epoch = 0, 0
    while True:
        for batch in batches(data.train, cfg.batch_size, shuffle_seed=cfg.seed, epoch=epoch):
            if done == steps:
                return
            yield epoch, batch
            done += 1
        epoch += 1


# ---------------------------------------------------------------- gradients


def torch_grads(model: nn.Module) -> Params:
    """Every parameter's ``.grad`` under the state-dict names, as float64 numpy."""
    return {name: p.grad.detach().cpu().double().numpy() for name, p in model.named_parameters()}


def torch_loss_and_grads(model: nn.Module, batch: Batch, hidden, *, packed: bool) -> tuple[float, Params]:
    """The seed's loss (``nn.BCELoss`` on the model's probabilities) and every parameter's gradient, from
    ``hidden`` (a leaf: nothing flows back into it), in training mode (callers set dropout to 0)."""
    model.train()
    model.zero_grad(set_to_none=True)
    weight = model.fc.weight
    tokens, labels, lengths = torch_inputs(batch, weight.dtype, weight.device)
    probs, _ = model(tokens, hidden, lengths if packed else None)
    loss = nn.BCELoss()(probs, labels)
    loss.backward()
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


# ---------------------------------------------------------------- one trajectory per twin


def torch_trajectory(cfg: Config, data, neutral: Params, steps: int, device: str = "cpu") -> list[float]:
    """Per-step losses of ``torch_impl.step.train_step`` over the first ``steps`` batches, in the loop's order
    (``common.loop.train``): zeros at each epoch's start and at every batch under ``--carry reset``, else the
    returned hidden carried (``train_step`` detaches it)."""
    model = torch_twin(cfg, neutral, len(data.vocab), device)
    optimizer = torch_step.make_optimizer(model, cfg)
    torch.manual_seed(cfg.seed)
    losses, hidden, last_epoch = [], None, None
    for epoch, batch in train_batches(data, cfg, steps):
        if epoch != last_epoch or cfg.carry == "reset":
            hidden, last_epoch = model.init_hidden(cfg.batch_size), epoch
        loss, hidden = torch_step.train_step(model, optimizer, hidden, batch, cfg)
        losses.append(loss)
    return [float(x) for x in losses]


@dataclass
class JaxTrainer:
    """The JAX twin's model and compiled ``train_step`` for one configuration (compiled once, reused)."""

    cfg: Config
    model: jax_model.SentimentRNN
    step: Callable

    @classmethod
    def build(cls, cfg: Config, vocab_size: int) -> "JaxTrainer":
        model = jax_twin(cfg, vocab_size)
        return cls(cfg, model, jax_step.make_train_step(model, cfg))

    def trajectory(self, data, neutral: Params, steps: int, device: Any = None) -> list[float]:
        """Per-step losses in the loop's order (``common.loop.train``): a zero carry at each epoch's start, and
        at every batch under ``--carry reset``."""
        cfg, model = self.cfg, self.model
        state = jax_step.create_train_state(model, cfg, neutral, device)
        key = jax.device_put(jax.random.key(cfg.seed), device)
        losses, carry, last_epoch = [], None, None
        for epoch, batch in train_batches(data, cfg, steps):
            if epoch != last_epoch or cfg.carry == "reset":
                carry, last_epoch = jax_step.zero_carry(model, cfg.batch_size, device), epoch
            state, carry, metrics = self.step(state, carry, jax_step.batch_to_device(batch, device), key)
            losses.append(metrics.loss)
        return [float(x) for x in jax.device_get(losses)]


def jax_loss_grad(model: jax_model.SentimentRNN, cfg: Config, **loss_options) -> Callable:
    """``jit(value_and_grad(make_loss_fn(model, cfg)))``: ``(params, carry, batch, key) → ((loss, carry),
    grads)``, the very loss function the JAX twin's ``train_step`` differentiates."""
    return jax.jit(jax.value_and_grad(jax_step.make_loss_fn(model, cfg, **loss_options), has_aux=True))


def zeros_stacked(cfg: Config, batch_size: int) -> Stacked:
    shape = (cfg.layers, batch_size, cfg.hidden_dim)
    return np.zeros(shape, np.float32), np.zeros(shape, np.float32)

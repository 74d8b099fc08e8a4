"""The PyTorch twin's step machinery, the same for every workload: the optimizer, ``repackage_hidden``, the backward
pass and the update (clipping, Adam or SGD, --skip-nonfinite), and the training step over a workload's ``forward``
(:mod:`torch_impl.classifier`, :mod:`torch_impl.lm`).

    state, hidden, loss = train_step(forward, state, hidden, batch, cfg)   # forward, backward, update
"""
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from common.config import Config
from torch_impl.model import Hidden


def make_optimizer(model: nn.Module, cfg: Config) -> torch.optim.Optimizer:
    """--optimizer adam: Adam(lr=cfg.lr) with PyTorch's defaults, betas (0.9, 0.999), eps 1e-8; sgd: SGD(lr=cfg.lr),
    no momentum, ``p -= lr * grad`` (the LM example's update)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr)
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group steps at ``lr`` from now on."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def repackage_hidden(h):
    """Cut the hidden state off the graph of the batch that produced it (truncated BPTT), keeping its values."""
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


@dataclass
class TrainState:
    """The model and its optimizer (both updated in place by a step)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer


def backward(model: nn.Module, loss: torch.Tensor, retain_graph: bool = False) -> None:
    """Each parameter's ``.grad`` set afresh to d loss / d parameter."""
    model.zero_grad()
    loss.backward(retain_graph=retain_graph)


def update(state: TrainState, hidden: Hidden, new_hidden: Hidden, loss: torch.Tensor, finite_output: torch.Tensor,
           cfg: Config) -> tuple[TrainState, Hidden, torch.Tensor]:
    """The optimizer's part of a step, after :func:`backward`: clip the gradient at ``cfg.clip``, then Adam.
    ``(state, hidden to carry on, loss)``, the loss a detached scalar, NaN when the output or the gradient was not
    finite. With ``cfg.skip_nonfinite`` such a step changes nothing (no update, the incoming ``hidden`` returned);
    deciding that needs one host sync, which only that option pays."""
    # Clipping keeps the exploding-gradient problem of RNNs in check.
    grad_norm = nn.utils.clip_grad_norm_(state.model.parameters(), cfg.clip or math.inf)  # max_norm inf: times 1
    loss = torch.where(torch.isfinite(grad_norm) & finite_output, loss.detach(), torch.nan)
    if cfg.skip_nonfinite and not bool(torch.isfinite(loss)):
        state.optimizer.zero_grad()
        return state, repackage_hidden(hidden), loss
    state.optimizer.step()
    return state, new_hidden, loss


def train_step(forward: Callable[..., tuple[torch.Tensor, Any, torch.Tensor]], state: TrainState, hidden: Any,
               batch: Any, cfg: Config, retain_graph: bool = False) -> tuple[TrainState, Any, torch.Tensor]:
    """One optimizer step on ``batch`` with a workload's ``forward(model, hidden, batch, cfg) -> (loss, new hidden,
    whether finite)``: ``(state, hidden, loss)``, the hidden state to carry into the next batch and the loss a detached
    scalar tensor (no host sync), NaN when the model's output or the gradient was not finite (one check by the caller
    covers both)."""
    loss, new_hidden, finite_output = forward(state.model, hidden, batch, cfg)
    backward(state.model, loss, retain_graph)
    return update(state, hidden, new_hidden, loss, finite_output, cfg)

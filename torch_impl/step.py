"""The PyTorch twin's steps: the seed's training step (with ``repackage_hidden``) and evaluation step.

    state, hidden, loss = train_step(state, hidden, batch, cfg)   # forward (detach, BCE), backward, update (clip, Adam)
    loss_sum, correct = eval_step(model, batch)                  # zero hidden state, dropout off

Under ``--dtype bfloat16`` both run PyTorch's standard mixed precision: float32 parameters, gradients and Adam state,
the forward pass under ``torch.autocast`` (:func:`torch_impl.numerics.autocast`), the loss in float32 outside it.
"""
import math
from dataclasses import dataclass

import torch
from torch import nn

from common.batches import Batch
from common.config import Config
from torch_impl.model import Hidden, SentimentRNN
from torch_impl.numerics import autocast


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


def to_device(batch: Batch, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tokens`` (B, T) long and ``labels`` (B,) in the model's dtype on its device; ``lengths`` (B,) CPU."""
    weight = next(model.parameters())  # (the model may be wrapped in DDP, which has no .fc)
    tokens = torch.from_numpy(batch.tokens).to(weight.device).long()
    labels = torch.from_numpy(batch.labels).to(weight.device, weight.dtype)
    return tokens, labels, torch.from_numpy(batch.lengths)


def repackage_hidden(h):
    """Cut the hidden state off the graph of the batch that produced it (truncated BPTT), keeping its values."""
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


@dataclass
class TrainState:
    """The model and its optimizer (both updated in place by a step)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer


def forward(model: nn.Module, hidden: Hidden, batch: Batch, cfg: Config) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
    """The batch's loss (the seed's ``BCELoss`` on the model's probabilities) in training mode: ``(loss, hidden to carry
    on, whether every output was finite)``. The incoming ``hidden`` is detached first (the seed's fix) unless
    ``--no-detach``."""
    model.train()
    tokens, labels, lengths = to_device(batch, model)
    if cfg.detach:
        # Without this, backward() would run into the previous batch's graph, already freed: the seed's bug.
        hidden = repackage_hidden(hidden)
    with autocast(cfg.dtype, tokens.device):
        if cfg.tbptt:
            # Truncated BPTT inside the batch: the carry crosses each chunk boundary detached; loss on the last step.
            chunks = tokens.split(cfg.tbptt, dim=1)
            for chunk in chunks[:-1]:
                _, hidden = model(chunk, hidden)
                hidden = repackage_hidden(hidden)
            output, hidden = model(chunks[-1], hidden)
        else:
            output, hidden = model(tokens, hidden, lengths if cfg.padding == "right" else None)
    # Under bfloat16 the probabilities and the carry come back in bfloat16 (the carry from oneDNN): the loss is
    # computed in float32, outside autocast (whose CUDA side refuses BCELoss), and the carry kept in float32.
    output, hidden = output.to(labels.dtype), tuple(h.to(labels.dtype) for h in hidden)
    # BCELoss refuses a NaN probability; the same values otherwise, and a non-finite output makes a NaN loss.
    finite_output = torch.isfinite(output)
    loss = nn.BCELoss()(torch.where(finite_output, output, 0.5), labels)
    return loss, hidden, finite_output.all()


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


def train_step(state: TrainState, hidden: Hidden, batch: Batch, cfg: Config, retain_graph: bool = False
               ) -> tuple[TrainState, Hidden, torch.Tensor]:
    """One optimizer step on ``batch``: ``(state, hidden, loss)``, the hidden state to carry into the next batch and
    the loss a detached scalar tensor (no host sync), NaN when the model's output or the gradient was not finite (one
    check by the caller covers both)."""
    loss, new_hidden, finite_output = forward(state.model, hidden, batch, cfg)
    backward(state.model, loss, retain_graph)
    return update(state, hidden, new_hidden, loss, finite_output, cfg)


@torch.no_grad()
def eval_step(model: SentimentRNN, batch: Batch, packed: bool = False, dtype: str = "float32"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of BCE over the batch, number correct)`` as 0-d tensors, from a zero hidden state, dropout off.
    ``packed``: the batch is right-padded (``--padding right``), read with its lengths; ``dtype``: ``--dtype``. Correct
    means the project's one decision rule (``common.predict.is_positive``: p > 0.5, the seed's ``round(p)``) gives the
    label."""
    model.eval()
    tokens, labels, lengths = to_device(batch, model)
    with autocast(dtype, tokens.device):
        output, _ = model(tokens, model.init_hidden(batch.size), lengths if packed else None)
    output = output.to(labels.dtype)  # the loss in float32 under bfloat16, as in training
    return nn.BCELoss(reduction="sum")(output, labels), ((output > 0.5).to(labels.dtype) == labels).sum()

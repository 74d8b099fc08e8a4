"""The PyTorch twin's language-model steps: the body of pytorch/examples' ``train()`` loop and its ``evaluate()``.

    state, hidden, loss = train_step(state, hidden, window, cfg)  # repackage_hidden, cross-entropy, backward, clip,
                                                                  # SGD (the example's) or Adam
    hidden, (loss_sum, tokens) = eval_step(model, hidden, window)  # dropout off, the hidden state carried on

The hidden state is detached at the start of every window (``repackage_hidden``: without it, the second window's
backward runs into the first window's freed graph, the same error as the classifier's ``--no-detach``).
"""
import torch
from torch import nn

from common.config import Config
from common.workloads import Window
from torch_impl.lm_model import LMHidden, cross_entropy
from torch_impl.numerics import autocast
from torch_impl.step import TrainState, backward, repackage_hidden, update


def to_device(window: Window, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``inputs`` and ``targets`` (t, B) long, on the model's device."""
    device = next(model.parameters()).device
    return (torch.from_numpy(window.inputs).to(device).long(), torch.from_numpy(window.targets).to(device).long())


def _cast(hidden: LMHidden, dtype: torch.dtype) -> LMHidden:
    return hidden.to(dtype) if isinstance(hidden, torch.Tensor) else tuple(h.to(dtype) for h in hidden)


def forward(model: nn.Module, hidden: LMHidden, window: Window, cfg: Config
            ) -> tuple[torch.Tensor, LMHidden, torch.Tensor]:
    """The window's mean cross-entropy per token in training mode: ``(loss, hidden to carry on, whether the loss is
    finite)``. The incoming ``hidden`` is detached first (``repackage_hidden``) unless ``--no-detach``."""
    model.train()
    inputs, targets = to_device(window, model)
    if cfg.detach:
        hidden = repackage_hidden(hidden)
    with autocast(cfg.dtype, inputs.device):
        logits, new_hidden = model(inputs, hidden)
    dtype = next(model.parameters()).dtype  # under bfloat16 the loss and the carry in float32, as the classifier's
    loss = cross_entropy(logits.to(dtype), targets)
    return loss, _cast(new_hidden, dtype), torch.isfinite(loss)


def train_step(state: TrainState, hidden: LMHidden, window: Window, cfg: Config, retain_graph: bool = False
               ) -> tuple[TrainState, LMHidden, torch.Tensor]:
    """One optimizer step on ``window``: ``(state, hidden, loss)``, the loss a detached scalar tensor (no host sync),
    NaN when the loss or the gradient was not finite."""
    loss, new_hidden, finite = forward(state.model, hidden, window, cfg)
    backward(state.model, loss, retain_graph)
    return update(state, hidden, new_hidden, loss, finite, cfg)


@torch.no_grad()
def eval_step(model: nn.Module, hidden: LMHidden, window: Window, dtype: str = "float32"
              ) -> tuple[LMHidden, tuple[torch.Tensor, int]]:
    """``(hidden after the window, (sum of the cross-entropy over its t·B tokens, t·B))``, dropout off. ``dtype``:
    ``--dtype``."""
    model.eval()
    inputs, targets = to_device(window, model)
    with autocast(dtype, inputs.device):
        logits, hidden = model(inputs, hidden)
    param_dtype = next(model.parameters()).dtype
    loss_sum = nn.functional.cross_entropy(logits.to(param_dtype).reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                           reduction="sum")
    return _cast(hidden, param_dtype), (loss_sum, targets.numel())

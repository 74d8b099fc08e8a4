"""The language model's PyTorch side, named as :mod:`torch_impl.classifier`'s: the body of pytorch/examples'
``train()`` loop and its ``evaluate()``.

    state, hidden, loss = train_step(state, hidden, window, cfg)   # repackage_hidden, cross-entropy, backward, update
    hidden, (loss_sum, tokens) = eval_step(model, hidden, window, cfg)   # dropout off, the hidden state carried on
"""
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from common.config import Config
from common.errors import ConfigError
from common.params import init_lm_params
from common.workloads import Window
from torch_impl import step
from torch_impl.distributed import World
from torch_impl.lm_model import LMHidden, RNNModel
from torch_impl.model import load_params
from torch_impl.numerics import autocast
from torch_impl.step import repackage_hidden


def check_world(world: World | None) -> None:
    """Refuse torchrun's several processes: the language model trains in one."""
    if world is not None:
        raise ConfigError("the language model trains in one process: data parallelism (torchrun) is the classifier's")


def make_lm_model(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str = "lstm",
                  dropout: float = 0.5, tied: bool = False, seed: int = 0) -> RNNModel:
    """The model holding the shared initial weights ``init_lm_params(seed=seed)`` (never torch's own initialisation,
    so both twins start from the same numbers). CPU, float32."""
    model = RNNModel(vocab_size, embed_dim, hidden_dim, layers, cell, dropout, tied)
    load_params(model, init_lm_params(vocab_size, embed_dim, hidden_dim, layers, cell, tied, seed))
    return model


def model_from_config(cfg: Config, vocab_size: int) -> RNNModel:
    """The language model ``cfg`` describes (``--cell``, ``--tied``, sizes, ``--dropout``), holding the shared initial
    weights ``init_lm_params(seed=cfg.seed)``. CPU, float32."""
    return make_lm_model(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.cell, cfg.dropout, cfg.tied,
                         cfg.seed)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The example's loss, ``nn.CrossEntropyLoss`` of ``logits`` (T, B, V) against ``targets`` (T, B): the ``"mean"``
    over all T·B tokens (perplexity = exp of it), or their ``"sum"``."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)


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


train_step = partial(step.train_step, forward)  # train_step(state, hidden, window, cfg, retain_graph=False)


@torch.no_grad()
def eval_step(model: nn.Module, hidden: LMHidden, window: Window, cfg: Config
              ) -> tuple[LMHidden, tuple[torch.Tensor, int]]:
    """``(hidden after the window, (sum of the cross-entropy over its t·B tokens, t·B))``, dropout off."""
    model.eval()
    inputs, targets = to_device(window, model)
    with autocast(cfg.dtype, inputs.device):
        logits, hidden = model(inputs, hidden)
    param_dtype = next(model.parameters()).dtype
    return _cast(hidden, param_dtype), (cross_entropy(logits.to(param_dtype), targets, "sum"), targets.numel())


def timed_parts(model: RNNModel) -> Callable[..., dict[str, float]]:
    """The language model's own part of a timed training step, ``decoder(window, clock) -> {"decoder": s}``: the
    seconds of its decoder and loss alone, forward and backward, on ``window``'s shapes: the model's own ``decoder``
    (its parameters' gradients and the input's) and :func:`cross_entropy` on a fixed (t, B, H) input in the LSTM's
    output range. Its gradients are discarded: the next step's backward sets them afresh."""
    made: dict[tuple, Any] = {}

    def decoder_part(window: Window, clock: Any) -> dict[str, float]:
        inputs, targets = to_device(window, model)
        shape = (*inputs.shape, model.hidden_dim)
        if shape not in made:
            gen = torch.Generator().manual_seed(0)
            x = torch.tanh(torch.randn(shape, generator=gen)).to(device=inputs.device, dtype=model.decoder.bias.dtype)
            made[shape] = x.requires_grad_()
        x = made[shape]
        clock.lap()
        x.grad = None
        cross_entropy(model.decoder(x), targets).backward()
        return {"decoder": clock.lap()}

    return decoder_part

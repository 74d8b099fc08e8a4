"""The classifier's PyTorch side, what the twin (:mod:`torch_impl.train`) asks of a workload, named as
:mod:`torch_impl.lm`'s: the model, ``forward`` (the seed's, with ``repackage_hidden``), the steps.

    state, hidden, loss = train_step(state, hidden, batch, cfg)   # forward (detach, BCE), backward, update (clip, Adam)
    hidden, (loss_sum, correct) = eval_step(model, hidden, batch, cfg)   # zero hidden state, dropout off

Under ``--dtype bfloat16``: float32 parameters, gradients and Adam state, the forward pass under ``torch.autocast``
(:func:`torch_impl.numerics.autocast`), the loss in float32 outside it.
"""
from functools import partial
from typing import Callable

import torch
from torch import nn

from common.batches import Batch
from common.config import Config
from common.params import init_params
from torch_impl import step
from torch_impl.distributed import World
from torch_impl.model import Hidden, SentimentRNN, load_params
from torch_impl.numerics import autocast
from torch_impl.step import repackage_hidden


def check_world(world: World | None) -> None:
    """Nothing to refuse: under torchrun the classifier trains data-parallel."""


def model_from_config(cfg: Config, vocab_size: int) -> SentimentRNN:
    """The model ``cfg`` describes, holding the shared initial weights ``init_params(seed=cfg.seed)``
    (never torch's own initialisation, so both twins start from the same numbers). CPU, float32."""
    model = SentimentRNN(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.dropout, cfg.fc_dropout)
    load_params(model, init_params(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed))
    return model


def to_device(batch: Batch, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tokens`` (B, T) long and ``labels`` (B,) in the model's dtype on its device; ``lengths`` (B,) CPU."""
    weight = next(model.parameters())  # (the model may be wrapped in DDP, which has no .fc)
    tokens = torch.from_numpy(batch.tokens).to(weight.device).long()
    labels = torch.from_numpy(batch.labels).to(weight.device, weight.dtype)
    return tokens, labels, torch.from_numpy(batch.lengths)


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


train_step = partial(step.train_step, forward)  # train_step(state, hidden, batch, cfg, retain_graph=False)


@torch.no_grad()
def eval_step(model: SentimentRNN, hidden: Hidden, batch: Batch, cfg: Config
              ) -> tuple[Hidden, tuple[torch.Tensor, torch.Tensor]]:
    """``(hidden, (sum of BCE over the batch, number correct))``, the sums 0-d tensors, from a zero hidden state (the
    given one passes through), dropout off; right-padded batches (``--padding right``) read with their lengths. Correct
    means the project's one decision rule (``common.predict.is_positive``: p > 0.5, the seed's ``round(p)``) gives the
    label."""
    model.eval()
    tokens, labels, lengths = to_device(batch, model)
    with autocast(cfg.dtype, tokens.device):
        output, _ = model(tokens, model.init_hidden(batch.size), lengths if cfg.padding == "right" else None)
    output = output.to(labels.dtype)  # the loss in float32 under bfloat16, as in training
    return hidden, (nn.BCELoss(reduction="sum")(output, labels), ((output > 0.5).to(labels.dtype) == labels).sum())


def timed_parts(model: nn.Module) -> Callable[..., dict[str, float]]:
    """The workload's own parts of a timed training step, beyond forward, backward and optimizer: none."""
    return lambda batch, clock: {}

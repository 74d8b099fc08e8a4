"""The PyTorch twin's steps: the seed's training step (with ``repackage_hidden``) and evaluation step.

    state, hidden, loss = train_step(state, hidden, batch, cfg)   # detach, forward, BCE, backward, clip, Adam
    loss_sum, correct = eval_step(model, batch)                  # zero hidden state, dropout off

Under ``--dtype bfloat16`` both run PyTorch's standard mixed precision: float32 parameters, gradients and Adam state,
the forward pass under ``torch.autocast`` (:func:`autocast`), the loss in float32 outside it.
"""
import math
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from common.batches import Batch
from common.config import Config
from common.errors import ConfigError
from torch_impl.model import Hidden, SentimentRNN

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.float32}
CUDNN_BFLOAT16_RNN = 91300  # the first cuDNN whose RNN takes bfloat16 (9.13)


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when PyTorch sees a GPU, else the CPU; ``gpu``/``cuda``: CUDA or a ConfigError."""
    if name == "tpu":
        raise ConfigError("--device tpu is not supported by torch_impl (use jax_impl, or --device cpu/gpu)")
    if name in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: PyTorch sees no CUDA GPU here (torch {torch.__version__}); "
                          f"use --device cpu or auto")
    return torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")


def resolve_dtype(name: str) -> torch.dtype:
    """``--dtype`` → the dtype of the parameters, the carry and the loss: float32 under bfloat16, whose forward pass
    runs under :func:`autocast`."""
    if name not in DTYPES:
        raise ConfigError(f"--dtype {name} is not supported by torch_impl (use float32, bfloat16 or float64)")
    return DTYPES[name]


def lacks_bfloat16_lstm(device: torch.device) -> bool:
    """Whether ``nn.LSTM``'s fused kernel on ``device`` cannot compute bfloat16: oneDNN on a CPU without oneDNN's
    bfloat16, cuDNN before 9.13."""
    if device.type == "cuda":
        return (torch.backends.cudnn.version() or 0) < CUDNN_BFLOAT16_RNN
    return not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def lstm_kernel(cfg: Config, device: torch.device) -> str:
    """The kernel ``nn.LSTM`` runs (a key of ``common.precision.BFLOAT16_RULES``): cuDNN on a GPU, oneDNN on the
    CPU, and PyTorch's ATen cell ("native") for packed sequences on the CPU (--padding right) and, under bfloat16,
    where the fused kernel cannot take it (:func:`lacks_bfloat16_lstm`)."""
    if cfg.dtype == "bfloat16" and lacks_bfloat16_lstm(device):
        return "native"
    if device.type == "cuda":
        return "cudnn"
    return "native" if cfg.padding == "right" else "onednn"


@contextmanager
def autocast(dtype: str, device: torch.device) -> Iterator[None]:
    """The forward pass's numerics: nothing for float32 and float64; for bfloat16 ``torch.autocast``, and with
    oneDNN (or cuDNN) off where their LSTM cannot take bfloat16. Autocast alone would not fall back: ``nn.LSTM`` picks
    oneDNN for the float32 input it is given, then autocast hands oneDNN bfloat16, and creating the primitive fails."""
    if dtype != "bfloat16":
        yield
        return
    with ExitStack() as stack:
        stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
        if lacks_bfloat16_lstm(device):
            backend = torch.backends.cudnn if device.type == "cuda" else torch.backends.mkldnn
            stack.callback(setattr, backend, "enabled", backend.enabled)
            backend.enabled = False
        yield


def set_numerics(cfg: Config, device: torch.device) -> dict[str, bool]:
    """Put PyTorch's process-wide float rules where ``cfg`` says, and return what is in force. Both differ from
    JAX's by default: XLA flushes denormals to zero on the CPU (PyTorch keeps them, which makes backward through
    long sequences many times slower on some CPUs), and JAX at HIGHEST never uses TF32 (PyTorch lets cuDNN).

    ``torch.set_flush_denormal`` sets the calling thread's flags only. The intra-op threads (OpenMP's, which MKL
    and oneDNN run on too) copy them from the thread that starts them, at the process's first parallel op, and keep
    them. So call this before anything parallel runs (the twins do, before building the model); the returned
    ``flush_denormal`` is measured on every intra-op thread (:func:`denormals_flushed`), not taken from the flag."""
    torch.set_flush_denormal(cfg.flush_denormal)  # returns False where the CPU cannot flush (then nothing is)
    torch.backends.cuda.matmul.allow_tf32 = cfg.allow_tf32
    torch.backends.cudnn.allow_tf32 = cfg.allow_tf32
    flushed = denormals_flushed() if device.type == "cpu" else None  # a CPU switch only
    if device.type == "cpu" and flushed is not cfg.flush_denormal:
        where = {True: "all", False: "none", None: "only some"}[flushed]
        flag = "--flush-denormal" if cfg.flush_denormal else "--no-flush-denormal"
        print(f"warning: {where} of PyTorch's intra-op threads flush denormals, against {flag} (threads started before "
              f"it was set keep their own rule; the run record says what is in force)", file=sys.stderr)
    return {"flush_denormal": bool(flushed), "allow_tf32": cfg.allow_tf32}


def denormals_flushed() -> bool | None:
    """True when every intra-op thread flushes denormals to zero, False when none does, None when some do: a
    float32 GEMM split over the threads, each of whose products is a denormal, comes out zero exactly where the
    thread that computed it flushes."""
    a = torch.full((512, 512), 1e-21)  # products 1e-42, sums 5e-40: all below float32's smallest normal, 1.2e-38
    zero = (a @ a == 0).float().mean().item()
    return True if zero == 1.0 else False if zero == 0.0 else None


def make_optimizer(model: nn.Module, cfg: Config) -> torch.optim.Adam:
    """Adam(lr=cfg.lr) with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8."""
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


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


Lap = Callable[[str], None]  # called as each part of a step ends: "forward", "backward", "optimizer"


def no_lap(part: str) -> None:
    pass


def forward_backward(model: nn.Module, hidden: Hidden, batch: Batch, cfg: Config, retain_graph: bool = False,
                     lap: Lap = no_lap) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
    """The batch's loss (the seed's ``BCELoss`` on the model's probabilities) and its gradient, in training mode:
    ``(loss, hidden to carry on, whether every output was finite)``, each parameter's ``.grad`` set afresh. The
    incoming ``hidden`` is detached first (the seed's fix) unless ``--no-detach``. ``lap``: see :func:`train_step`."""
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
    lap("forward")
    model.zero_grad()
    loss.backward(retain_graph=retain_graph)
    lap("backward")
    return loss.detach(), hidden, finite_output.all()


def train_step(state: TrainState, hidden: Hidden, batch: Batch, cfg: Config, retain_graph: bool = False,
               lap: Lap = no_lap) -> tuple[TrainState, Hidden, torch.Tensor]:
    """One optimizer step on ``batch``: ``(state, hidden, loss)``, the hidden state to carry into the next batch and
    the loss a detached scalar tensor (no host sync), NaN when the model's output or the gradient was not finite (one
    check by the caller covers both). With ``cfg.skip_nonfinite`` such a step changes nothing (no update, the incoming
    hidden is returned); deciding that needs one host sync, which only that option pays. ``lap(part)`` is called as
    the forward pass (the loss), the backward pass and the optimizer update (clip and Adam) end: the benchmark's
    clock."""
    loss, new_hidden, finite_output = forward_backward(state.model, hidden, batch, cfg, retain_graph, lap)
    # Clipping keeps the exploding-gradient problem of RNNs in check.
    grad_norm = nn.utils.clip_grad_norm_(state.model.parameters(), cfg.clip or math.inf)  # max_norm inf: times 1
    loss = torch.where(torch.isfinite(grad_norm) & finite_output, loss, torch.nan)
    if cfg.skip_nonfinite and not bool(torch.isfinite(loss)):
        state.optimizer.zero_grad()
        lap("optimizer")
        return state, repackage_hidden(hidden), loss
    state.optimizer.step()
    lap("optimizer")
    return state, new_hidden, loss


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

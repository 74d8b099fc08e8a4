"""Train the classic notebook's sentiment LSTM in PyTorch: the seed's loop, made reproducible and resumable.

    python -m torch_impl.train [--epochs 4] [--save-dir DIR] [--checkpoint-every N] [--resume DIR] ...

The loop is the seed's: the hidden state starts at zeros each epoch, is carried from batch to batch and
detached at the start of every batch (``repackage_hidden``); BCELoss on the sigmoid output, gradients
clipped at ``--clip``, Adam. ``--no-detach`` reproduces the seed's famous error on purpose.

Several devices: ``torchrun --nproc_per_node N -m torch_impl.train ...`` trains the same global batches with
DistributedDataParallel, each process on its slice of every batch (:mod:`torch_impl.distributed`).
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn
from tqdm import tqdm

from common.batches import Batch, batches, num_train_batches
from common.checkpoint import load_checkpoint, save_checkpoint
from common.config import Config, parse_config
from common.data import EncodedSplit, prepare_data
from common.errors import ConfigError, UserError, cli_main
from common.files import check_writable
from common.metrics import MetricsLog, log_line
from common.runstate import (Progress, checkpoint_dirs, checkpoint_root, load_latest, trajectory_settings,
                             write_checkpoint)
from torch_impl.distributed import (World, check_config, dropout_seed, join_process_group, leave_process_group,
                                     world_from_environment, wrap)
from torch_impl.model import Hidden, SentimentRNN, export_params, load_params, model_from_config
from torch_impl.state import load_training_state, restore_training_state, save_training_state

PROG = "python -m torch_impl.train"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
NO_DETACH_ERROR = "Trying to backward through the graph a second time"
NONFINITE_OUTPUT_ERROR = "all elements of input should be between 0 and 1"  # BCELoss given a NaN


class NonFiniteError(UserError):
    """A training step's loss or gradient is not finite (and --skip-nonfinite was not given)."""


# ---------------------------------------------------------------- set-up


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when PyTorch sees a GPU, else the CPU; ``gpu``/``cuda``: CUDA or a ConfigError."""
    if name == "tpu":
        raise ConfigError("--device tpu is not supported by torch_impl (use jax_impl, or --device cpu/gpu)")
    if name in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: PyTorch sees no CUDA GPU here (torch {torch.__version__}); "
                          f"use --device cpu or auto")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda")


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"--dtype {name} is not supported by torch_impl (use float32 or float64)")
    return DTYPES[name]


def make_optimizer(model: nn.Module, cfg: Config) -> torch.optim.Adam:
    """Adam(lr=cfg.lr) with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8."""
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


def _to_device(batch: Batch, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tokens`` (B, T) long and ``labels`` (B,) in the model's dtype on its device; ``lengths`` (B,) CPU."""
    weight = next(model.parameters())  # (the model may be wrapped in DDP, which has no .fc)
    tokens = torch.from_numpy(batch.tokens).to(weight.device).long()
    labels = torch.from_numpy(batch.labels).to(weight.device, weight.dtype)
    return tokens, labels, torch.from_numpy(batch.lengths)


# ---------------------------------------------------------------- one step


def repackage_hidden(h):
    """Cut the hidden state off the graph of the batch that produced it (truncated BPTT), keeping its values."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def total_grad_norm(model: nn.Module) -> torch.Tensor:
    """‖all gradients‖₂, as clip_grad_norm_ reports it (used when clipping is off, to spot non-finite steps)."""
    norms = [torch.linalg.vector_norm(p.grad) for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms))


def train_step(model: SentimentRNN, optimizer: torch.optim.Optimizer, hidden: Hidden, batch: Batch, cfg: Config,
               retain_graph: bool = False) -> tuple[torch.Tensor, Hidden]:
    """One optimizer step on ``batch``; returns the loss (a detached scalar tensor, no host sync) and the
    hidden state to carry into the next batch.

    The returned loss is NaN when the gradient was not finite, so one check by the caller covers both.
    With ``cfg.skip_nonfinite`` such a step changes nothing (no update, the incoming hidden is returned);
    deciding that needs one host sync, which only that option pays.
    """
    model.train()
    tokens, labels, lengths = _to_device(batch, model)
    if cfg.carry == "reset":
        hidden = model.init_hidden(batch.size)
    elif cfg.detach:
        # Without this, backward() would run into the previous batch's graph, already freed: the seed's bug.
        hidden = repackage_hidden(hidden)
    incoming = hidden

    if cfg.tbptt:
        # Truncated BPTT inside the batch: the carry crosses each chunk boundary detached; loss on the last step.
        chunks = tokens.split(cfg.tbptt, dim=1)
        for chunk in chunks[:-1]:
            _, hidden = model(chunk, hidden)
            hidden = repackage_hidden(hidden)
        output, hidden = model(chunks[-1], hidden)
    else:
        output, hidden = model(tokens, hidden, lengths if cfg.padding == "right" else None)

    criterion = nn.BCELoss()
    loss = criterion(output, labels)
    optimizer.zero_grad()
    loss.backward(retain_graph=retain_graph)
    # Clipping keeps the exploding-gradient problem of RNNs in check.
    if cfg.clip:
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    else:
        grad_norm = total_grad_norm(model)
    loss = torch.where(torch.isfinite(grad_norm), loss.detach(), torch.nan)
    if cfg.skip_nonfinite and not bool(torch.isfinite(loss)):
        optimizer.zero_grad()
        return loss, repackage_hidden(incoming)
    optimizer.step()
    return loss, hidden


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def eval_step(model: SentimentRNN, batch: Batch, packed: bool = False) -> tuple[float, int]:
    """``(sum of BCE over the batch, number correct)``, from a zero hidden state, dropout off.
    ``packed``: the batch is right-padded (``--padding right``), read with its lengths."""
    model.eval()
    tokens, labels, lengths = _to_device(batch, model)
    output, _ = model(tokens, model.init_hidden(batch.size), lengths if packed else None)
    loss_sum = nn.BCELoss(reduction="sum")(output, labels)
    correct = (torch.round(output) == labels).sum()  # the seed's rule: round(p), 0.5 rounding to 0
    return float(loss_sum), int(correct)


def evaluate(model: SentimentRNN, split: EncodedSplit, cfg: Config, world: World | None = None) -> tuple[float, float]:
    """``(mean BCE, accuracy)`` over every example of ``split`` once. Under torchrun (``world``) each rank
    scores its share of every batch and the sums are added over ranks, so all ranks get the same numbers."""
    loss_sum, correct = 0.0, 0
    for batch in batches(split, cfg.batch_size):
        if world is not None:
            batch = world.part(batch)
            if batch.size == 0:  # a last batch smaller than the number of ranks
                continue
        batch_loss, batch_correct = eval_step(model, batch, packed=cfg.padding == "right")
        loss_sum += batch_loss
        correct += batch_correct
    if world is not None:
        loss_sum, correct = world.sum(loss_sum, correct)
    return loss_sum / len(split), correct / len(split)


# ---------------------------------------------------------------- the loop


def _no_detach_message(err: RuntimeError, step: int) -> str:
    pytorch_says = str(err).split(". ")[0].strip()
    return (f"step {step}: PyTorch: \"{pytorch_says}.\" This is the seed's bug, reproduced on purpose by "
            f"--no-detach: the hidden state carried from the previous batch still points into that batch's "
            f"graph, which backward() has already freed. The fix is to detach the carry at every batch "
            f"(repackage_hidden), which is the default: drop --no-detach.")


def _checked_train_step(model: SentimentRNN, optimizer: torch.optim.Optimizer, hidden: Hidden, batch: Batch,
                        cfg: Config, step: int, world: World | None = None) -> tuple[float, Hidden]:
    """:func:`train_step` with the loss on the host, and PyTorch's errors that have a known cause explained.
    Under torchrun the loss returned is the mean over ranks: the global batch's mean loss."""
    try:
        loss, hidden = train_step(model, optimizer, hidden, batch, cfg)
    except RuntimeError as err:
        if not cfg.detach and NO_DETACH_ERROR in str(err):
            raise ConfigError(_no_detach_message(err, step)) from None
        if NONFINITE_OUTPUT_ERROR not in str(err):
            raise
        return math.nan, hidden  # BCELoss refused a NaN probability before anything changed: a non-finite step
    if world is not None:
        loss = world.mean(loss)
    return loss.item(), hidden


def _load_run(cfg: Config):
    """``(cfg, data, model)``: the data and a model holding its initial weights (``--init-from`` or the shared
    seeded ones), on the configured device and dtype."""
    device, dtype = resolve_device(cfg.device), resolve_dtype(cfg.dtype)
    if cfg.init_from:
        ckpt = load_checkpoint(cfg.init_from, cfg)
        cfg = ckpt.config
        data = prepare_data(cfg, vocab=ckpt.vocab, tokenizer=ckpt.tokenizer)
        model = model_from_config(cfg, len(data.vocab))
        load_params(model, ckpt.params)
    else:
        data = prepare_data(cfg)
        model = model_from_config(cfg, len(data.vocab))
    return cfg, data, model.to(device=device, dtype=dtype)


def train(cfg: Config) -> dict[str, Any]:
    """The full run; returns test/validation loss and accuracy, steps, train_seconds and skipped_steps.
    Started by torchrun with WORLD_SIZE > 1, it is one rank of a data-parallel run."""
    world = world_from_environment()
    check_config(cfg, world)
    if world is None:
        return _train(cfg, None)
    join_process_group(world, resolve_device(cfg.device))
    try:
        return _train(cfg, world)
    finally:
        leave_process_group()


def _train(cfg: Config, world: World | None) -> dict[str, Any]:
    cfg, data, model = _load_run(cfg)
    device = model.fc.weight.device
    is_main = world is None or world.is_main  # the process that prints and writes files
    if cfg.save_dir and is_main:
        check_writable(Path(cfg.save_dir), "--save-dir")
    run_dir = checkpoint_root(cfg, "torch_impl") if cfg.checkpoint_every else None
    if run_dir is not None and is_main:
        check_writable(run_dir, "training checkpoints:")
    optimizer = make_optimizer(model, cfg)
    torch.manual_seed(cfg.seed if world is None else dropout_seed(cfg.seed, world.rank))  # dropout's stream

    progress, last_val, hidden = Progress(step=0, epoch=0, batch=0), None, None
    if cfg.resume:
        if not checkpoint_dirs(cfg.resume):
            raise ConfigError(f"--resume {cfg.resume}: no training checkpoint (step-*) found there")
        progress, state, path = load_latest(cfg.resume, lambda p: load_training_state(p), cfg=cfg)
        hidden = restore_training_state(state, model, optimizer, device)
        last_val = state.scalars["last_val"]
        if world is not None:
            hidden = world.part_hidden(hidden)  # the checkpoint holds the global carry
            if not world.is_main:  # it holds rank 0's generator only
                torch.manual_seed(dropout_seed(cfg.seed, world.rank, progress.step))
        if is_main:
            print(f"resumed from {path} (step {progress.step}, epoch {progress.epoch + 1}, batch {progress.batch})",
                  file=sys.stderr)
    elif run_dir is not None and is_main:
        print(f"training checkpoints: {run_dir} (continue a stopped run with --resume {run_dir})", file=sys.stderr)
    # Under torchrun: the step trains through DDP, each rank on its rows of every batch (and their carry).
    trained = model if world is None else wrap(model)
    rows = cfg.batch_size if world is None else cfg.batch_size // world.size

    per_epoch = num_train_batches(len(data.train), cfg.batch_size)
    total = cfg.epochs * per_epoch if not cfg.max_steps else min(cfg.epochs * per_epoch, cfg.max_steps)
    step, skipped, best_val_loss = progress.step, progress.skipped, progress.best_val_loss
    settings = trajectory_settings(cfg)
    train_seconds = 0.0
    metrics = MetricsLog(cfg.metrics_out if is_main else None, truncate_after=progress.step if cfg.resume else None)

    def validate() -> None:
        nonlocal last_val
        val_loss, val_acc = evaluate(model, data.val, cfg, world)
        last_val = {"step": step, "loss": val_loss, "accuracy": val_acc}
        metrics.write(step=step, split="val", loss=val_loss, accuracy=val_acc, train_seconds=round(train_seconds, 4))

    def keep_if_best(epoch: int) -> None:
        """--save-dir: the weights of the best epoch-end validation loss so far."""
        nonlocal best_val_loss
        if cfg.save_dir and (best_val_loss is None or last_val["loss"] < best_val_loss):
            best_val_loss = last_val["loss"]
            if is_main:
                save_checkpoint(cfg.save_dir, export_params(model), cfg, data.vocab, data.tokenizer,
                                meta={"framework": "torch", "torch": torch.__version__, "step": step,
                                      "epoch": epoch + 1, "val_loss": last_val["loss"],
                                      "val_accuracy": last_val["accuracy"], "devices": world.size if world else 1})

    with metrics, tqdm(total=total, initial=step, disable=not (cfg.progress and is_main), desc="train", unit="step",
                       dynamic_ncols=True) as bar:
        for epoch in range(progress.epoch, cfg.epochs):
            if step >= total:
                break
            start = progress.batch if epoch == progress.epoch else 0
            if start == 0 or hidden is None:
                hidden = model.init_hidden(rows)  # zeros at the start of every epoch
            for i, batch in enumerate(batches(data.train, cfg.batch_size, shuffle_seed=cfg.seed, epoch=epoch,
                                              start=start), start=start):
                if world is not None:
                    batch = world.part(batch)  # this rank's contiguous rows of the global batch
                step += 1
                tic = time.perf_counter()
                loss_value, hidden = _checked_train_step(trained, optimizer, hidden, batch, cfg, step, world)
                train_seconds += time.perf_counter() - tic
                if not math.isfinite(loss_value):
                    if not cfg.skip_nonfinite:
                        raise NonFiniteError(
                            f"step {step} (epoch {epoch + 1}): the loss or gradient is not finite; training "
                            f"stopped, the last good training checkpoint (if any) is kept. Lower --lr, or pass "
                            f"--skip-nonfinite to skip such steps")
                    skipped += 1
                metrics.write(step=step, epoch=epoch + 1, loss=loss_value if math.isfinite(loss_value) else None, train_seconds=round(train_seconds, 4))
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)

                epoch_end, stop = i + 1 == per_epoch, step >= total
                if cfg.log_every and step % cfg.log_every == 0:
                    validate()
                    if is_main:
                        bar.write(log_line(epoch + 1, cfg.epochs, step, loss_value, last_val["loss"],
                                           last_val["accuracy"]))
                if epoch_end or stop:  # every epoch's end, and where --max-steps stops the run
                    if last_val is None or last_val["step"] != step:
                        validate()
                    keep_if_best(epoch)
                if run_dir is not None and (step % cfg.checkpoint_every == 0 or epoch_end or stop):
                    after = Progress(step, epoch + 1, 0, skipped, best_val_loss, settings) if epoch_end else \
                        Progress(step, epoch, i + 1, skipped, best_val_loss, settings)
                    saved_hidden = hidden if world is None else world.gather_hidden(hidden)  # the global carry
                    if is_main:
                        write_checkpoint(run_dir, after, lambda d: save_training_state(
                            d, model, optimizer, saved_hidden, cfg, after, last_val), keep=cfg.keep_checkpoints)
                if stop:
                    break
        if last_val is None or last_val["step"] != step:
            validate()

        if cfg.save_dir and best_val_loss is not None:  # test the best validation's weights
            if is_main:
                load_params(model, load_checkpoint(cfg.save_dir, cfg).params)
            if world is not None:
                world.broadcast_params(model)  # rank 0 read them
        test_loss, test_acc = evaluate(model, data.test, cfg, world)
        metrics.write(step=step, split="test", loss=test_loss, accuracy=test_acc, train_seconds=round(train_seconds, 4))

    result = {"test_loss": test_loss, "test_accuracy": test_acc, "val_loss": last_val["loss"],
              "val_accuracy": last_val["accuracy"], "best_val_loss": best_val_loss, "steps": step,
              "train_seconds": train_seconds, "skipped_steps": skipped, "devices": world.size if world else 1}
    if is_main:
        print(f"done: {step} steps ({skipped} skipped) in {train_seconds:.1f}s of training; "
              f"val loss {result['val_loss']:.4f} acc {result['val_accuracy']:.4f}; "
              f"test loss {test_loss:.4f} acc {test_acc:.4f}")
    return result


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv, prog=PROG, description="Train the sentiment LSTM (PyTorch).")
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The one training loop: ``python -m torch_impl.train`` and ``python -m jax_impl.train`` are this loop over
their own :class:`Twin`, for either workload (:mod:`common.workloads`: the classifier, the language model). Numpy
batches go in; the twin's ``state`` and ``carry`` are opaque to it.

    for step in train_steps(twin, state, train split, cfg):    # carry = zeros each epoch (each batch under
        (state, carry, loss = twin.train_step(...) inside)     # --carry reset); the twin truncates the carry
        validate every --log-every steps and at each epoch's end; --save-dir keeps the best;
        an epoch's end whose validation is not the best: the learning rate divided by --lr-decay
        a training checkpoint every --checkpoint-every steps and at each epoch's end
    test: with the best validation's weights under --save-dir, else the final ones

:func:`train_steps` is the one driver of a twin's training steps: the loop, the benchmark's workers and the parity
suite all step a twin through it, so the carry policy is written once.
"""
import itertools
import math
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from tqdm import tqdm

from common import interrupts
from common.checkpoint import check_save_dir, load_checkpoint, save_checkpoint, save_dir_held
from common.config import Config
from common.errors import ConfigError, UserError
from common.files import Output, check_outputs
from common.metrics import MetricsLog, log_line, log_run_id
from common.params import Params
from common.runstate import (PREFIX, Progress, checkpoint_dirs, checkpoint_root, claim_run_dir, load_latest,
                             run_ids, trajectory_settings)
from common.workloads import load_run, workload_of  # noqa: F401 (load_run: the loop's, the bench's and tests')


class NonFiniteError(UserError):
    """A training step's loss or gradient is not finite (and --skip-nonfinite was not given)."""


class Twin(Protocol):
    """All the loop knows of a framework. ``record``: what ran (``{"framework", <library>: version, "device",
    "devices", "dtype", "lstm_impl"}``), written into the metrics log, the checkpoint's meta and the result.
    ``is_main``: this process prints and writes files (always, in a single-process run)."""

    record: dict[str, Any]
    is_main: bool

    def init_state(self, params: Params) -> Any:
        """The starting state from neutral parameters: those parameters, a fresh optimizer (Adam or SGD), step 0."""

    def init_carry(self, batch_size: int | None = None) -> Any:
        """Zeros for this process's rows of a batch of ``batch_size`` rows (default: --batch-size)."""

    def train_step(self, state: Any, carry: Any, batch: Any) -> tuple[Any, Any, float]:
        """One optimizer step on the global ``batch`` (a ``Batch``, or an LM ``Window``): ``(state, carry, loss)``,
        the batch's mean loss (BCE; the LM's cross-entropy per token) as a float, NaN when the loss or the gradient is
        not finite (then, under --skip-nonfinite, nothing changed)."""

    def eval_step(self, state: Any, carry: Any, batch: Any) -> tuple[Any, tuple[Any, Any]]:
        """``(carry, (loss sum, second sum))`` over this process's rows of ``batch``, dropout off; the classifier:
        (BCE, number correct) from a zero carry (the carry passes through unused); the LM: (cross-entropy, tokens),
        the carry going on into the next window. Scalars ``float``/``int`` accept, read only after the whole split
        is dispatched."""

    def sum_over_processes(self, loss_sum: float, second: float) -> tuple[float, float]:
        """The sums over every process of a data-parallel run (the identity in one process)."""

    def set_lr(self, state: Any, lr: float) -> Any:
        """``state`` training on at learning rate ``lr`` from its next step (--lr-decay)."""

    def export_params(self, state: Any) -> Params:
        """The state's parameters as neutral float32 arrays."""

    def import_params(self, state: Any, read: Callable[[], Params]) -> Any:
        """``state`` holding the neutral parameters ``read()`` returns; called on every process, ``read`` (a file
        only the main process wrote) runs on the main process alone and the twin shares its result."""

    def save_state(self, root: Path, progress: Progress, state: Any, carry: Any, keep: int) -> None:
        """Write a training checkpoint of step ``progress.step`` under ``root``, keeping the newest ``keep``."""

    def restore_state(self, path: Path, state: Any, carry: Any) -> tuple[Progress, tuple[Any, Any]]:
        """Read the training checkpoint in ``path`` (shaped like ``state`` and ``carry``); damage is a
        ``CheckpointError`` naming the file."""

    def lower(self, kind: str, state: Any, carry: Any, batch: Any) -> Any:
        """For the bench: the ``kind`` step ("train" or "eval") lowered for ``batch``'s shapes, to compile ahead of its
        first call and read what it compiles to (JAX's ``Lowered``; None where nothing is compiled ahead)."""

    def train_step_parts(self, state: Any, carry: Any, batch: Any, clock: Any) -> tuple[Any, Any, float, dict]:
        """For the bench: :meth:`train_step` timed in parts, ``clock.lap(*outputs)`` (the seconds since the last lap,
        once ``outputs`` are computed) after each: ``(state, carry, loss, {"forward", "backward", "optimizer"[, the
        workload's own parts]: seconds})``."""


@dataclass(frozen=True)
class TrainStep:
    """One step of :func:`train_steps`: its number (1-based, counted from the run's start), where its batch sits
    (``epoch`` and ``index`` in it, 0-based; ``epoch_end``: the epoch's last batch), the twin's state and carry after
    it, its loss (the batch's mean BCE, NaN if not finite) and its seconds (the twin's ``train_step`` alone)."""

    number: int
    epoch: int
    index: int
    epoch_end: bool
    state: Any
    carry: Any
    loss: float
    seconds: float


def train_steps(twin: Twin, state: Any, split: Any, cfg: Config, start: Progress = Progress(0, 0, 0),
                carry: Any = None, epochs: int | None = None) -> Iterator[TrainStep]:
    """``twin.train_step`` over the training batches in the twins' shared order, from ``start`` on, epoch after epoch
    until ``epochs`` (None: without end). The carry policy lives here and nowhere else: zeros at the start of every
    epoch, and before every batch under --carry reset; otherwise each step's returned carry goes into the next (the
    twin truncates it). ``carry``: the one to continue with when ``start`` is inside an epoch (a resumed run).
    ``split``: the workload's training split (:mod:`common.workloads`), cut into batches by it."""
    workload = workload_of(cfg)
    per_epoch, number = workload.per_epoch(split, cfg), start.step
    if not per_epoch:
        return
    for epoch in itertools.count(start.epoch) if epochs is None else range(start.epoch, epochs):
        first = start.batch if epoch == start.epoch else 0
        if first == 0 or carry is None:
            carry = twin.init_carry()
        for index, batch in enumerate(workload.train_batches(split, cfg, epoch, first), start=first):
            if cfg.carry == "reset":
                carry = twin.init_carry()
            number += 1
            tic = time.perf_counter()
            try:
                state, carry, loss = twin.train_step(state, carry, batch)
            except UserError as err:
                raise type(err)(f"step {number}: {err}") from None
            yield TrainStep(number, epoch, index, index + 1 == per_epoch, state, carry, loss, time.perf_counter() - tic)


def _in_a_step_dir(relative: Path) -> bool:
    """A path below a training checkpoint directory that its pruning removes: a step directory, or the debris of
    one (a temporary or a moved-aside one)."""
    return bool(relative.parts) and relative.parts[0].lstrip(".").startswith(PREFIX)


def _another_runs(cfg: Config) -> Callable[[Path], str | None]:
    """The refusal of a checkpoint directory holding another run's training checkpoints (claim_run_dir's rule; told
    not to overwrite, it only refuses)."""
    def held(root: Path) -> str | None:
        try:
            claim_run_dir(root, cfg.replace(overwrite=False))
        except ConfigError as err:
            return str(err)
        return None
    return held


def _not_the_runs_log(cfg: Config) -> Callable[[Path], str | None]:
    """The refusal of a --metrics-out that a resumed run would continue (cut at the resumed step, its own records
    appended) though it is not that run's log: its first record's run id is none of those the --resume directory's
    training checkpoints hold. An empty file, or a directory without checkpoints (refused when read), is none."""
    def held(path: Path) -> str | None:
        if not path.is_file() or not path.stat().st_size or not checkpoint_dirs(cfg.resume):
            return None
        if log_run_id(path) in run_ids(cfg.resume):
            return None
        return (f"--metrics-out {path}: not the metrics log of the run in --resume {cfg.resume} (its first record "
                f"names another run, or none), and resuming would cut it and add this run's records to it; give a "
                f"new path, or pass --overwrite to start it afresh")
    return held


def run_outputs(cfg: Config) -> list[Output]:
    """What a training run writes, for :func:`common.files.check_outputs`: --save-dir (each save replaces the whole
    directory), --metrics-out, the training checkpoints (each save prunes the older step directories), and the
    checkpoints it reads, --resume and --init-from, which a save could replace."""
    outputs = []
    if cfg.save_dir:
        outputs.append(Output("--save-dir", Path(cfg.save_dir), True, "the neutral checkpoint",
                              replaced="which each save replaces whole", held=lambda path: save_dir_held(path, cfg)))
    if cfg.metrics_out:
        outputs.append(Output("--metrics-out", Path(cfg.metrics_out), False, "the metrics log",
                              held=_not_the_runs_log(cfg) if cfg.resume else None,  # a resumed run goes on with its own
                              hint=", or --resume the run that wrote it"))
    root = cfg.checkpoint_dir or cfg.resume
    if cfg.checkpoint_every and root:
        outputs.append(Output("--checkpoint-dir" if cfg.checkpoint_dir else "--resume", Path(root), True,
                              "the training checkpoints", replaced=f"which prunes its {PREFIX}* directories to the "
                              f"newest --keep-checkpoints", replaces=_in_a_step_dir, held=_another_runs(cfg)))
    elif cfg.checkpoint_every:  # a new directory named after the twin, known once it is built: where it is made
        outputs.append(Output("--checkpoint-dir (default)", checkpoint_root(cfg, "").parent, True,
                              "the training checkpoints"))
    if cfg.resume and (cfg.checkpoint_dir or not cfg.checkpoint_every):  # read only, not written to
        outputs.append(Output("--resume", Path(cfg.resume), True, "the training checkpoints this run resumes from",
                              read=True))
    if cfg.init_from:
        outputs.append(Output("--init-from", Path(cfg.init_from), True, "the checkpoint this run starts from",
                              read=True))
    return outputs


def evaluate(twin: Twin, state: Any, split: Any, cfg: Config) -> tuple[float, float]:
    """``(mean loss, metric)`` over every example of ``split`` once (sums, divided once): the classifier's mean BCE
    and accuracy, the language model's mean cross-entropy per token and perplexity (:mod:`common.workloads`)."""
    workload = workload_of(cfg)
    if not len(split):
        return math.nan, math.nan
    sums, carry = [], twin.init_carry(workload.eval_batch_size(cfg))
    for batch in workload.eval_batches(split, cfg):  # dispatched, then read
        interrupts.check()
        carry, batch_sums = twin.eval_step(state, carry, batch)
        sums.append(batch_sums)
    loss_sum, second = twin.sum_over_processes(math.fsum(float(s) for s, _ in sums), sum(float(c) for _, c in sums))
    return workload.summarise(loss_sum, second, split)


def train(cfg: Config, make_twin: Callable[[Config, int], Twin]) -> dict[str, Any]:
    """Train as the seed does (see common.config for every knob). ``make_twin(cfg, vocab_size)`` builds the
    framework's side once the data is known. Returns the run's result: test_loss, test_<metric>, val_loss,
    val_<metric> (the metric: accuracy, or the LM's perplexity), best_val_loss, lr (the last), steps, skipped_steps,
    train_seconds, and the twin's record. Ctrl-C ends it with a
    ``KeyboardInterrupt`` saying the step and where to resume (:mod:`common.interrupts`), never inside a save."""
    with interrupts.handled():
        return _train(cfg, make_twin)


def _train(cfg: Config, make_twin: Callable[[Config, int], Twin]) -> dict[str, Any]:
    step, resumable = None, cfg.resume  # resumable: where the newest complete training checkpoint is
    interrupts.describe = lambda: (f"interrupted {'before training' if step is None else f'at step {step}'}; " + (
        f"resume with --resume {resumable}" if resumable else "no training checkpoint to resume from"))
    # Every output checked at once, on every process (they see the same files), before the corpus is read.
    cfg, data, params = load_run(cfg, before_data=lambda cfg: check_outputs(run_outputs(cfg), cfg.overwrite))
    workload = workload_of(cfg)
    twin = make_twin(cfg, len(data.vocab))
    is_main = twin.is_main
    if is_main:
        print(workload.read_line(data))
    if cfg.save_dir and is_main:  # the one part known only now: whether the checkpoint there has this vocabulary
        check_save_dir(cfg.save_dir, cfg, data.vocab, cfg.overwrite)
    run_dir = checkpoint_root(cfg, f"{twin.record['framework']}_impl") if cfg.checkpoint_every else None
    if run_dir is not None and is_main:
        claim_run_dir(run_dir, cfg)  # another run's: refused above without --overwrite, removed now with it

    state, carry = twin.init_state(params), None
    progress = Progress(step=0, epoch=0, batch=0)
    if cfg.resume:
        with interrupts.deferred():  # Orbax reads in threads of its own
            progress, (state, carry), path = load_latest(
                cfg.resume, lambda p: twin.restore_state(p, state, twin.init_carry()), cfg=cfg,
                vocab_size=len(data.vocab), framework=twin.record["framework"], lstm_impl_ran=twin.record["lstm_impl"])
        if is_main:
            print(f"resumed from {path} (step {progress.step}, epoch {progress.epoch + 1}, batch {progress.batch})",
                  file=sys.stderr)
    elif run_dir is not None and is_main:
        print(f"training checkpoints: {run_dir} (continue a stopped run with --resume {run_dir})", file=sys.stderr)

    per_epoch = workload.per_epoch(data.train, cfg)
    total = min(cfg.epochs * per_epoch, cfg.max_steps or math.inf)
    step, skipped, best_val_loss, last_val = progress.step, progress.skipped, progress.best_val_loss, progress.last_val
    lr = cfg.lr if progress.lr is None else progress.lr
    if lr != cfg.lr:
        state = twin.set_lr(state, lr)
    settings = trajectory_settings(cfg, len(data.vocab), twin.record["lstm_impl"])
    # One id for the run, in its metrics log's first record and every training checkpoint's progress record: how a
    # resume knows its own log (a checkpoint written before ids has none: the run takes one from here on).
    run_id = progress.run_id or uuid.uuid4().hex
    train_seconds = 0.0
    with interrupts.deferred():  # a resumed run rewrites the file's kept records
        metrics = MetricsLog(cfg.metrics_out if is_main else None,
                             truncate_after=progress.step if cfg.resume else None, run_id=run_id)
    if not metrics.continued:
        metrics.write(step=0, run=twin.record, run_id=run_id)

    metric = workload.metric  # accuracy or perplexity

    def validate() -> None:
        nonlocal last_val
        loss, value = evaluate(twin, state, data.val, cfg)
        last_val = {"step": step, "loss": loss, metric: value}
        metrics.write(step=step, split="val", loss=loss, **{metric: value}, train_seconds=round(train_seconds, 4))

    def keep_if_best(epoch: int, epoch_end: bool) -> None:
        """The best validation loss so far (epoch ends and the run's end): --save-dir keeps its weights; at an
        epoch's end that is not the best, the learning rate is divided by --lr-decay (the LM example's annealing)."""
        nonlocal best_val_loss, lr, state
        if best_val_loss is None or last_val["loss"] < best_val_loss:
            best_val_loss = last_val["loss"]
            if cfg.save_dir and is_main:
                with interrupts.deferred():
                    save_checkpoint(cfg.save_dir, twin.export_params(state), cfg, data.vocab, data.tokenizer,
                                    meta={**twin.record, "step": step, "epoch": epoch + 1,
                                          "val_loss": last_val["loss"], f"val_{metric}": last_val[metric]})
        elif epoch_end and cfg.lr_decay != 1:
            lr /= cfg.lr_decay
            state = twin.set_lr(state, lr)
            metrics.write(step=step, lr=lr)

    steps = train_steps(twin, state, data.train, cfg, progress, carry, epochs=cfg.epochs)
    with metrics, tqdm(total=total, initial=step, disable=not (cfg.progress and is_main), desc="train", unit="step",
                       dynamic_ncols=True) as bar:
        for s in itertools.islice(steps, max(0, total - step)):
            interrupts.check()
            step, state, carry, loss = s.number, s.state, s.carry, s.loss
            train_seconds += s.seconds
            finite = math.isfinite(loss)
            if not finite:
                if not cfg.skip_nonfinite:
                    raise NonFiniteError(
                        f"step {step} (epoch {s.epoch + 1}): the loss or gradient is not finite (loss {loss}); "
                        f"training stopped, the last good training checkpoint (if any) is kept. Lower --lr, "
                        f"or pass --skip-nonfinite to skip such steps")
                skipped += 1
            metrics.write(step=step, epoch=s.epoch + 1, loss=loss if finite else None,
                          train_seconds=round(train_seconds, 4))
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

            stop = step >= total
            if cfg.log_every and step % cfg.log_every == 0:
                validate()
                if is_main:
                    bar.write(log_line(s.epoch + 1, cfg.epochs, step, loss, last_val["loss"], last_val[metric],
                                       metric, lr))
            if s.epoch_end or stop:  # every epoch's end, and where --max-steps stops the run
                if last_val is None or last_val["step"] != step:
                    validate()
                keep_if_best(s.epoch, s.epoch_end)
            if run_dir is not None and (step % cfg.checkpoint_every == 0 or s.epoch_end or stop):
                where = (s.epoch + 1, 0) if s.epoch_end else (s.epoch, s.index + 1)
                with interrupts.deferred():
                    twin.save_state(run_dir, Progress(step, *where, skipped, best_val_loss, settings, last_val, lr,
                                                      run_id), state, carry, cfg.keep_checkpoints)
                    resumable = run_dir
        if last_val is None or last_val["step"] != step:  # e.g. a run of no steps
            validate()
        if cfg.save_dir and best_val_loss is not None:
            state = twin.import_params(state, lambda: load_checkpoint(cfg.save_dir, cfg).params)
        test_loss, test_value = evaluate(twin, state, data.test, cfg)
        metrics.write(step=step, split="test", loss=test_loss, **{metric: test_value},
                      train_seconds=round(train_seconds, 4))

    result = {"test_loss": test_loss, f"test_{metric}": test_value, "val_loss": last_val["loss"],
              f"val_{metric}": last_val[metric], "best_val_loss": best_val_loss, "lr": lr, "steps": step,
              "skipped_steps": skipped, "train_seconds": train_seconds, **twin.record}
    if is_main:
        short = {"accuracy": "acc", "perplexity": "ppl"}[metric]
        print(f"done: {step} steps ({skipped} skipped) in {train_seconds:.1f}s of training; "
              f"val loss {result['val_loss']:.4f} {short} {last_val[metric]:.4f}; "
              f"test loss {test_loss:.4f} {short} {test_value:.4f}")
    return result

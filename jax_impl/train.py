"""Training in JAX: the state, the pure jitted steps, and the loop and CLI ``python -m jax_impl.train``.

    state, carry, metrics = train_step(state, carry, batch, key)     # jitted, state donated
    loss_sum, correct     = eval_step(params, batch)                 # jitted, zero carry

Everything random comes from keys: the dropout key of a step is ``fold_in(key(cfg.seed), state.step)``. The
loop around the steps is the same program as ``torch_impl.train`` (same flags, data order, carry modes, log
line, metrics JSONL, neutral checkpoints, training checkpoints). ``--devices N`` runs the same jitted steps
data-parallel over N devices: only where arrays are placed changes (:mod:`jax_impl.distributed`).
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from tqdm import tqdm

from common.batches import Batch, batches, num_train_batches
from common.checkpoint import load_checkpoint, save_checkpoint
from common.config import Config, parse_config
from common.data import EncodedSplit, prepare_data
from common.errors import CheckpointError, ConfigError, UserError, cli_main
from common.files import check_writable
from common.metrics import MetricsLog, log_line
from common.params import init_params
from common.runstate import Progress, checkpoint_root, load_latest, trajectory_settings, write_checkpoint
from jax_impl.convert import from_flax, to_flax
from jax_impl.distributed import (Where, from_main_process, initialize_from_environment, is_main_process, placement,
                                  put, put_key)
from jax_impl.loss import bce_loss, bce_per_example, predictions
from jax_impl.model import Carry, SentimentRNN, init_carry, model_from_config, param_dtype_for
from jax_impl.optim import global_norm_torch, make_optimizer
from jax_impl.state import load_training_state, save_training_state

PROG = "python -m jax_impl.train"


class NonFiniteError(UserError):
    """A training step produced a non-finite loss or gradient (and --skip-nonfinite was not given)."""


class TrainState(struct.PyTreeNode):
    """``params`` (Flax pytree), ``opt_state`` (optax), ``step`` (int32 scalar: steps taken, skipped included)."""

    params: Any
    opt_state: Any
    step: jax.Array


class StepMetrics(struct.PyTreeNode):
    """Per step: ``loss`` (the batch's mean BCE before the update), ``grad_norm`` (‖g‖₂ before clipping),
    ``finite`` (both finite; when False and --skip-nonfinite, the update was not applied)."""

    loss: jax.Array
    grad_norm: jax.Array
    finite: jax.Array


DeviceBatch = dict[str, jax.Array]  # "tokens" (B, T) int32, "labels" (B,) float32, "lengths" (B,) int32[, "weights"]


# ---------------------------------------------------------------- devices and dtypes


def select_device(name: str) -> jax.Device:
    """``--device`` → a JAX device: auto (JAX's default backend: an accelerator when present), cpu, gpu
    (alias cuda) or tpu. A platform JAX cannot see is a :class:`ConfigError`."""
    platforms = {"auto": None, "cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "tpu": "tpu"}
    if name not in platforms:
        raise ConfigError(f"--device must be one of {', '.join(platforms)}, got {name!r}")
    platform = platforms[name]
    try:
        # This process's first device (on several hosts, jax.devices()[0] belongs to process 0).
        return jax.local_devices(backend=platform)[0] if platform else jax.local_devices()[0]
    except RuntimeError:
        seen = ", ".join(sorted({d.platform for d in jax.devices()}))
        raise ConfigError(f"--device {name}: JAX sees no {platform} device here (it sees: {seen}); "
                          f"install the matching jax build or use --device cpu") from None


def enable_x64_if_needed(dtype: str) -> None:
    """float64 needs JAX's x64 mode, switched on at the entry boundary before any array is made."""
    if dtype == "float64" and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)


def carry_dtype(model: SentimentRNN) -> Any:
    """The carry's dtype: float32 under bfloat16 compute (the state keeps full precision), else the compute dtype."""
    return param_dtype_for(model.dtype)


def zero_carry(model: SentimentRNN, batch_size: int, device: Where | None = None) -> Carry:
    """The zero carry for ``model``; placed on (committed to) ``device`` when one is given (a device, or a
    batch-axis sharding under --devices).

    The training loop always passes its device: jit compiles again when an argument switches between
    committed and uncommitted placement, so everything a step sees is committed to the same device."""
    carry = init_carry(batch_size, model.layers, model.hidden_dim, carry_dtype(model))
    return carry if device is None else jax.device_put(carry, device)


# ---------------------------------------------------------------- batches


def batch_to_device(batch: Batch, device: Where | None = None) -> DeviceBatch:
    """A numpy :class:`common.batches.Batch` → ``{"tokens" (B, T) int32, "labels" (B,) float32,
    "lengths" (B,) int32}`` on ``device`` (default: JAX's default device)."""
    arrays = {"tokens": np.asarray(batch.tokens, np.int32), "labels": np.asarray(batch.labels, np.float32),
              "lengths": np.asarray(batch.lengths, np.int32)}
    return {k: put(v, device) for k, v in arrays.items()}


def padded_eval_batch(batch: Batch, batch_size: int, device: Where | None = None) -> DeviceBatch:
    """An evaluation batch padded up to ``batch_size`` rows, with ``"weights"`` (B,) 1 for real rows and 0
    for padding, so ``eval_step`` compiles once for every batch of a split."""
    n = batch.size
    pad = batch_size - n

    def grow(a: np.ndarray, fill: int) -> np.ndarray:
        return np.concatenate([a, np.full((pad, *a.shape[1:]), fill, a.dtype)]) if pad else a

    padded = Batch(grow(batch.tokens, 0), grow(batch.labels, 0), grow(batch.lengths, 1))
    out = batch_to_device(padded, device)
    out["weights"] = put(np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)]), device)
    return out


# ---------------------------------------------------------------- forward pass and loss


def forward(model: SentimentRNN, params: Any, batch: DeviceBatch, carry: Carry, key: jax.Array, *, train: bool,
            use_lengths: bool, tbptt: int = 0, truncate_chunks: bool = True) -> tuple[jax.Array, Carry]:
    """Logits (B,) of the final step and the new carry, for the whole batch or in truncated-BPTT chunks.

    ``tbptt`` K (0 < K < T): the T steps run as chunks of K (a ``lax.scan`` over the full chunks, then a
    shorter last chunk when K does not divide T), the carry passed from chunk to chunk. ``truncate_chunks``
    puts a ``stop_gradient`` on the carry at every chunk boundary: that is what makes the gradient truncated
    (without it, it is the full-BPTT gradient). The loss reads only the final chunk's logits.
    """
    lengths = batch["lengths"] if use_lengths else None
    tokens = batch["tokens"]
    seq_len = tokens.shape[1]
    if not tbptt or tbptt >= seq_len:
        return model.apply({"params": params}, tokens, carry, lengths, train=train, rngs={"dropout": key})

    def run_chunk(carry: Carry, chunk: jax.Array, index: jax.Array) -> tuple[jax.Array, Carry]:
        logits, carry = model.apply({"params": params}, chunk, carry, None, train=train,
                                    rngs={"dropout": jax.random.fold_in(key, index)})
        if truncate_chunks:
            carry = jax.lax.stop_gradient(carry)  # the chunk boundary: no gradient into earlier chunks
        return logits, carry

    full, rest = divmod(seq_len, tbptt)
    chunks = tokens[:, :full * tbptt].reshape(tokens.shape[0], full, tbptt).swapaxes(0, 1)  # (n, B, K)

    def body(carry: Carry, xs: tuple[jax.Array, jax.Array]) -> tuple[Carry, jax.Array]:
        index, chunk = xs
        logits, carry = run_chunk(carry, chunk, index)
        return carry, logits

    carry, chunk_logits = jax.lax.scan(body, carry, (jnp.arange(full, dtype=jnp.int32), chunks))
    logits = chunk_logits[-1]
    if rest:
        logits, carry = run_chunk(carry, tokens[:, full * tbptt:], jnp.int32(full))
    return logits, carry


def make_loss_fn(model: SentimentRNN, cfg: Config, *, truncate_chunks: bool = True
                 ) -> Callable[[Any, Carry, DeviceBatch, jax.Array], tuple[jax.Array, Carry]]:
    """``loss_fn(params, carry, batch, dropout_key) -> (mean BCE, new carry)`` in training mode."""
    use_lengths = cfg.padding == "right"

    def loss_fn(params: Any, carry: Carry, batch: DeviceBatch, dropout_key: jax.Array) -> tuple[jax.Array, Carry]:
        if cfg.detach:
            # The seed's h.detach() (truncation at the batch boundary). In JAX the incoming carry is an input
            # of this function, not a graph reaching into the previous batch, so the parameter gradient is
            # the same with or without it (--no-detach changes nothing there, unlike PyTorch's error); it
            # zeroes d loss / d carry and states the intent.
            carry = jax.lax.stop_gradient(carry)
        logits, new_carry = forward(model, params, batch, carry, dropout_key, train=True, use_lengths=use_lengths,
                                    tbptt=cfg.tbptt, truncate_chunks=truncate_chunks)
        return bce_loss(logits, batch["labels"]), new_carry

    return loss_fn


# ---------------------------------------------------------------- steps


def create_train_state(model: SentimentRNN, cfg: Config, neutral_params: dict[str, np.ndarray],
                       device: Where | None = None) -> TrainState:
    """The starting state from neutral parameters (common.params.init_params or a checkpoint): float32
    params (float64 under --dtype float64), a fresh optimizer state, step 0."""
    params = jax.device_put(to_flax(neutral_params, dtype=param_dtype_for(model.dtype)), device)
    state = TrainState(params=params, opt_state=make_optimizer(cfg).init(params), step=np.int32(0))
    return jax.device_put(state, device)  # one placement for all of it (see zero_carry)


def make_train_step(model: SentimentRNN, cfg: Config, *, truncate_chunks: bool = True
                    ) -> Callable[[TrainState, Carry, DeviceBatch, jax.Array], tuple[TrainState, Carry, StepMetrics]]:
    """The jitted pure step ``train_step(state, carry, batch, key) -> (state, carry, metrics)``; ``state``
    is donated. ``key`` is the run's base key; the step's dropout key is ``fold_in(key, state.step)``.
    ``truncate_chunks`` (tests only) switches off the stop_gradient at --tbptt chunk boundaries."""
    tx = make_optimizer(cfg)
    grad_fn = jax.value_and_grad(make_loss_fn(model, cfg, truncate_chunks=truncate_chunks), has_aux=True)

    def train_step(state: TrainState, carry: Carry, batch: DeviceBatch, key: jax.Array
                   ) -> tuple[TrainState, Carry, StepMetrics]:
        (loss, new_carry), grads = grad_fn(state.params, carry, batch, jax.random.fold_in(key, state.step))
        grad_norm = global_norm_torch(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if cfg.skip_nonfinite:
            # A non-finite step leaves params, optimizer state and carry as they were (inside the jitted
            # step, so nothing leaves the device to decide it).
            def keep_if_bad(new: Any, old: Any) -> Any:
                return jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)

            params = keep_if_bad(params, state.params)
            opt_state = keep_if_bad(opt_state, state.opt_state)
            new_carry = keep_if_bad(new_carry, carry)
        new_state = TrainState(params=params, opt_state=opt_state, step=state.step + 1)
        return new_state, new_carry, StepMetrics(loss=loss, grad_norm=grad_norm, finite=finite)

    return jax.jit(train_step, donate_argnums=(0,))


def make_eval_step(model: SentimentRNN, cfg: Config) -> Callable[[Any, DeviceBatch], tuple[jax.Array, jax.Array]]:
    """The jitted ``eval_step(params, batch) -> (loss_sum, correct)``: from a zero carry, no dropout; sums
    weighted by ``batch["weights"]`` (padding rows weigh 0)."""
    use_lengths = cfg.padding == "right"

    def eval_step(params: Any, batch: DeviceBatch) -> tuple[jax.Array, jax.Array]:
        carry = zero_carry(model, batch["tokens"].shape[0])
        lengths = batch["lengths"] if use_lengths else None
        logits, _ = model.apply({"params": params}, batch["tokens"], carry, lengths, train=False)
        real = batch["weights"] > 0
        losses = jnp.where(real, bce_per_example(logits, batch["labels"]), 0)
        correct = jnp.where(real, predictions(logits) == batch["labels"].astype(logits.dtype), False)
        return jnp.sum(losses), jnp.sum(correct.astype(jnp.int32))

    return jax.jit(eval_step)


def evaluate(eval_step: Callable, params: Any, split: EncodedSplit, batch_size: int,
             device: Where | None = None) -> tuple[float, float]:
    """``(mean loss, accuracy)`` over every example of ``split`` (sums over examples, divided once)."""
    # Per-batch sums stay on the device until the end: one transfer, no sync per batch.
    sums = [eval_step(params, padded_eval_batch(b, batch_size, device)) for b in batches(split, batch_size)]
    if not sums:
        return math.nan, math.nan
    host = jax.device_get(sums)
    loss_sum = float(np.sum([np.float64(loss) for loss, _ in host]))
    correct = int(np.sum([int(c) for _, c in host]))
    return loss_sum / len(split), correct / len(split)


# ---------------------------------------------------------------- the training loop


def train(cfg: Config) -> dict[str, Any]:
    """Train as the seed does (see common.config for every knob); returns the run's summary: test_loss,
    test_accuracy, val_loss, val_accuracy, best_val_loss, steps, train_seconds, skipped_steps, ..."""
    enable_x64_if_needed(cfg.dtype)
    device = select_device(cfg.device)
    with jax.default_device(device):
        return _train(cfg, device)


def _load_run(cfg: Config) -> tuple[Config, Any, dict[str, np.ndarray]]:
    """``(cfg, data, initial neutral params)``: from --init-from (its weights, vocabulary and tokenizer, and
    its model settings in ``cfg``) or the shared seeded initialisation."""
    if cfg.init_from:
        ckpt = load_checkpoint(cfg.init_from, cfg)
        return ckpt.config, prepare_data(ckpt.config, vocab=ckpt.vocab, tokenizer=ckpt.tokenizer), ckpt.params
    data = prepare_data(cfg)
    return cfg, data, init_params(len(data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)


def _train(cfg: Config, device: jax.Device) -> dict[str, Any]:
    cfg, data, neutral = _load_run(cfg)
    # --devices: batches and the carry are split over the devices along the batch axis, the rest replicated;
    # on one device both placements are `device` itself.
    place = placement(cfg, device)
    is_main = is_main_process()  # the process that prints and writes files (always, on one host)
    if cfg.save_dir and is_main:
        check_writable(Path(cfg.save_dir), "--save-dir")
    run_dir = checkpoint_root(cfg, "jax_impl") if cfg.checkpoint_every else None
    if run_dir is not None:
        check_writable(run_dir, "training checkpoints:")

    model = model_from_config(cfg, len(data.vocab))
    train_step = make_train_step(model, cfg)
    eval_step = make_eval_step(model, cfg)
    base_key = put_key(jax.random.key(cfg.seed), place.replicated)  # dropout: fold_in(base_key, step)
    state = create_train_state(model, cfg, neutral, place.replicated)
    carry = zero_carry(model, cfg.batch_size, place.data)

    progress = Progress(step=0, epoch=0, batch=0)
    if cfg.resume:
        progress, (state, carry), path = load_latest(
            cfg.resume, lambda p: load_training_state(p, state, zero_carry(model, cfg.batch_size, place.data)),
            cfg=cfg)
        if int(state.step) != progress.step:
            raise CheckpointError(f"{path}: progress.json says step {progress.step}, the training state "
                                  f"{int(state.step)}")
        print(f"resumed from {path} (step {progress.step}, epoch {progress.epoch + 1}, batch {progress.batch})",
              file=sys.stderr)
    elif run_dir is not None:
        print(f"training checkpoints: {run_dir} (continue a stopped run with --resume {run_dir})", file=sys.stderr)

    per_epoch = num_train_batches(len(data.train), cfg.batch_size)
    total = min(cfg.epochs * per_epoch, cfg.max_steps) if cfg.max_steps else cfg.epochs * per_epoch
    step, skipped, best_val_loss = progress.step, progress.skipped, progress.best_val_loss
    settings = trajectory_settings(cfg)
    last_val: dict[str, float] | None = None  # {"step", "loss", "accuracy"} of the latest validation
    train_seconds = 0.0
    metrics = MetricsLog(cfg.metrics_out if is_main else None, truncate_after=progress.step if cfg.resume else None)

    def validate() -> None:
        nonlocal last_val
        loss, accuracy = evaluate(eval_step, state.params, data.val, cfg.batch_size, place.data)
        last_val = {"step": step, "loss": loss, "accuracy": accuracy}
        metrics.write(step=step, split="val", loss=loss, accuracy=accuracy, train_seconds=round(train_seconds, 4))

    def keep_if_best(epoch: int) -> None:
        """--save-dir: the weights of the best validation loss so far (epoch ends and the run's end)."""
        nonlocal best_val_loss
        if cfg.save_dir and (best_val_loss is None or last_val["loss"] < best_val_loss):
            best_val_loss = last_val["loss"]
            if is_main:
                save_checkpoint(cfg.save_dir, from_flax(state.params), cfg, data.vocab, data.tokenizer,
                                meta={"framework": "jax", "jax": jax.__version__, "step": step, "epoch": epoch + 1,
                                      "val_loss": last_val["loss"], "val_accuracy": last_val["accuracy"]})

    with metrics, tqdm(total=total, initial=step, disable=not (cfg.progress and is_main), desc="train", unit="step",
                       dynamic_ncols=True) as bar:
        for epoch in range(progress.epoch, cfg.epochs):
            if step >= total:
                break
            start = progress.batch if epoch == progress.epoch else 0
            if start == 0:
                carry = zero_carry(model, cfg.batch_size, place.data)  # zeros at the start of every epoch
            for i, batch in enumerate(batches(data.train, cfg.batch_size, shuffle_seed=cfg.seed, epoch=epoch,
                                              start=start), start=start):
                if cfg.carry == "reset":
                    carry = zero_carry(model, cfg.batch_size, place.data)
                tic = time.perf_counter()
                state, carry, step_metrics = train_step(state, carry, batch_to_device(batch, place.data), base_key)
                loss, finite = float(step_metrics.loss), bool(step_metrics.finite)  # the step's one host sync
                train_seconds += time.perf_counter() - tic
                step += 1
                if not finite:
                    if not cfg.skip_nonfinite:
                        raise NonFiniteError(
                            f"step {step} (epoch {epoch + 1}): the loss or gradient is not finite (loss {loss}, "
                            f"gradient norm {float(step_metrics.grad_norm)}); training stopped, the last good "
                            f"training checkpoint (if any) is kept. Lower --lr, or pass --skip-nonfinite to skip "
                            f"such steps")
                    skipped += 1
                metrics.write(step=step, epoch=epoch + 1, loss=loss if finite else None, train_seconds=round(train_seconds, 4))
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

                epoch_end, stop = i + 1 == per_epoch, step >= total
                if cfg.log_every and step % cfg.log_every == 0:
                    validate()
                    if is_main:
                        bar.write(log_line(epoch + 1, cfg.epochs, step, loss, last_val["loss"], last_val["accuracy"]))
                if epoch_end or stop:  # every epoch's end, and where --max-steps stops the run
                    if last_val is None or last_val["step"] != step:
                        validate()
                    keep_if_best(epoch)
                if run_dir is not None and (step % cfg.checkpoint_every == 0 or epoch_end or stop):
                    after = Progress(step, epoch + 1, 0, skipped, best_val_loss, settings) if epoch_end else \
                        Progress(step, epoch, i + 1, skipped, best_val_loss, settings)
                    write_checkpoint(run_dir, after, lambda d: save_training_state(d, state, carry),
                                     keep=cfg.keep_checkpoints)
                if stop:
                    break
        if last_val is None or last_val["step"] != step:  # e.g. resumed at the very end
            validate()

        # The test split scores the best validation weights when --save-dir keeps them, else the final ones.
        test_params = state.params
        if cfg.save_dir and best_val_loss is not None:
            best = from_main_process(lambda: to_flax(load_checkpoint(cfg.save_dir, cfg).params,
                                                     dtype=param_dtype_for(model.dtype)), like=state.params)
            test_params = jax.device_put(best, place.replicated)
        test_loss, test_accuracy = evaluate(eval_step, test_params, data.test, cfg.batch_size, place.data)
        metrics.write(step=step, split="test", loss=test_loss, accuracy=test_accuracy, train_seconds=round(train_seconds, 4))

    result = {"test_loss": test_loss, "test_accuracy": test_accuracy, "val_loss": last_val["loss"],
              "val_accuracy": last_val["accuracy"], "best_val_loss": best_val_loss, "steps": step,
              "train_seconds": train_seconds, "skipped_steps": skipped, "framework": "jax",
              "device": place.describe(), "devices": place.devices, "dtype": cfg.dtype}
    if is_main:
        print(f"done: {step} steps ({skipped} skipped) in {train_seconds:.1f}s of training; "
              f"val loss {result['val_loss']:.4f} acc {result['val_accuracy']:.4f}; "
              f"test loss {test_loss:.4f} acc {test_accuracy:.4f}")
    return result


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv, PROG, "Train the LSTM sentiment classifier with JAX/Flax.")
    initialize_from_environment()  # several hosts (JAX_COORDINATOR_ADDRESS set): before any device is touched
    enable_x64_if_needed(cfg.dtype)  # before any array exists
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The JAX twin's steps: the training state, and the pure functions that jit compiles.

    state, carry, metrics = train_step(state, carry, batch, key)     # jitted, state donated
    loss_sum, correct     = eval_step(params, batch)                 # jitted, zero carry

Two ``jax.lax.stop_gradient`` s on the carry. The seed's ``h.detach()`` is the one in :func:`make_loss_fn`, at the
batch boundary: the incoming carry is an input of the loss, not a graph reaching into the previous batch, so it
changes no parameter gradient (it zeroes d loss / d carry and states the intent). The one that truncates a gradient
is in :func:`forward`, at each ``--tbptt`` chunk boundary inside a batch. Everything random comes from keys: the
dropout key of a step is ``fold_in(key(cfg.seed), state.step)``.
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from common.batches import Batch
from common.config import Config
from common.errors import ConfigError
from jax_impl.convert import to_flax
from jax_impl.distributed import Where
from jax_impl.loss import bce_loss, bce_per_example, predictions
from jax_impl.model import SentimentRNN
from jax_impl.numerics import compute_dtype, param_dtype_for
from jax_impl.recurrences.stacks import Carry
from jax_impl.optim import global_norm_torch, make_optimizer


class TrainState(struct.PyTreeNode):
    """``params`` (Flax pytree), ``opt_state`` (optax, the learning rate in it), ``step`` (int32 scalar: steps taken,
    skipped included)."""

    params: Any
    opt_state: Any
    step: jax.Array


class StepMetrics(struct.PyTreeNode):
    """Per step: ``loss`` (the batch's mean BCE before the update), ``finite`` (the loss and the gradient;
    when False and --skip-nonfinite, the update was not applied)."""

    loss: jax.Array
    finite: jax.Array


DeviceBatch = dict[str, jax.Array]  # "tokens" (B, T) int32, "labels" (B,) float32, "lengths" (B,) int32[, "weights"]


def resolve_device(name: str) -> jax.Device:
    """``--device`` → a JAX device: auto (JAX's default backend: an accelerator when present), cpu, gpu
    (alias cuda) or tpu. A platform JAX cannot see is a :class:`ConfigError`."""
    platform = {"auto": None, "cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "tpu": "tpu"}[name]
    try:
        # This process's first device (on several hosts, jax.devices()[0] belongs to process 0).
        return jax.local_devices(backend=platform)[0] if platform else jax.local_devices()[0]
    except RuntimeError:
        seen = ", ".join(sorted({d.platform for d in jax.devices()}))
        raise ConfigError(f"--device {name}: JAX sees no {platform} device here (it sees: {seen}); "
                          f"install the matching jax build or use --device cpu") from None


def resolve_dtype(name: str) -> Any:
    """``--dtype`` → the compute dtype; float64 switches on JAX's x64 mode, before any array is made."""
    if name == "float64" and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)
    return compute_dtype(name)


def batch_to_device(batch: Batch, device: Where | None = None) -> DeviceBatch:
    """A numpy :class:`common.batches.Batch` → ``{"tokens" (B, T) int32, "labels" (B,) float32,
    "lengths" (B,) int32}`` on ``device`` (default: JAX's default device)."""
    arrays = {"tokens": np.asarray(batch.tokens, np.int32), "labels": np.asarray(batch.labels, np.float32),
              "lengths": np.asarray(batch.lengths, np.int32)}
    return {k: jax.device_put(v, device) for k, v in arrays.items()}


def padded_eval_batch(batch: Batch, batch_size: int, device: Where | None = None) -> DeviceBatch:
    """An evaluation batch padded up to ``batch_size`` rows, with ``"weights"`` (B,) 1 for real rows and 0
    for padding, so ``eval_step`` compiles once for every batch of a split."""
    n, pad = batch.size, batch_size - batch.size

    def grow(a: np.ndarray, fill: int) -> np.ndarray:
        return np.concatenate([a, np.full((pad, *a.shape[1:]), fill, a.dtype)]) if pad else a

    padded = Batch(grow(batch.tokens, 0), grow(batch.labels, 0), grow(batch.lengths, 1))
    weights = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)])
    return {**batch_to_device(padded, device), "weights": jax.device_put(weights, device)}


def forward(model: SentimentRNN, params: Any, batch: DeviceBatch, carry: Carry, key: jax.Array, *, train: bool,
            use_lengths: bool, tbptt: int = 0, truncate_chunks: bool = True) -> tuple[jax.Array, Carry]:
    """Logits (B,) of the final step and the new carry, for the whole batch or in truncated-BPTT chunks.

    ``tbptt`` K (0 < K < T): the T steps run as chunks of K (a ``lax.scan`` over the full chunks, then a
    shorter last chunk when K does not divide T), the carry passed from chunk to chunk. ``truncate_chunks``
    puts a ``stop_gradient`` on the carry at every chunk boundary: that is what makes the gradient truncated
    (without it, it is the full-BPTT gradient). The loss reads only the final chunk's logits.
    """
    tokens, lengths = batch["tokens"], batch["lengths"] if use_lengths else None
    seq_len = tokens.shape[1]
    if not tbptt or tbptt >= seq_len:
        return model.apply({"params": params}, tokens, carry, lengths, train=train, rngs={"dropout": key})

    def run_chunk(carry: Carry, xs: tuple[jax.Array, jax.Array]) -> tuple[Carry, jax.Array]:
        """``xs``: (chunk index, tokens (B, K)) → ``(carry, logits (B,))``, the shape of a ``lax.scan`` body."""
        index, chunk = xs
        logits, carry = model.apply({"params": params}, chunk, carry, None, train=train,
                                    rngs={"dropout": jax.random.fold_in(key, index)})
        if truncate_chunks:
            carry = jax.lax.stop_gradient(carry)  # the chunk boundary: no gradient into earlier chunks
        return carry, logits

    full, rest = divmod(seq_len, tbptt)
    chunks = tokens[:, :full * tbptt].reshape(tokens.shape[0], full, tbptt).swapaxes(0, 1)  # (n, B, K)
    carry, chunk_logits = jax.lax.scan(run_chunk, carry, (jnp.arange(full, dtype=jnp.int32), chunks))
    logits = chunk_logits[-1]
    if rest:
        carry, logits = run_chunk(carry, (jnp.int32(full), tokens[:, full * tbptt:]))
    return logits, carry


def make_loss_fn(model: SentimentRNN, cfg: Config, *, truncate_chunks: bool = True
                 ) -> Callable[[Any, Carry, DeviceBatch, jax.Array], tuple[jax.Array, Carry]]:
    """``loss_fn(params, carry, batch, dropout_key) -> (mean BCE, new carry)`` in training mode."""
    def loss_fn(params: Any, carry: Carry, batch: DeviceBatch, dropout_key: jax.Array) -> tuple[jax.Array, Carry]:
        if cfg.detach:
            # The seed's h.detach() (truncation at the batch boundary). In JAX the incoming carry is an input
            # of this function, not a graph reaching into the previous batch, so the parameter gradient is
            # the same with or without it (--no-detach changes nothing there, unlike PyTorch's error); it
            # zeroes d loss / d carry and states the intent.
            carry = jax.lax.stop_gradient(carry)
        logits, new_carry = forward(model, params, batch, carry, dropout_key, train=True, tbptt=cfg.tbptt,
                                    use_lengths=cfg.padding == "right", truncate_chunks=truncate_chunks)
        return bce_loss(logits, batch["labels"]), new_carry

    return loss_fn


def create_train_state(model: Any, cfg: Config, neutral_params: dict[str, np.ndarray],
                       device: Where | None = None, convert: Callable[..., Any] = to_flax) -> TrainState:
    """The starting state from neutral parameters (common.params.init_params or a checkpoint; ``convert``: the
    workload's neutral → Flax tree): float32 params (float64 under --dtype float64), a fresh optimizer state,
    step 0."""
    params = jax.device_put(convert(neutral_params, dtype=param_dtype_for(model.dtype)), device)
    state = TrainState(params=params, opt_state=make_optimizer(cfg).init(params), step=np.int32(0))
    # One committed placement for all of it: jit compiles again when an argument switches between committed and
    # uncommitted placement.
    return jax.device_put(state, device)


def make_update(cfg: Config) -> Callable[..., tuple[TrainState, Carry, StepMetrics]]:
    """The step's optimizer part, ``update(state, grads, loss, carry, new_carry) -> (state, carry, metrics)``:
    PyTorch's clipping and Adam (:func:`jax_impl.optim.make_optimizer`), and under --skip-nonfinite a non-finite
    step that leaves params, optimizer state and carry as they were (decided on the device)."""
    tx = make_optimizer(cfg)

    def update(state: TrainState, grads: Any, loss: jax.Array, carry: Carry, new_carry: Carry
               ) -> tuple[TrainState, Carry, StepMetrics]:
        finite = jnp.isfinite(loss) & jnp.isfinite(global_norm_torch(grads))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if cfg.skip_nonfinite:
            new, old = (params, opt_state, new_carry), (state.params, state.opt_state, carry)
            params, opt_state, new_carry = jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)
        return TrainState(params=params, opt_state=opt_state, step=state.step + 1), new_carry, StepMetrics(loss, finite)

    return update


def make_train_step(model: SentimentRNN, cfg: Config, *, truncate_chunks: bool = True
                    ) -> Callable[[TrainState, Carry, DeviceBatch, jax.Array], tuple[TrainState, Carry, StepMetrics]]:
    """The classifier's jitted pure step (:func:`jit_train_step` over :func:`make_loss_fn`). ``truncate_chunks``
    (tests only) switches off the stop_gradient at --tbptt chunk boundaries."""
    return jit_train_step(make_loss_fn(model, cfg, truncate_chunks=truncate_chunks), cfg)


def jit_train_step(loss_fn: Callable[[Any, Any, Any, jax.Array], tuple[jax.Array, Any]], cfg: Config
                   ) -> Callable[[TrainState, Any, Any, jax.Array], tuple[TrainState, Any, StepMetrics]]:
    """The jitted pure step ``train_step(state, carry, batch, key) -> (state, carry, metrics)`` of a workload's
    ``loss_fn(params, carry, batch, dropout_key) -> (loss, new carry)``; ``state`` is donated. ``key`` is the run's
    base key; the step's dropout key is ``fold_in(key, state.step)``."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    update = make_update(cfg)

    def train_step(state: TrainState, carry: Carry, batch: DeviceBatch, key: jax.Array
                   ) -> tuple[TrainState, Carry, StepMetrics]:
        (loss, new_carry), grads = grad_fn(state.params, carry, batch, jax.random.fold_in(key, state.step))
        return update(state, grads, loss, carry, new_carry)

    return jax.jit(train_step, donate_argnums=(0,))


def make_eval_step(model: SentimentRNN, cfg: Config) -> Callable[[Any, DeviceBatch], tuple[jax.Array, jax.Array]]:
    """The jitted ``eval_step(params, batch) -> (loss_sum, correct)``: from a zero carry, no dropout; sums
    weighted by ``batch["weights"]`` (padding rows weigh 0)."""
    def eval_step(params: Any, batch: DeviceBatch) -> tuple[jax.Array, jax.Array]:
        carry = model.zero_carry(batch["tokens"].shape[0])
        logits, _ = model.apply({"params": params}, batch["tokens"], carry,
                                batch["lengths"] if cfg.padding == "right" else None, train=False)
        return eval_sums(logits, batch)

    return jax.jit(eval_step)


def eval_sums(logits: jax.Array, batch: DeviceBatch) -> tuple[jax.Array, jax.Array]:
    """``(loss_sum, correct)`` of ``logits`` (B,) over the batch's real rows (``batch["weights"]`` > 0): the BCE sum and
    the number of right predictions."""
    real = batch["weights"] > 0
    losses = jnp.where(real, bce_per_example(logits, batch["labels"]), 0)
    correct = jnp.where(real, predictions(logits) == batch["labels"].astype(logits.dtype), False)
    return jnp.sum(losses), jnp.sum(correct.astype(jnp.int32))

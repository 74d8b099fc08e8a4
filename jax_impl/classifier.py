"""The classifier's JAX side, what the twin (:mod:`jax_impl.train`) asks of a workload, named as :mod:`jax_impl.lm`'s:
placement, model, converters, ``to_device``, the loss and the evaluation step.

    loss_fn(params, carry, batch, dropout_key) -> (mean BCE, carry)  # make_loss_fn(model, cfg)
    eval_step(params, batch) -> (loss_sum, correct)                  # make_eval_step(model, cfg), jitted

Two ``jax.lax.stop_gradient`` s on the carry: the seed's ``h.detach()`` at the batch boundary (:func:`make_loss_fn`),
and the one that truncates a gradient, at each ``--tbptt`` chunk boundary (:func:`forward`).
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from common.batches import Batch
from common.config import Config
from jax_impl.convert import from_flax, to_flax  # noqa: F401 (the workload's converters)
from jax_impl.distributed import Where, placement  # noqa: F401 (placement: the classifier trains data-parallel)
from jax_impl.loss import bce_loss, bce_sums
from jax_impl.model import SentimentRNN
from jax_impl.numerics import Carry, DeviceBatch, compute_dtype, matmul_precision
from jax_impl.recurrences import choice

def model_from_config(cfg: Config, vocab_size: int, platform: str | None = None, devices: int = 1) -> SentimentRNN:
    """The model a :class:`common.config.Config` describes: compute dtype ``cfg.dtype``, matmul precision from
    ``cfg.allow_tf32``, and the LSTM implementation :func:`jax_impl.recurrences.choice.resolve` picks for ``platform``
    and a mesh of ``devices``."""
    return SentimentRNN(vocab_size=vocab_size, embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
                        layers=cfg.layers, dropout=cfg.dropout, fc_dropout=cfg.fc_dropout,
                        dtype=compute_dtype(cfg.dtype),
                        lstm_impl=choice.resolve(cfg.lstm_impl, choice.Run.of(cfg, platform, devices)),
                        precision=matmul_precision(cfg.allow_tf32), embed_fold=cfg.embed_fold)


def to_device(batch: Batch, device: Where | None = None) -> DeviceBatch:
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
    return {**to_device(padded, device), "weights": jax.device_put(weights, device)}


def eval_inputs(carry: Carry, batch: Batch, cfg: Config, device: Where | None = None) -> tuple[DeviceBatch]:
    """The arguments of the jitted ``eval_step`` after the params: the batch padded to --batch-size rows (evaluation
    starts from its own zero carry, so ``carry`` is not one of them)."""
    return (padded_eval_batch(batch, cfg.batch_size, device),)


def evaluate(eval_step: Callable, params: Any, carry: Carry, batch: Batch, cfg: Config, device: Where | None = None
             ) -> tuple[Carry, tuple[jax.Array, jax.Array]]:
    """The twin's ``eval_step`` over the jitted one: ``(carry, (BCE sum, number correct))``, ``carry`` passed
    through."""
    return carry, eval_step(params, *eval_inputs(carry, batch, cfg, device))


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
    """``loss_fn(params, carry, batch, dropout_key) -> (mean BCE, new carry)`` in training mode. ``truncate_chunks``
    (tests only) switches off the stop_gradient at --tbptt chunk boundaries."""
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


def make_eval_step(model: SentimentRNN, cfg: Config) -> Callable[[Any, DeviceBatch], tuple[jax.Array, jax.Array]]:
    """The jitted ``eval_step(params, batch) -> (loss_sum, correct)``: from a zero carry, no dropout; sums
    weighted by ``batch["weights"]`` (padding rows weigh 0)."""
    def eval_step(params: Any, batch: DeviceBatch) -> tuple[jax.Array, jax.Array]:
        carry = model.zero_carry(batch["tokens"].shape[0])
        logits, _ = model.apply({"params": params}, batch["tokens"], carry,
                                batch["lengths"] if cfg.padding == "right" else None, train=False)
        return bce_sums(logits, batch["labels"], batch["weights"])

    return jax.jit(eval_step)


def timed_parts(model: SentimentRNN, device: Where) -> Callable[..., dict[str, float]]:
    """The workload's own parts of a timed training step, beyond forward, backward and optimizer: none."""
    return lambda state, batch, clock: {}

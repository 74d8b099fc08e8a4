"""Batches both twins iterate in the same order: numpy only, seeded, one definition."""
from dataclasses import dataclass
from typing import Iterator

import numpy as np


@dataclass(frozen=True)
class Batch:
    """``tokens`` (B, T) int32, ``labels`` (B,) float32 (1 positive), ``lengths`` (B,) int32 (≥ 1)."""

    tokens: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of ``range(n)`` for training epoch ``epoch`` (0-based): a function of (seed, epoch)
    alone, so a resumed run and the other twin draw the same order."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def num_train_batches(n: int, batch_size: int) -> int:
    return n // batch_size


def batches(split, batch_size: int, *, shuffle_seed: int | None = None, epoch: int = 0,
            start: int = 0) -> Iterator[Batch]:
    """:class:`Batch` es of ``split`` (an ``EncodedSplit``) from batch ``start`` on (resuming inside an epoch).
    Training (``shuffle_seed`` given): in :func:`epoch_order`, the last partial batch dropped (the carried state
    has a fixed batch shape). Evaluation: in order, every example exactly once, the last batch possibly smaller."""
    n = len(split.labels)
    order = np.arange(n) if shuffle_seed is None else epoch_order(n, shuffle_seed, epoch)
    stop = n if shuffle_seed is None else num_train_batches(n, batch_size) * batch_size
    for lo in range(start * batch_size, stop, batch_size):
        idx = order[lo: lo + batch_size]
        # A text with no tokens is read as one <pad>: packed sequences need a length of at least 1.
        yield Batch(split.tokens[idx], split.labels[idx], np.maximum(split.lengths[idx], 1))


def mean_distinct_tokens(batch_list) -> float:
    """The mean, over ``batch_list``, of the distinct token ids in a batch's (B, T) tokens, padding included: the
    rows of the embedding table a batch reads (0.0 for no batches)."""
    counts = [np.unique(b.tokens).size for b in batch_list]
    return float(np.mean(counts)) if counts else 0.0

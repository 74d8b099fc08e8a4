"""The two workloads the one training loop (``common.loop``) runs, as that loop sees them: how a run's data and first
parameters are loaded, how an epoch is cut into training batches, how a split is evaluated and what its metric is.

    classifier  the classic script's sentiment LSTM: shuffled (B, T) batches of texts, BCE; metric accuracy
    lm          pytorch/examples' word_language_model: the stream batchified into B columns, cut into windows of
                --bptt rows in order (the carry runs down the columns); mean cross-entropy per token; metric
                perplexity, evaluated at the example's batch size 10 with the state carried across windows

The twin's steps are the framework's side (``Twin.train_step``/``eval_step``); everything here is numpy.
"""
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from common import lm_data
from common.batches import Batch, batches, num_train_batches
from common.checkpoint import Checkpoint, load_checkpoint
from common.config import Config
from common.data import Dataset, EncodedSplit, prepare_data
from common.data import read_line as classifier_read_line
from common.errors import DataError
from common.memory import check_lm_fits
from common.params import Params, init_lm_params, init_params


@dataclass(frozen=True)
class Window:
    """One window of the language model's stream: ``inputs`` and ``targets`` (t, B) int32, the targets the next
    token of each input (t = --bptt, the last window of a split possibly shorter)."""

    inputs: np.ndarray
    targets: np.ndarray

    @property
    def size(self) -> int:
        """Columns B."""
        return int(self.inputs.shape[1])


@dataclass(frozen=True)
class LMRunData:
    """A language-model run's data: the vocabulary and each split batchified, train into --batch-size columns
    ``(rows, B)``, val and test into :data:`common.lm_data.EVAL_BATCH_SIZE` columns ``(rows, 10)``, all int32."""

    vocab: lm_data.LMVocab
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    read: str  # common.lm_data.read_line's summary
    tokenizer: str = lm_data.TOKENIZER


class Classifier:
    """The sentiment classifier: batches of texts, one logit each. Sums ``(BCE, number correct)`` per batch."""

    name, metric = "classifier", "accuracy"

    @staticmethod
    def load(cfg: Config, ckpt: Checkpoint | None) -> tuple[Dataset, Params]:
        data = prepare_data(cfg, *((ckpt.vocab, ckpt.tokenizer) if ckpt else ()))
        positive = int(data.train.labels.sum())
        if positive in (0, len(data.train)):
            raise DataError(f"the training split's {len(data.train)} texts are all "
                            f"{'positive' if positive else 'negative'}: a classifier needs both classes; check the "
                            f"labels (--label-column) or the files")
        if ckpt:
            return data, ckpt.params
        return data, init_params(len(data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)

    @staticmethod
    def read_line(data: Dataset) -> str:
        return classifier_read_line(data)

    @staticmethod
    def per_epoch(split: EncodedSplit, cfg: Config) -> int:
        return num_train_batches(len(split), cfg.batch_size)

    @staticmethod
    def train_batches(split: EncodedSplit, cfg: Config, epoch: int, start: int) -> Iterator[Batch]:
        return batches(split, cfg.batch_size, shuffle_seed=cfg.seed, epoch=epoch, start=start)

    @staticmethod
    def eval_batch_size(cfg: Config) -> int:
        return cfg.batch_size

    @staticmethod
    def eval_batches(split: EncodedSplit, cfg: Config) -> Iterator[Batch]:
        return batches(split, cfg.batch_size)

    @staticmethod
    def summarise(loss_sum: float, second: float, split: EncodedSplit) -> tuple[float, float]:
        """``(mean BCE, accuracy)`` from the sums over the split's examples."""
        return loss_sum / len(split), second / len(split)


class LanguageModel:
    """The word-level language model: windows of the batchified stream, the logits of every next token. Sums
    ``(cross-entropy, tokens)`` per window."""

    name, metric = "lm", "perplexity"

    @staticmethod
    def load(cfg: Config, ckpt: Checkpoint | None) -> tuple[LMRunData, Params]:
        words = lm_data.prepare_lm_data(cfg.data, cfg.max_vocab, vocab=ckpt.vocab if ckpt else None)
        # Before anything of the model's size is made: the parameters, a window's activations and logits.
        check_lm_fits(cfg, len(words.vocab), (len(words.train), len(words.val), len(words.test)))
        data = LMRunData(words.vocab, lm_data.batchify(words.train, cfg.batch_size, "training"),
                         lm_data.batchify(words.val, lm_data.EVAL_BATCH_SIZE, "validation"),
                         lm_data.batchify(words.test, lm_data.EVAL_BATCH_SIZE, "test"), lm_data.read_line(words))
        if ckpt:
            return data, ckpt.params
        return data, init_lm_params(len(data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.cell, cfg.tied,
                                    seed=cfg.seed)

    @staticmethod
    def read_line(data: LMRunData) -> str:
        return data.read

    @staticmethod
    def per_epoch(split: np.ndarray, cfg: Config) -> int:
        return lm_data.num_windows(len(split), cfg.bptt)

    @staticmethod
    def train_batches(split: np.ndarray, cfg: Config, epoch: int, start: int) -> Iterator[Window]:
        return (Window(*pair) for pair in lm_data.windows(split, cfg.bptt, start=start))  # the same every epoch

    @staticmethod
    def eval_batch_size(cfg: Config) -> int:
        return lm_data.EVAL_BATCH_SIZE

    @staticmethod
    def eval_batches(split: np.ndarray, cfg: Config) -> Iterator[Window]:
        return (Window(*pair) for pair in lm_data.windows(split, cfg.bptt))

    @staticmethod
    def summarise(loss_sum: float, tokens: float, split: np.ndarray) -> tuple[float, float]:
        """``(mean cross-entropy per token, perplexity)``; the perplexity is capped at exp(700) (infinite above)."""
        loss = loss_sum / tokens
        return loss, math.exp(loss) if loss < 700 else math.inf


Workload = Classifier | LanguageModel
WORKLOADS: dict[str, Any] = {"classifier": Classifier, "lm": LanguageModel}


def workload_of(cfg: Config) -> Any:
    """The :class:`Classifier` or :class:`LanguageModel` that ``cfg.workload`` names."""
    return WORKLOADS[cfg.workload]


def load_run(cfg: Config, before_data: Callable[[Config], None] = lambda cfg: None) -> tuple[Config, Any, Params]:
    """``(cfg, data, initial neutral params)``: from --init-from (its weights, vocabulary and tokenizer, and its model
    settings in ``cfg``) or the shared seeded initialisation. ``before_data(cfg)`` runs once ``cfg`` is complete,
    before the corpus is read."""
    ckpt = load_checkpoint(cfg.init_from, cfg) if cfg.init_from else None
    cfg = ckpt.config if ckpt else cfg
    before_data(cfg)
    data, params = workload_of(cfg).load(cfg, ckpt)
    return cfg, data, params

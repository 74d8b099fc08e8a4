"""The data pipeline: raw corpus → cleaned → split 80/10/10 → tokenized → vocabulary (train only) → encoded.

``python -m common.data summary`` describes a corpus; ``python -m common.data export --out DIR`` writes the
split as TSV files so anyone can check it.
"""
from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from common.config import Config, config_from_namespace, field_names, make_parser
from common.corpus import load_corpus
from common.errors import DataError, cli_main
from common.text import Vocab, build_vocab, choose_tokenizer, encode, tokenize

SPLIT_FRACTIONS = (0.8, 0.1, 0.1)


@dataclass(frozen=True)
class CleanStats:
    raw: int
    empty: int
    duplicates: int
    conflicts: int  # distinct texts dropped because they occur with both labels
    kept: int  # = raw - empty - duplicates - conflicts


def clean(texts: Sequence[str], labels: Sequence[int]) -> tuple[list[str], np.ndarray, CleanStats]:
    """Strip whitespace, drop empty texts, exact duplicates and texts seen with both labels.

    Keeps the first occurrence of each text, in corpus order, so the result is a function of the input alone.
    """
    seen: dict[str, set[int]] = {}
    order: list[str] = []
    empty = duplicates = 0
    for text, label in zip(texts, labels):
        text = text.strip()
        if not text:
            empty += 1
            continue
        if text in seen:
            duplicates += 1
        else:
            order.append(text)
            seen[text] = set()
        seen[text].add(int(label))
    kept = [t for t in order if len(seen[t]) == 1]
    out_labels = np.array([next(iter(seen[t])) for t in kept], dtype=np.int64)
    stats = CleanStats(raw=len(texts), empty=empty, duplicates=duplicates, conflicts=len(order) - len(kept),
                       kept=len(kept))
    return kept, out_labels, stats


def split_indices(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint train/val/test index arrays (80/10/10) from a seeded permutation."""
    perm = np.random.default_rng(seed).permutation(n)
    n_train = int(n * SPLIT_FRACTIONS[0])
    n_val = int(n * SPLIT_FRACTIONS[1])
    return perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]


@dataclass(frozen=True)
class EncodedSplit:
    """``texts`` (N,), ``tokens`` (N, T) int32, ``labels`` (N,) float32, ``lengths`` (N,) int32."""

    texts: list[str]
    tokens: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class Dataset:
    train: EncodedSplit
    val: EncodedSplit
    test: EncodedSplit
    vocab: Vocab
    tokenizer: str  # the resolved tokenizer, 'char' or 'word'
    stats: CleanStats


def encode_texts(texts: Sequence[str], vocab: Vocab, tokenizer: str, seq_len: int,
                 padding: str = "left") -> tuple[np.ndarray, np.ndarray]:
    """Texts → ``(tokens (N, seq_len) int32, lengths (N,) int32)`` with a fitted vocabulary."""
    return encode(vocab.ids(tokenize(texts, tokenizer)), seq_len, padding)


def prepare_data(cfg: Config, vocab: Vocab | None = None, tokenizer: str | None = None) -> Dataset:
    """Load, clean, split, fit the vocabulary on train (unless given, e.g. from a checkpoint) and encode."""
    raw_texts, raw_labels = load_corpus(cfg.data, cfg.pos, cfg.neg, cfg.text_column, cfg.label_column)
    texts, labels, stats = clean(raw_texts, raw_labels)
    if not texts:
        raise DataError("no texts left after cleaning (every text was empty, a duplicate or a conflict)")
    train_idx, val_idx, test_idx = split_indices(len(texts), cfg.split_seed)
    if tokenizer is None:
        tokenizer = cfg.tokenizer if cfg.tokenizer != "auto" else choose_tokenizer(texts[i] for i in train_idx)
    if vocab is None:
        vocab = build_vocab(tokenize([texts[i] for i in train_idx], tokenizer), cfg.min_freq, cfg.max_vocab)

    def make(idx: np.ndarray) -> EncodedSplit:
        part = [texts[i] for i in idx]
        tokens, lengths = encode_texts(part, vocab, tokenizer, cfg.seq_len, cfg.padding)
        return EncodedSplit(part, tokens, labels[idx].astype(np.float32), lengths)

    data = Dataset(make(train_idx), make(val_idx), make(test_idx), vocab, tokenizer, stats)
    if len(data.train) < cfg.batch_size:
        raise DataError(f"the training split has {len(data.train)} examples, fewer than one batch of "
                        f"{cfg.batch_size}; use more data or a smaller --batch-size")
    return data


# ---------------------------------------------------------------- command line


def summary_lines(data: Dataset) -> list[str]:
    s = data.stats
    lines = [f"raw texts: {s.raw}   empty: {s.empty}   duplicates dropped: {s.duplicates}   "
             f"conflicting labels dropped: {s.conflicts}   kept: {s.kept}",
             f"tokenizer: {data.tokenizer}   vocabulary (train, with <pad>, <unk>): {len(data.vocab)}",
             f"{'split':<6} {'total':>7} {'pos':>7} {'neg':>7}   tokens p10 p50 p90 p99 max   truncated"]
    for name in ("train", "val", "test"):
        split = getattr(data, name)
        full = [len(t) for t in tokenize(split.texts, data.tokenizer)]
        p = np.percentile(full, [10, 50, 90, 99]).astype(int) if full else [0] * 4
        pos = int(split.labels.sum())
        trunc = float(np.mean(np.array(full) > split.tokens.shape[1])) if full else 0.0
        lines.append(f"{name:<6} {len(split):>7} {pos:>7} {len(split) - pos:>7}   "
                     f"{p[0]:>10} {p[1]:>3} {p[2]:>3} {p[3]:>3} {max(full, default=0):>4}   {trunc:>8.1%}")
    return lines


def export_split(data: Dataset, out: Path) -> list[Path]:
    """Write ``train.tsv``, ``val.tsv``, ``test.tsv`` (header ``text``, ``label``; label 0/1)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"{out}: cannot create the output directory ({err.strerror})") from None
    paths = []
    for name in ("train", "val", "test"):
        split = getattr(data, name)
        path = out / f"{name}.tsv"
        tmp = path.with_suffix(".tsv.tmp")
        try:
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                writer = csv.writer(f, delimiter="\t", lineterminator="\n")
                writer.writerow(["text", "label"])
                for text, label in zip(split.texts, split.labels):
                    writer.writerow([text, int(label)])
            tmp.replace(path)
        except OSError as err:
            raise DataError(f"{path}: cannot write ({err.strerror})") from None
        paths.append(path)
    return paths


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    exclude = [name for name in field_names() if name not in field_names("data")]
    parser = make_parser("python -m common.data", "Describe or export the cleaned, split corpus.", exclude)
    parser.add_argument("command", choices=("summary", "export"))
    parser.add_argument("--out", help="export: directory for train.tsv, val.tsv, test.tsv")
    ns = parser.parse_args(argv)
    cfg = config_from_namespace(ns)
    if ns.command == "export" and not ns.out:
        parser.error("export needs --out DIR")
    data = prepare_data(cfg.replace(batch_size=1))
    if ns.command == "summary":
        print("\n".join(summary_lines(data)))
    else:
        for path in export_split(data, Path(ns.out)):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The data pipeline: raw corpus → cleaned → split 80/10/10 → tokenized → vocabulary (train only) → encoded.
``python -m common.data summary`` describes a corpus; ``export --out DIR`` writes the split as TSV anyone can check."""
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from common import interrupts
from common.config import DATA_HELP, Config, config_from_namespace, field_names, make_parser
from common.corpus import load_corpus
from common.errors import DataError, cli_main
from common.files import Output, atomic_file, check_outputs
from common.memory import check_fits
from common.text import Vocab, build_vocab, choose_tokenizer, encode, tokenize

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class CleanStats:
    raw: int
    empty: int
    duplicates: int
    conflicts: int  # distinct texts dropped because they occur with both labels
    kept: int  # = raw - empty - duplicates - conflicts
    positive: int  # of the raw texts


def clean(texts: Sequence[str], labels: Sequence[int]) -> tuple[list[str], np.ndarray, CleanStats]:
    """Strip whitespace, drop empty texts, exact duplicates and texts seen with both labels. Keeps the first
    occurrence of each text, in corpus order, so the result is a function of the input alone."""
    seen: dict[str, set[int]] = {}  # insertion order is first-occurrence order
    empty = 0
    for text, label in zip(texts, labels):
        if text := text.strip():
            seen.setdefault(text, set()).add(int(label))
        else:
            empty += 1
    kept = [t for t, found in seen.items() if len(found) == 1]
    out_labels = np.array([next(iter(seen[t])) for t in kept], dtype=np.int64)
    duplicates = len(texts) - empty - len(seen)
    return kept, out_labels, CleanStats(len(texts), empty, duplicates, len(seen) - len(kept), len(kept),
                                        sum(map(int, labels)))


def split_indices(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint train/val/test index arrays (80/10/10) from a seeded permutation."""
    perm = np.random.default_rng(seed).permutation(n)
    n_train, n_val = int(n * 0.8), int(n * 0.1)
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
    tokenizer: str  # the resolved tokenizer: 'char', 'word' or 'script'
    stats: CleanStats


def encode_texts(texts: Sequence[str], vocab: Vocab, tokenizer: str, seq_len: int,
                 padding: str = "left") -> tuple[np.ndarray, np.ndarray]:
    """Texts → ``(tokens (N, seq_len) int32, lengths (N,) int32)`` with a fitted vocabulary."""
    return encode(vocab.ids(tokenize(texts, tokenizer)), seq_len, padding)


def prepare_data(cfg: Config, vocab: Vocab | None = None, tokenizer: str | None = None) -> Dataset:
    """Load, clean, split, fit the vocabulary on train (unless given, e.g. from a checkpoint) and encode; a run that
    would not fit in memory is refused before the texts are encoded (:func:`common.memory.check_fits`)."""
    texts, labels, stats = clean(*load_corpus(cfg.data, cfg.pos, cfg.neg, cfg.text_column, cfg.label_column))
    if not texts:
        raise DataError("no texts left after cleaning (every text was empty, a duplicate or a conflict)")
    parts = split_indices(len(texts), cfg.split_seed)
    train_texts = [texts[i] for i in parts[0]]
    if tokenizer is None:
        tokenizer = cfg.tokenizer if cfg.tokenizer != "auto" else choose_tokenizer(train_texts)
    if vocab is None:
        vocab = build_vocab(tokenize(train_texts, tokenizer), cfg.min_freq, cfg.max_vocab)
        if len(vocab) <= 2 and cfg.min_freq > 1:  # every text would read as <unk>s: nothing to learn from
            raise DataError(f"--min-freq {cfg.min_freq} keeps no token of the training split (no token occurs that "
                            f"often); lower --min-freq")
    check_fits(cfg, len(vocab), len(texts))

    def make(idx: np.ndarray) -> EncodedSplit:
        part = [texts[i] for i in idx]
        tokens, lengths = encode_texts(part, vocab, tokenizer, cfg.seq_len, cfg.padding)
        return EncodedSplit(part, tokens, labels[idx].astype(np.float32), lengths)

    data = Dataset(*map(make, parts), vocab, tokenizer, stats)
    if len(data.train) < cfg.batch_size:
        raise DataError(f"the training split has {len(data.train)} examples, fewer than one batch of "
                        f"{cfg.batch_size}; use more data or a smaller --batch-size")
    return data


def read_line(data: Dataset) -> str:
    """What was read, by class, and kept: the first line a training run prints."""
    s = data.stats
    return (f"data: {s.raw} texts read ({s.positive} positive, {s.raw - s.positive} negative), {s.kept} kept after "
            f"cleaning: train {len(data.train)}, val {len(data.val)}, test {len(data.test)}")


def summary_lines(data: Dataset) -> list[str]:
    s = data.stats
    lines = [f"raw texts: {s.raw}   empty: {s.empty}   duplicates dropped: {s.duplicates}   "
             f"conflicting labels dropped: {s.conflicts}   kept: {s.kept}",
             f"tokenizer: {data.tokenizer}   vocabulary (train, with <pad>, <unk>): {len(data.vocab)}",
             f"{'split':<6} {'total':>7} {'pos':>7} {'neg':>7}   tokens p10 p50 p90 p99 max   truncated"]
    for name in SPLITS:
        split = getattr(data, name)
        full = [len(t) for t in tokenize(split.texts, data.tokenizer)] or [0]  # an empty split prints zeros
        p = np.percentile(full, [10, 50, 90, 99]).astype(int)
        pos = int(split.labels.sum())
        trunc = float(np.mean(np.array(full) > split.tokens.shape[1]))
        lines.append(f"{name:<6} {len(split):>7} {pos:>7} {len(split) - pos:>7}   "
                     f"{p[0]:>10} {p[1]:>3} {p[2]:>3} {p[3]:>3} {max(full):>4}   {trunc:>8.1%}")
    return lines


def _write_tsv(path: Path, split: EncodedSplit) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter="\t", lineterminator="\n").writerows([("text", "label"),
                                                                      *zip(split.texts, map(int, split.labels))])


def split_files(out: Path) -> list[Path]:
    """Where ``export --out`` writes the splits: ``train.tsv``, ``val.tsv``, ``test.tsv``."""
    return [out / f"{name}.tsv" for name in SPLITS]


def check_export(out: Path, overwrite: bool) -> None:
    """Refuse, before the corpus is read, an --out that cannot be written or (unless ``overwrite``) that holds split
    files already, which an export would replace (a hand edit lost)."""
    def held(out: Path) -> str | None:
        found = [p.name for p in split_files(out) if p.exists()]
        return f"--out {out}: holds {', '.join(found)}; pass --overwrite to replace them" if found else None

    check_outputs([Output("--out", out, directory=True, contents="the split files", held=held)], overwrite)


def export_split(data: Dataset, out: Path) -> list[Path]:
    """Write ``train.tsv``, ``val.tsv``, ``test.tsv`` (header ``text``, ``label``; label 0/1), each atomically."""
    paths = split_files(out)
    for name, path in zip(SPLITS, paths):
        split = getattr(data, name)
        try:
            atomic_file(path, lambda tmp: _write_tsv(tmp, split))
        except OSError as err:
            raise DataError(f"{path}: cannot write ({err.strerror})") from None
    return paths


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    exclude = [name for name in field_names() if name not in field_names("data")]
    helps = {"data": f"the classifier's corpus: {DATA_HELP['classifier']}",
             "max_vocab": "largest vocabulary, <pad> and <unk> included (0: no limit)"}
    parser = make_parser("python -m common.data", "Describe or export the classifier's cleaned, split corpus.",
                         exclude, helps)
    parser.add_argument("command", choices=("summary", "export"))
    parser.add_argument("--out", help="export: directory for train.tsv, val.tsv, test.tsv")
    parser.add_argument("--overwrite", action="store_true", help="export: replace the split files already in --out")
    ns = parser.parse_args(argv)
    cfg = config_from_namespace(ns)
    if ns.command == "export":
        if not ns.out:
            parser.error("export needs --out DIR")
        check_export(Path(ns.out), ns.overwrite)
    data = prepare_data(cfg.replace(batch_size=1))
    lines = summary_lines(data) if ns.command == "summary" else export_split(data, Path(ns.out))
    print("\n".join(map(str, lines)))
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())

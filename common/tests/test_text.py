"""Tokenizers, the vocabulary, and the encoding (first seq_len tokens, padded with 0)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from common.errors import CheckpointError
from common.text import PAD, UNK, Vocab, build_vocab, char_tokens, choose_tokenizer, encode, tokenize, word_tokens


# ---------------------------------------------------------------- tokenizers


def test_char_tokens_are_every_non_whitespace_character():
    assert char_tokens("好 看！\t A\n1") == ["好", "看", "！", "A", "1"]


def test_word_tokens_lower_case_strip_punctuation_and_split_on_whitespace():
    assert word_tokens("Hello, World!  It's GREAT...\tReally?") == ["hello", "world", "its", "great", "really"]


def test_word_tokens_strip_cjk_punctuation_and_ascii_symbols():
    assert word_tokens("好，看。 a+b <br/> x~y") == ["好看", "ab", "br", "xy"]


def test_auto_picks_char_when_most_letters_are_cjk():
    assert choose_tokenizer(["这部电影很好看 ok", "不错"]) == "char"


def test_auto_picks_word_when_most_letters_are_not_cjk():
    assert choose_tokenizer(["a great film, 好"]) == "word"


def test_auto_needs_more_than_half_of_the_letters_cjk():
    # Two CJK letters of four: not "most", so word. Digits and punctuation are not letters.
    assert choose_tokenizer(["ab好看"]) == "word"
    assert choose_tokenizer(["12345!!! 好"]) == "char"
    assert choose_tokenizer([]) == "word"


def test_tokenize_applies_the_named_tokenizer():
    assert tokenize(["Ab c", "d"], "char") == [["A", "b", "c"], ["d"]]
    assert tokenize(["Ab c", "d"], "word") == [["ab", "c"], ["d"]]


# ---------------------------------------------------------------- vocabulary


def test_vocab_starts_with_pad_and_unk_then_descending_count_ties_by_token():
    vocab = build_vocab([["b", "a", "c"], ["c", "a", "d"], ["a"]])
    # a: 3; c: 2; b, d: 1 (tie broken by the token string)
    assert vocab.tokens == (PAD, UNK, "a", "c", "b", "d")


def test_vocab_min_freq_drops_rare_tokens():
    vocab = build_vocab([["a", "a", "b", "c", "c", "c"]], min_freq=2)
    assert vocab.tokens == (PAD, UNK, "c", "a")


def test_vocab_max_size_counts_pad_and_unk():
    vocab = build_vocab([["a", "a", "b", "c", "c", "c"]], max_size=3)
    assert vocab.tokens == (PAD, UNK, "c")


def test_vocab_does_not_depend_on_input_order():
    token_lists = [list("the quick brown fox"), list("jumps over"), list("the lazy dog")]
    reference = build_vocab(token_lists)
    rng = random.Random(0)
    for _ in range(5):
        shuffled = [rng.sample(toks, len(toks)) for toks in rng.sample(token_lists, len(token_lists))]
        assert build_vocab(shuffled) == reference


def test_vocab_ids_map_unknown_tokens_to_unk():
    vocab = Vocab((PAD, UNK, "a", "b"))
    assert vocab.ids([["b", "zzz", "a"], []]) == [[3, 1, 2], []]


@pytest.mark.parametrize("tokens", [("a", "b"), (UNK, PAD, "a"), (PAD,), (PAD, UNK, "a", "a")])
def test_malformed_vocab_is_refused(tokens):
    with pytest.raises(CheckpointError):
        Vocab(tokens)


# ---------------------------------------------------------------- encoding


def test_encode_left_pads_with_zero_and_returns_lengths():
    tokens, lengths = encode([[5, 6, 7], [2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6], []], seq_len=5)
    np.testing.assert_array_equal(tokens, [[0, 0, 5, 6, 7],   # shorter: padded on the left
                                           [2, 3, 4, 5, 6],   # longer: the first seq_len tokens kept
                                           [2, 3, 4, 5, 6],   # exactly seq_len
                                           [0, 0, 0, 0, 0]])  # empty
    np.testing.assert_array_equal(lengths, [3, 5, 5, 0])
    assert tokens.dtype == np.int32 and lengths.dtype == np.int32


def test_encode_right_pads_with_zero():
    tokens, lengths = encode([[5, 6, 7], [2, 3, 4, 5, 6, 7, 8], []], seq_len=5, padding="right")
    np.testing.assert_array_equal(tokens, [[5, 6, 7, 0, 0], [2, 3, 4, 5, 6], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(lengths, [3, 5, 0])


def test_encode_of_no_texts_has_shape_zero_by_seq_len():
    tokens, lengths = encode([], seq_len=4)
    assert tokens.shape == (0, 4) and lengths.shape == (0,)

"""Cleaning (strip, drop empty, duplicates, conflicting labels) and the seeded 80/10/10 split."""
from __future__ import annotations

import numpy as np
import pytest

from common.config import Config
from common.data import clean, prepare_data, read_line, split_indices
from common.errors import DataError
from common.text import UNK_ID, tokenize


def test_clean_strips_and_drops_empty_duplicate_and_conflicting_texts():
    texts = ["  good  ", "good", "bad", "", "   \t", "meh", "meh", "ok\n"]
    labels = [1, 1, 0, 1, 0, 1, 0, 1]
    kept, kept_labels, stats = clean(texts, labels)
    assert kept == ["good", "bad", "ok"]  # first occurrences, in corpus order, stripped
    assert kept_labels.tolist() == [1, 0, 1]
    assert (stats.raw, stats.empty, stats.duplicates, stats.conflicts, stats.kept) == (8, 2, 2, 1, 3)


def test_clean_counts_a_text_seen_three_times_with_both_labels_as_one_conflict():
    kept, _, stats = clean(["x", "x", "x", "y"], [1, 1, 0, 0])
    assert kept == ["y"]
    assert (stats.duplicates, stats.conflicts, stats.kept) == (2, 1, 1)


def test_clean_counts_add_up():
    texts = ["a", "a ", "", "b", "b", "c", " ", "d", "d", "e"]
    labels = [1, 1, 0, 0, 1, 1, 1, 0, 0, 1]
    _, _, s = clean(texts, labels)
    assert s.kept == s.raw - s.empty - s.duplicates - s.conflicts == 4  # a, c, d, e


@pytest.mark.parametrize("n, sizes", [(100, (80, 10, 10)), (10, (8, 1, 1)), (17, (13, 1, 3)), (1, (0, 0, 1))])
def test_split_is_80_10_10_with_the_remainder_in_test(n, sizes):
    train, val, test = split_indices(n, seed=0)
    assert (len(train), len(val), len(test)) == sizes


def test_split_parts_are_disjoint_and_cover_every_index():
    parts = split_indices(1000, seed=3)
    together = np.concatenate(parts)
    assert sorted(together.tolist()) == list(range(1000))


def test_same_split_seed_gives_the_same_split():
    for a, b in zip(split_indices(200, seed=7), split_indices(200, seed=7)):
        np.testing.assert_array_equal(a, b)


def test_different_split_seed_gives_a_different_split():
    a, b = split_indices(200, seed=0)[0], split_indices(200, seed=1)[0]
    assert set(a.tolist()) != set(b.tolist())


# ---------------------------------------------------------------- prepare_data on a small corpus


def _cfg(path, **kw):
    return Config(data=str(path), batch_size=2, seq_len=6, tokenizer="word", **kw)


def test_prepared_splits_share_no_text(tmp_path):
    # Duplicates in the raw corpus must not leak the same text into two splits.
    path = tmp_path / "c.csv"
    rows = [f"text {i % 25},{(i % 25) % 2}" for i in range(100)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    data = prepare_data(_cfg(path))
    train, val, test = (set(s.texts) for s in (data.train, data.val, data.test))
    assert (len(data.train), len(data.val), len(data.test)) == (20, 2, 3)
    assert not (train & val or train & test or val & test)
    assert data.stats.duplicates == 75


def test_prepared_split_follows_split_seed(corpus_csv):
    path = corpus_csv(50)
    a, b, c = (prepare_data(_cfg(path, split_seed=s)) for s in (0, 0, 1))
    assert a.train.texts == b.train.texts and a.test.texts == b.test.texts
    assert a.train.texts != c.train.texts


def test_vocabulary_is_fitted_on_the_training_split_only(corpus_csv):
    # Each text carries a token of its own (wI): those of val/test texts are unknown to the vocabulary.
    data = prepare_data(_cfg(corpus_csv(30)))
    train_tokens = {tok for toks in tokenize(data.train.texts, "word") for tok in toks}
    assert set(data.vocab.tokens[2:]) == train_tokens
    # The first token of every test text is its own wI, so it is <unk>; left padding puts it at T - length.
    for row, n in zip(data.test.tokens, data.test.lengths):
        assert row[len(row) - n] == UNK_ID


def test_a_min_freq_that_keeps_no_token_is_refused_in_one_line(corpus_csv):
    with pytest.raises(DataError) as err:
        prepare_data(_cfg(corpus_csv(30), min_freq=10 ** 30))
    assert str(err.value) == (f"--min-freq {10 ** 30} keeps no token of the training split (no token occurs that "
                              f"often); lower --min-freq")


def test_prepared_arrays_have_the_documented_shapes_and_dtypes(corpus_csv):
    data = prepare_data(_cfg(corpus_csv(30)))
    split = data.train
    assert split.tokens.shape == (24, 6) and split.tokens.dtype == np.int32
    assert split.labels.shape == (24,) and split.labels.dtype == np.float32
    assert split.lengths.shape == (24,) and split.lengths.dtype == np.int32
    assert set(np.unique(split.labels).tolist()) <= {0.0, 1.0}


def test_given_vocab_and_tokenizer_are_used_instead_of_fitting(corpus_csv):
    path = corpus_csv(30)
    first = prepare_data(_cfg(path))
    again = prepare_data(_cfg(path, split_seed=5), vocab=first.vocab, tokenizer="char")
    assert again.vocab is first.vocab and again.tokenizer == "char"


def test_fewer_training_examples_than_one_batch_is_a_clear_error(corpus_csv):
    # 10 texts → 8 training examples, fewer than a batch of 50.
    with pytest.raises(DataError, match=r"training split has 8 examples, fewer than one batch of 50.*--batch-size"):
        prepare_data(Config(data=str(corpus_csv(10))))


def test_corpus_of_only_empty_texts_is_a_clear_error(tmp_path):
    (tmp_path / "p.txt").write_text(" \nx\n", encoding="utf-8")
    (tmp_path / "n.txt").write_text("x\n", encoding="utf-8")  # 'x' has both labels: a conflict
    with pytest.raises(DataError, match="no texts left after cleaning"):
        prepare_data(Config(pos=str(tmp_path / "p.txt"), neg=str(tmp_path / "n.txt"), batch_size=1))


def test_a_training_split_of_one_class_is_refused(table_file, tmp_path):
    from common.loop import load_run

    path = table_file(tmp_path / "all-positive.csv", [(f"w{i} nice", "1") for i in range(30)])
    with pytest.raises(DataError, match=r"^the training split's 24 texts are all positive: a classifier needs both "
                                        r"classes; check the labels \(--label-column\) or the files$"):
        load_run(Config(data=str(path), batch_size=4))


def test_the_run_line_says_how_many_texts_of_each_class_were_read_and_kept(corpus_csv):
    data = prepare_data(Config(data=str(corpus_csv(20)), batch_size=1))
    assert read_line(data) == ("data: 20 texts read (10 positive, 10 negative), 20 kept after cleaning: train 16, "
                               "val 2, test 2")

"""The n-gram baseline: NLTK's interpolated Kneser-Ney on the language model's own token streams, scored token for
token as the neural model's evaluation scores them; a corpus of 30 lines written in code."""
from __future__ import annotations

import collections
import json
import math
import random
from pathlib import Path

import pytest

pytest.importorskip("nltk")  # the optional 'baselines' extra

from nltk.lm import KneserNeyInterpolated  # noqa: E402
from nltk.util import everygrams  # noqa: E402

from studies import ngram_baseline  # noqa: E402
from common.lm_data import EVAL_BATCH_SIZE, UNK, prepare_lm_data  # noqa: E402

# Float sums of ~20 probabilities, and NLTK's perplexity (2 ** mean log2) against ours (exp of mean ln): a few ulps.
TOLERANCE = 1e-12


def write_corpus(path: Path, lines: int = 30) -> Path:
    """``lines`` lines of 15 to 25 words drawn from 20 words with Zipf-like weights, words separated by spaces."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(20)]
    weights = [1 / (i + 1) for i in range(20)]
    path.write_text("".join(" ".join(rng.choices(words, weights, k=rng.randint(15, 25))) + "\n" for _ in range(lines)),
                    encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus.txt")


@pytest.fixture
def data(corpus: Path):
    """12 entries: ``<unk>``, ``<eos>`` and 10 words, so that ``<unk>`` occurs in every split."""
    return prepare_lm_data(corpus, max_vocab=12)


def train_words(data) -> list[str]:
    return [data.vocab.tokens[i] for i in data.train]


def nltk_model(data, order: int, discount: float) -> KneserNeyInterpolated:
    """NLTK's own model, its continuation counts unindexed, fitted on the same text."""
    text = [ngram_baseline.START, *train_words(data)]
    model = KneserNeyInterpolated(order, discount=discount)
    model.fit([everygrams(text, max_len=order)], vocabulary_text=text)
    return model


def all_contexts(data, order: int) -> set[tuple[str, ...]]:
    """Every context of 0 to ``order - 1`` words: each one seen in training or validation, and one never seen."""
    words = train_words(data)
    cols = ngram_baseline.columns(data, "val")
    seen = {tuple(stream[i - k: i]) for stream in (words, *cols) for k in range(order) for i in range(k, len(stream))}
    return seen | {("w0", "w0", "w0")[: order - 1]}


@pytest.mark.parametrize("order", [2, 3, 4])
def test_the_indexed_continuation_counts_give_nltks_own_probabilities(data, order):
    ours, theirs = ngram_baseline.fit(train_words(data), order, 0.6), nltk_model(data, order, 0.6)
    for context in sorted(all_contexts(data, order)):
        for word in data.vocab.tokens:
            assert ours.score(word, context) == theirs.score(word, context), (word, context)


@pytest.mark.parametrize("order", [2, 3, 4])
def test_the_perplexity_is_nltks_own_perplexity_of_the_same_ngrams(data, order):
    cols = ngram_baseline.columns(data, "val")
    value, tokens = ngram_baseline.perplexity(ngram_baseline.fit(train_words(data), order, 0.6), cols)
    ngrams = [ngram for column in cols for ngram in ngram_baseline.scored_ngrams(column, order)]
    assert value == pytest.approx(nltk_model(data, order, 0.6).perplexity(ngrams), rel=TOLERANCE)
    assert tokens == len(ngrams) == (len(data.val) // EVAL_BATCH_SIZE - 1) * EVAL_BATCH_SIZE
    assert max(map(len, ngrams)) == order  # full contexts scored, not only a column's first few


def test_every_token_of_a_column_but_its_first_is_scored_after_up_to_n_minus_1_words_of_its_column():
    assert ngram_baseline.scored_ngrams(["a", "b", "c", "d"], 3) == [("a", "b"), ("a", "b", "c"), ("b", "c", "d")]


def test_the_columns_are_the_neural_models_evaluation_columns(data):
    cols = ngram_baseline.columns(data, "val")
    rows = len(data.val) // EVAL_BATCH_SIZE
    assert len(cols) == EVAL_BATCH_SIZE
    assert [data.vocab.index[w] for w in cols[1]] == data.val[rows: 2 * rows].tolist()  # a contiguous piece


@pytest.mark.parametrize("order", [2, 3, 4])
def test_the_probabilities_sum_to_1_over_the_vocabulary_in_every_context(data, order):
    model = ngram_baseline.fit(train_words(data), order)
    contexts = sorted(all_contexts(data, order))
    for context, total in zip(contexts, ngram_baseline.probability_sums(model, data.vocab.tokens, contexts)):
        assert total == pytest.approx(1.0, abs=TOLERANCE), context


@pytest.mark.parametrize("order", [3, 4])
def test_the_probabilities_sum_to_1_after_a_context_whose_follower_is_seen_only_at_the_streams_start(tmp_path, order):
    # "a b" opens the corpus and occurs nowhere else: no word before it but the stream's start.
    corpus = tmp_path / "start.txt"
    corpus.write_text("a b c d e c a d\n" + "a c d b e c a d\n" * 29, encoding="utf-8")
    data = prepare_lm_data(corpus, max_vocab=0)
    model = ngram_baseline.fit(train_words(data), order)
    contexts = [("a",), ("<eos>", "a"), ("c", "a")]
    assert ngram_baseline.probability_sums(model, data.vocab.tokens, contexts) == pytest.approx([1.0] * 3,
                                                                                             abs=TOLERANCE)


def test_the_stream_start_is_never_predicted(data):
    model = ngram_baseline.fit(train_words(data), 3)
    assert model.score(ngram_baseline.START, ()) == 0
    assert model.score(ngram_baseline.START, tuple(train_words(data)[:2])) == 0


def test_order_1_is_the_unigram_models_perplexity(data):
    words = train_words(data)
    counts = collections.Counter(words)
    cols = ngram_baseline.columns(data, "val")
    by_hand = math.exp(-sum(math.log(counts[w] / len(words)) for column in cols for w in column[1:])
                       / sum(len(column) - 1 for column in cols))
    value, _ = ngram_baseline.perplexity(ngram_baseline.fit(words, 1), cols)
    assert value == pytest.approx(by_hand, rel=TOLERANCE)


def test_the_discount_is_estimated_from_the_highest_orders_counts(data):
    words = train_words(data)  # the n-gram starting with <s> (seen once, always) is not the corpus's
    seen = collections.Counter(collections.Counter(zip(words, words[1:], words[2:])).values())
    assert ngram_baseline.fit(train_words(data), 3).estimator.discount == seen[1] / (seen[1] + 2 * seen[2])


def test_a_corpus_without_an_ngram_seen_once_leaves_the_discount_to_the_user(tmp_path, capsys):
    (tmp_path / "same.txt").write_text("a b c d e f g\n" * 40, encoding="utf-8")
    assert ngram_baseline.main(["--data", str(tmp_path / "same.txt"), "--order", "2"]) == 2
    assert capsys.readouterr().err == ("error: no 2-gram occurs exactly once in the training split, so the discount "
                                       "cannot be estimated; pass --discount\n")


def test_a_split_too_short_for_the_evaluation_columns_is_refused_before_fitting(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ngram_baseline, "fit", lambda *args: pytest.fail("fitted before refusing"))
    (tmp_path / "short.txt").write_text("a b\n" * 40, encoding="utf-8")
    assert ngram_baseline.main(["--data", str(tmp_path / "short.txt")]) == 2
    assert capsys.readouterr().err.startswith("error: the val split has 12 words (<eos> included), too few for the "
                                              "evaluation's fixed 10 columns")


def test_unk_in_val_but_never_in_train_is_refused(corpus, capsys):
    lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[24] = "w0 w1 unseen w2 w3 w4 w5 w6\n"  # the first validation line: lines 0-23 are train
    corpus.write_text("".join(lines), encoding="utf-8")
    assert ngram_baseline.main(["--data", str(corpus), "--max-vocab", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {UNK} occurs in the val split but never in train")


def test_the_json_holds_the_command_library_data_order_discount_time_and_perplexities(corpus, tmp_path, capsys):
    out = tmp_path / "lm" / "ngram.json"
    argv = ["--data", str(corpus), "--max-vocab", "12", "--order", "2", "--discount", "0.5", "--out", str(out)]
    assert ngram_baseline.main(argv) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["command"] == f"python -m studies.ngram_baseline --data {corpus} --max-vocab 12 --order 2 " \
                             f"--discount 0.5 --out {out}"
    assert (doc["library"], doc["model"], doc["order"], doc["discount"], doc["discount_from"]) == (
        "nltk", "nltk.lm.KneserNeyInterpolated", 2, 0.5, "--discount")
    assert doc["library_version"] == ngram_baseline.nltk.__version__
    assert doc["data"].startswith("data: ") and doc["fit_s"] > 0
    data = prepare_lm_data(corpus, max_vocab=12)
    for split in ("val", "test"):
        value, tokens = ngram_baseline.perplexity(ngram_baseline.fit(train_words(data), 2, 0.5),
                                                  ngram_baseline.columns(data, split))
        assert doc[split] == {"perplexity": value, "tokens": tokens}
    assert doc["normalisation"]["max_abs_error"] < TOLERANCE
    assert f"val perplexity {doc['val']['perplexity']:.2f} over" in capsys.readouterr().out


@pytest.fixture
def never_measured(monkeypatch):
    """A refusal must come before the fitting: measuring fails the test."""
    monkeypatch.setattr(ngram_baseline, "measure", lambda *args: pytest.fail("measured before refusing"))


@pytest.mark.parametrize("argv, message", [
    (["--data", "missing.txt"], "missing.txt"),
    (["--order", "0"], "error: python -m studies.ngram_baseline: argument --order: must be between 1 and 10 "
     "(beyond 10, hardly any n-gram of the highest order occurs twice: nothing to estimate), got 0\n"),
    (["--order", "1000"], "error: python -m studies.ngram_baseline: argument --order: must be between 1 and 10 "
     "(beyond 10, hardly any n-gram of the highest order occurs twice: nothing to estimate), got 1000\n"),
    (["--order", "x"], "error: python -m studies.ngram_baseline: argument --order: invalid int value: 'x'\n"),
    (["--discount", "0"], "argument --discount: invalid discount (0 < D <= 1) value: '0'\n"),
    (["--max-vocab", "2"], "max_vocab must be 0 or >= 3"),
])
def test_a_bad_flag_or_file_is_one_line_and_exit_2(argv, message, capsys, never_measured):
    assert ngram_baseline.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_without_nltk_the_baseline_says_how_to_install_it(corpus, capsys, monkeypatch, never_measured):
    monkeypatch.setattr(ngram_baseline, "nltk", None)
    assert ngram_baseline.main(["--data", str(corpus)]) == 2
    assert capsys.readouterr().err == ("error: the n-gram baseline needs NLTK: pip install nltk (or the project's "
                                       "'baselines' extra: pip install '.[baselines]')\n")


def test_an_existing_out_file_is_refused_and_kept_unless_overwrite(corpus, tmp_path, capsys, never_measured):
    (tmp_path / "x.json").write_text("hand-edited\n", encoding="utf-8")
    assert ngram_baseline.main(["--data", str(corpus), "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err == f"error: --out {tmp_path / 'x.json'}: exists; pass --overwrite to replace it\n"
    assert (tmp_path / "x.json").read_text(encoding="utf-8") == "hand-edited\n"


def test_an_existing_out_file_is_replaced_with_overwrite(corpus, tmp_path):
    (tmp_path / "x.json").write_text("hand-edited\n", encoding="utf-8")
    assert ngram_baseline.main(["--data", str(corpus), "--max-vocab", "12", "--out", str(tmp_path / "x.json"),
                                "--overwrite"]) == 0
    assert json.loads((tmp_path / "x.json").read_text(encoding="utf-8"))["order"] == 3


def test_an_out_under_a_file_is_refused_before_fitting(corpus, tmp_path, capsys, never_measured):
    (tmp_path / "f").write_text("mine", encoding="utf-8")
    assert ngram_baseline.main(["--data", str(corpus), "--out", str(tmp_path / "f" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {tmp_path / 'f' / 'x.json'}: cannot write there (" in err
    assert (tmp_path / "f").read_text(encoding="utf-8") == "mine"

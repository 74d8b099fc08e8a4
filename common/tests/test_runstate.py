"""Training checkpoints' shared bookkeeping: the newest that loads, fallback past damaged ones, settings refused
by name. (Each twin writes its own steps: torch_impl.state.write_checkpoint, Orbax for JAX.)"""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from common.errors import CheckpointError
from common.runstate import PROGRESS_FILE, Progress, load_latest, read_progress, step_dir


def _write_step(root, progress: Progress, write_state):
    """A step directory as a twin leaves one: progress.json and the twin's files (``write_state(dir)``)."""
    directory = step_dir(root, progress.step)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PROGRESS_FILE).write_text(json.dumps(asdict(progress)), encoding="utf-8")
    write_state(directory)
    return directory


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


def test_load_latest_returns_the_newest(tmp_path):
    for step in (100, 200):
        _write_step(tmp_path, Progress(step, 0, step), _state(f"s{step}"))
    (tmp_path / ".tmp-leftover").mkdir()  # a killed write's temporary directory is not a checkpoint
    progress, state, path = load_latest(tmp_path, _load)
    assert (progress.step, state, path.name) == (200, "s200", "step_00000200")


@pytest.mark.parametrize("damage", ["progress", "state"])
def test_load_latest_falls_back_past_a_damaged_newest_and_warns(tmp_path, capsys, damage):
    for step in (100, 200):
        _write_step(tmp_path, Progress(step, 0, step), _state(f"s{step}"))
    newest = tmp_path / "step_00000200"
    target = newest / (PROGRESS_FILE if damage == "progress" else "state.json")
    target.write_text(target.read_text(encoding="utf-8")[:5], encoding="utf-8")  # truncated
    progress, state, _ = load_latest(tmp_path, _load)
    assert (progress.step, state) == (100, "s100")
    err = capsys.readouterr().err
    assert "warning:" in err and "step_00000200" in err and "falling back" in err


def test_load_latest_treats_a_missing_progress_file_as_damage(tmp_path, capsys):
    for step in (1, 2):
        _write_step(tmp_path, Progress(step, 0, step), _state(f"s{step}"))
    (tmp_path / "step_00000002" / PROGRESS_FILE).unlink()
    assert load_latest(tmp_path, _load)[0].step == 1
    assert "progress.json: missing" in capsys.readouterr().err


def test_load_latest_without_checkpoints_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"no training checkpoint \(step_\*\) found"):
        load_latest(tmp_path, _load)
    with pytest.raises(CheckpointError, match="no training checkpoint"):
        load_latest(tmp_path / "missing", _load)


def test_load_latest_when_every_checkpoint_is_damaged_is_an_error(tmp_path, capsys):
    _write_step(tmp_path, Progress(1, 0, 1), _state("s1"))
    (tmp_path / "step_00000001" / PROGRESS_FILE).write_text('{"step": 1, "bogus": 2}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="every training checkpoint there is damaged"):
        load_latest(tmp_path, _load)


def test_resume_with_other_trajectory_settings_is_refused_by_name(tmp_path):
    from common.config import Config
    from common.errors import ConfigError
    from common.runstate import trajectory_settings

    cfg = Config(hidden_dim=8)
    _write_step(tmp_path, Progress(step=2, epoch=0, batch=2, settings=trajectory_settings(cfg)), lambda d: None)
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

"""Training checkpoints' shared bookkeeping: the newest that loads, fallback past damaged ones, settings refused
by name. (Each twin writes its own steps: torch_impl.state.write_checkpoint, Orbax for JAX.)"""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from common.config import Config
from common.errors import CheckpointError, ConfigError
from common.files import write_manifest
from common.runstate import PROGRESS_FILE, Progress, load_latest, read_progress, step_dir, trajectory_settings


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


def _settings_step(root, cfg, step=2, vocab_size=None, progress_file=PROGRESS_FILE):
    """A step directory whose progress record (at ``progress_file``, the twin's layout) holds ``cfg``'s settings,
    with its checksums."""
    directory = step_dir(root, step)
    (directory / progress_file).parent.mkdir(parents=True, exist_ok=True)
    progress = Progress(step=step, epoch=0, batch=step, settings=trajectory_settings(cfg, vocab_size))
    (directory / progress_file).write_text(json.dumps(asdict(progress)), encoding="utf-8")
    return write_manifest(directory)


def _never_read(path):
    raise AssertionError(f"{path}: the state was read")


def test_resume_names_every_setting_that_differs_before_reading_any_state(tmp_path):
    _settings_step(tmp_path, Config(hidden_dim=8), vocab_size=60)
    with pytest.raises(ConfigError, match=rf"^--resume {tmp_path}: the run was trained with --hidden-dim 8, not 16; "
                                          r"--lr 0.001, not 0.01; a vocabulary of 60, not 62. Resume with the same "
                                          r"settings and data$"):
        load_latest(tmp_path, _never_read, cfg=Config(hidden_dim=16, lr=0.01), vocab_size=62, framework="torch")


def test_a_boolean_setting_that_differs_is_named_as_its_flags_are_spelt(tmp_path):
    _settings_step(tmp_path, Config.for_workload("lm", tied=False))
    with pytest.raises(ConfigError, match=r"the run was trained with --no-tied, not --tied; --detach, not "
                                          r"--no-detach\. Resume"):
        load_latest(tmp_path, _never_read, cfg=Config.for_workload("lm", tied=True, detach=False))


def test_resume_of_the_other_twins_run_is_refused_naming_the_twin(tmp_path):
    _settings_step(tmp_path, Config(), progress_file="progress/metadata")  # an Orbax JSON item: the JAX twin's
    with pytest.raises(ConfigError, match=r"the run was written by the JAX twin \(python -m jax_impl.train\), whose "
                                          r"training checkpoints the PyTorch twin .* does not read"):
        load_latest(tmp_path, _never_read, cfg=Config(), framework="torch")


def test_a_damaged_record_is_fallen_back_past_not_taken_for_other_settings(tmp_path, capsys):
    cfg = Config(hidden_dim=8)
    _settings_step(tmp_path, cfg, step=1)
    newest = _settings_step(tmp_path, cfg, step=2) / PROGRESS_FILE
    newest.write_text(newest.read_text(encoding="utf-8").replace('"hidden_dim": 8', '"hidden_dim": 9'),
                      encoding="utf-8")  # same size, one digit flipped: still valid JSON
    progress, state, _ = load_latest(tmp_path, lambda p: (read_progress(p), "state"), cfg=cfg)
    assert (progress.step, state) == (1, "state")
    assert "progress.json: contents differ from when it was written (damaged); falling back" in capsys.readouterr().err


def test_a_step_without_a_progress_record_is_fallen_back_past(tmp_path, capsys):
    _settings_step(tmp_path, Config(), step=1)
    step_dir(tmp_path, 2).mkdir()
    assert load_latest(tmp_path, lambda p: (read_progress(p), "state"), cfg=Config())[0].step == 1
    assert "step_00000002: no progress record" in capsys.readouterr().err


def _ran_step(root, lstm_impl: str, ran: str):
    """A run's step directory whose settings say ``--lstm-impl lstm_impl`` ran implementation ``ran``."""
    directory = step_dir(root, 2)
    directory.mkdir(parents=True)
    settings = trajectory_settings(Config(lstm_impl=lstm_impl), 60, lstm_impl_ran=ran)
    (directory / PROGRESS_FILE).write_text(json.dumps(asdict(Progress(2, 0, 2, settings=settings))), encoding="utf-8")


def test_a_run_whose_auto_ran_fused_resumes_under_fused_by_name(tmp_path):
    _ran_step(tmp_path, "auto", "fused")
    progress, _, _ = load_latest(tmp_path, lambda p: (read_progress(p), "state"), cfg=Config(lstm_impl="fused"),
                                 vocab_size=60, lstm_impl_ran="fused")
    assert progress.step == 2


def test_a_run_of_fused_by_name_resumes_under_auto_where_auto_runs_fused(tmp_path):
    _ran_step(tmp_path, "fused", "fused")
    assert load_latest(tmp_path, lambda p: (read_progress(p), "state"), cfg=Config(lstm_impl="auto"), vocab_size=60,
                       lstm_impl_ran="fused")[0].step == 2


def test_a_run_whose_auto_ran_fused_is_refused_under_kernel_naming_both(tmp_path):
    _ran_step(tmp_path, "auto", "fused")
    with pytest.raises(ConfigError, match=rf"^--resume {tmp_path}: the run was trained with --lstm-impl 'auto' "
                                          r"\(which ran fused\), not 'kernel'. Resume with the same settings and "
                                          r"data$"):
        load_latest(tmp_path, _never_read, cfg=Config(lstm_impl="kernel"), vocab_size=60, lstm_impl_ran="kernel")


def test_a_run_of_kernel_by_name_is_refused_where_auto_now_runs_fused(tmp_path):
    _ran_step(tmp_path, "kernel", "kernel")
    with pytest.raises(ConfigError, match=r"the run was trained with --lstm-impl 'kernel', not 'auto' \(which runs "
                                          r"fused here\)\. Resume"):
        load_latest(tmp_path, _never_read, cfg=Config(lstm_impl="auto"), vocab_size=60, lstm_impl_ran="fused")


def test_a_run_saved_without_what_ran_compares_the_flags(tmp_path):
    _settings_step(tmp_path, Config(lstm_impl="auto"), vocab_size=60)  # as runs saved before it was recorded
    with pytest.raises(ConfigError, match=r"the run was trained with --lstm-impl 'auto', not 'fused'\. Resume"):
        load_latest(tmp_path, _never_read, cfg=Config(lstm_impl="fused"), vocab_size=60, lstm_impl_ran="fused")
    assert load_latest(tmp_path, lambda p: (read_progress(p), "state"), cfg=Config(), vocab_size=60,
                       lstm_impl_ran="fused")[0].step == 2


def test_a_torch_run_resumes_under_auto_its_only_implementation(tmp_path):
    _ran_step(tmp_path, "auto", "nn.LSTM")  # the PyTorch twin's record: nn.LSTM, whatever the flag
    assert load_latest(tmp_path, lambda p: (read_progress(p), "state"), cfg=Config(), vocab_size=60,
                       lstm_impl_ran="nn.LSTM", framework="torch")[0].step == 2

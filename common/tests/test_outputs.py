"""The one check of a command's outputs before any work (common.files.check_outputs), the training run's outputs
(common.loop.run_outputs), and the modes of what a save writes."""
from __future__ import annotations

import json
import os
import signal
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from common import interrupts
from common.checkpoint import save_checkpoint
from common.config import Config
from common.errors import ConfigError
from common.files import Output, atomic_dir, check_outputs, ordinary_modes, write_json
from common.loop import run_outputs
from common.params import init_params
from common.runstate import PROGRESS_FILE, Progress
from common.tests.conftest import run_python
from common.text import Vocab

SAVE_DIR = dict(directory=True, contents="the neutral checkpoint", replaced="which each save replaces whole")
STEP_DIRS = dict(directory=True, contents="the training checkpoints", replaced="which prunes its step_* directories",
                 replaces=lambda relative: bool(relative.parts) and relative.parts[0].startswith("step_"))


def _metrics(path: Path) -> Output:
    return Output("--metrics-out", path, directory=False, contents="the metrics log")


def _refusal(outputs: list[Output], overwrite: bool = False) -> str:
    with pytest.raises(ConfigError) as err:
        check_outputs(outputs, overwrite)
    return str(err.value)


# ---------------------------------------------------------------- one output: its kind and its place


def test_a_file_output_that_is_a_directory_is_refused(tmp_path):
    assert _refusal([_metrics(tmp_path)]) == f"--metrics-out {tmp_path}: is a directory"


def test_a_directory_output_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("mine", encoding="utf-8")
    assert _refusal([Output("--save-dir", tmp_path / "f", **SAVE_DIR)]) == (
        f"--save-dir {tmp_path / 'f'}: exists and is not a directory")


def test_an_output_under_a_regular_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "f").write_text("mine", encoding="utf-8")
    out = tmp_path / "f" / "deeper" / "m.jsonl"
    assert _refusal([_metrics(out)]) == f"--metrics-out {out}: cannot write there ({tmp_path / 'f'} is a file)"


def test_an_output_where_no_file_can_be_made_is_refused():
    # Root writes through file modes, so the unwritable place is one the kernel refuses to anyone: /proc.
    assert _refusal([_metrics(Path("/proc/self/m.jsonl"))]).startswith(
        "--metrics-out /proc/self/m.jsonl: cannot write there (")


def test_the_check_creates_nothing(tmp_path):
    check_outputs([Output("--save-dir", tmp_path / "a" / "b", **SAVE_DIR), _metrics(tmp_path / "c" / "m.jsonl")],
                  overwrite=False)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- one output: what it holds


def test_an_existing_file_output_is_refused_unless_overwrite_and_kept(tmp_path):
    (tmp_path / "m.jsonl").write_text("mine\n", encoding="utf-8")
    out = Output("--metrics-out", tmp_path / "m.jsonl", directory=False, contents="the metrics log",
                 hint=", or --resume the run that wrote it")
    assert _refusal([out]) == (f"--metrics-out {tmp_path / 'm.jsonl'}: exists; pass --overwrite to replace it, or "
                               f"--resume the run that wrote it")
    check_outputs([out], overwrite=True)
    assert (tmp_path / "m.jsonl").read_text(encoding="utf-8") == "mine\n"


def test_an_empty_existing_file_output_is_accepted(tmp_path):
    (tmp_path / "m.jsonl").touch()
    check_outputs([_metrics(tmp_path / "m.jsonl")], overwrite=False)


def test_an_outputs_own_rule_for_what_it_holds_is_refused_unless_overwrite(tmp_path):
    out = Output("--out", tmp_path, directory=True, contents="the results",
                 held=lambda path: f"--out {path}: holds results" if (path / "results.json").exists() else None)
    check_outputs([out], overwrite=False)
    (tmp_path / "results.json").write_text("{}", encoding="utf-8")
    assert _refusal([out]) == f"--out {tmp_path}: holds results"
    check_outputs([out], overwrite=True)


# ---------------------------------------------------------------- outputs together


def test_an_output_inside_one_that_a_save_replaces_is_refused_naming_both_and_the_loss(tmp_path):
    outputs = [Output("--save-dir", tmp_path, **SAVE_DIR), _metrics(tmp_path / "m.jsonl")]
    message = (f"--metrics-out {tmp_path / 'm.jsonl'} is inside --save-dir {tmp_path}, which each save replaces whole: "
               f"the metrics log would be lost; give each its own path")
    assert _refusal(outputs) == message
    assert _refusal(outputs, overwrite=True) == message  # nothing to overwrite: the run would destroy its own output


def test_an_output_on_the_same_path_as_one_a_save_replaces_is_refused(tmp_path):
    outputs = [Output("--save-dir", tmp_path, **SAVE_DIR), Output("--checkpoint-dir", tmp_path, **STEP_DIRS)]
    assert _refusal(outputs) == (f"--checkpoint-dir {tmp_path} is the same path as --save-dir {tmp_path}, which each "
                                 f"save replaces whole: the training checkpoints would be lost; give each its own path")


def test_only_the_paths_a_save_prunes_are_refused_inside_a_checkpoint_directory(tmp_path):
    root = Output("--checkpoint-dir", tmp_path, **STEP_DIRS)
    check_outputs([root, Output("--save-dir", tmp_path / "best", **SAVE_DIR)], overwrite=False)
    assert _refusal([root, Output("--save-dir", tmp_path / "step_00000005", **SAVE_DIR)]) == (
        f"--save-dir {tmp_path / 'step_00000005'} is inside --checkpoint-dir {tmp_path}, which prunes its step_* "
        f"directories: the neutral checkpoint would be lost; give each its own path")


def test_a_save_that_would_replace_the_working_directory_is_refused_even_with_overwrite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for save_dir in (Path("."), tmp_path.parent):
        message = _refusal([Output("--save-dir", save_dir, **SAVE_DIR)], overwrite=True)
        assert message.startswith(f"the working directory {tmp_path} ")
        assert message.endswith(f"--save-dir {save_dir}, which each save replaces whole: the directory this command "
                                f"runs in would be lost; give each its own path")


def test_an_input_a_save_would_replace_is_refused_unless_overwrite(tmp_path):
    outputs = [Output("--save-dir", tmp_path, **SAVE_DIR),
               Output("--init-from", tmp_path, directory=True, contents="the checkpoint it starts from", read=True)]
    assert _refusal(outputs) == (f"--init-from {tmp_path} is the same path as --save-dir {tmp_path}, which each save "
                                 f"replaces whole: the checkpoint it starts from would be lost; give each its own "
                                 f"path, or pass --overwrite")
    check_outputs(outputs, overwrite=True)


def test_two_outputs_on_one_path_are_refused(tmp_path):
    outputs = [_metrics(tmp_path / "x"), Output("--out", tmp_path / "x", directory=False, contents="the figures")]
    assert _refusal(outputs) == (f"--metrics-out {tmp_path / 'x'} is the same path as --out {tmp_path / 'x'}: both "
                                 f"would write it; give each its own path")


def test_an_output_inside_a_file_output_is_refused(tmp_path):
    outputs = [_metrics(tmp_path / "x"), Output("--save-dir", tmp_path / "x" / "best", **SAVE_DIR)]
    assert _refusal(outputs) == (f"--save-dir {tmp_path / 'x' / 'best'} is inside --metrics-out {tmp_path / 'x'}, "
                                 f"a file; give each its own path")


@pytest.mark.parametrize("name", ["step_00000042", ".step_00000042.tmp-x1", "step_00000042.orbax-checkpoint-tmp-1"])
def test_an_output_inside_a_step_directory_of_any_run_is_refused_even_with_overwrite(tmp_path, name):
    # No --checkpoint-dir among the outputs: the step directory is another run's, which its own pruning removes.
    out = Output("--checkpoint-dir", tmp_path / "run" / name / "x", **STEP_DIRS)
    message = (f"--checkpoint-dir {out.path}: inside {tmp_path / 'run' / name}, a training checkpoint's directory by "
               f"its name (step_N), which pruning a run's old checkpoints removes with everything in it; give it a "
               f"path outside any step_* directory")
    assert _refusal([out]) == message and _refusal([out], overwrite=True) == message


def test_an_output_named_as_a_step_directory_is_refused(tmp_path):
    assert _refusal([Output("--save-dir", tmp_path / "step_00000001", **SAVE_DIR)]) == (
        f"--save-dir {tmp_path / 'step_00000001'}: a training checkpoint's directory by its name (step_N), which "
        f"pruning a run's old checkpoints removes with everything in it; give it a path outside any step_* directory")


def test_a_name_that_only_starts_like_a_step_directory_is_accepted(tmp_path):
    check_outputs([Output("--save-dir", tmp_path / "step_size_study" / "best", **SAVE_DIR)], overwrite=False)


def test_outputs_are_compared_where_their_paths_lead(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    outputs = [Output("--save-dir", tmp_path / "real", **SAVE_DIR), _metrics(tmp_path / "link" / "m.jsonl")]
    assert "is inside --save-dir" in _refusal(outputs)


# ---------------------------------------------------------------- a training run's outputs


def _run_refusal(**settings) -> str:
    cfg = Config(**settings)
    with pytest.raises(ConfigError) as err:
        check_outputs(run_outputs(cfg), cfg.overwrite)
    return str(err.value)


def test_a_metrics_log_inside_the_save_dir_is_refused(tmp_path):
    assert _run_refusal(save_dir=str(tmp_path), metrics_out=str(tmp_path / "m.jsonl")) == (
        f"--metrics-out {tmp_path / 'm.jsonl'} is inside --save-dir {tmp_path}, which each save replaces whole: the "
        f"metrics log would be lost; give each its own path")


@pytest.mark.parametrize("settings, start", [
    (dict(save_dir="D", checkpoint_dir="D/ck", checkpoint_every=5), "--checkpoint-dir D/ck is inside --save-dir D"),
    (dict(save_dir="D", checkpoint_dir="D", checkpoint_every=5), "--checkpoint-dir D is the same path as --save-dir D"),
    (dict(save_dir="D", resume="D", checkpoint_every=5), "--resume D is the same path as --save-dir D"),
    (dict(save_dir="D", resume="D"), "--resume D is the same path as --save-dir D"),
    (dict(save_dir="D", checkpoint_every=5), None),  # runs/ beside D
    (dict(save_dir=".", checkpoint_every=5), "the working directory "),  # before runs/ inside it
    (dict(save_dir="R/step_00000005", checkpoint_dir="R", checkpoint_every=5),
     "--save-dir R/step_00000005 is inside --checkpoint-dir R, which prunes its step_* directories"),
    (dict(save_dir="R/best", checkpoint_dir="R", checkpoint_every=5), None),
    (dict(metrics_out="R/step_00000005/m.jsonl", checkpoint_dir="R", checkpoint_every=5),
     "--metrics-out R/step_00000005/m.jsonl is inside --checkpoint-dir R"),
])
def test_training_outputs_that_a_save_would_destroy_are_refused(tmp_path, monkeypatch, settings, start):
    monkeypatch.chdir(tmp_path)
    if start is None:
        check_outputs(run_outputs(Config(**settings)), overwrite=False)
    else:
        assert _run_refusal(**settings).startswith(start)


def test_the_checkpoint_a_run_starts_from_is_replaced_by_its_save_only_with_overwrite(tmp_path):
    message = _run_refusal(save_dir=str(tmp_path), init_from=str(tmp_path))
    assert message.endswith("the checkpoint this run starts from would be lost; give each its own path, or pass "
                            "--overwrite")
    check_outputs(run_outputs(Config(save_dir=str(tmp_path), init_from=str(tmp_path), overwrite=True)), True)


def test_a_metrics_log_that_is_a_directory_is_refused(tmp_path):
    assert _run_refusal(metrics_out=str(tmp_path)) == f"--metrics-out {tmp_path}: is a directory"


def test_a_resumed_run_goes_on_with_its_own_metrics_log(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"step": 0}\n', encoding="utf-8")
    assert _run_refusal(metrics_out=str(tmp_path / "m.jsonl")).startswith(f"--metrics-out {tmp_path / 'm.jsonl'}: "
                                                                           f"exists; pass --overwrite")
    check_outputs(run_outputs(Config(metrics_out=str(tmp_path / "m.jsonl"), resume=str(tmp_path / "run"))), False)


def _run_with_id(root: Path, run_id: str | None) -> Path:
    """``root`` holding one step directory whose progress record names ``run_id``, as a twin leaves it."""
    (root / "step_00000002").mkdir(parents=True)
    write_json(root / "step_00000002" / PROGRESS_FILE, asdict(Progress(2, 0, 2, run_id=run_id)))
    return root


def _log_of(path: Path, run_id: str | None) -> Path:
    header = {"step": 0, "run": {"framework": "torch"}, **({"run_id": run_id} if run_id else {})}
    path.write_text(json.dumps(header) + '\n{"step": 1, "epoch": 1, "loss": 0.5}\n', encoding="utf-8")
    return path


@pytest.mark.parametrize("log_id", ["another", None])
def test_a_resume_refuses_a_metrics_log_that_is_not_its_runs_unless_overwrite(tmp_path, log_id):
    run, log = _run_with_id(tmp_path / "run", "mine"), _log_of(tmp_path / "m.jsonl", log_id)
    assert _run_refusal(resume=str(run), metrics_out=str(log)) == (
        f"--metrics-out {log}: not the metrics log of the run in --resume {run} (its first record names another run, "
        f"or none), and resuming would cut it and add this run's records to it; give a new path, or pass --overwrite "
        f"to start it afresh")
    check_outputs(run_outputs(Config(resume=str(run), metrics_out=str(log), overwrite=True)), overwrite=True)


def test_a_resume_goes_on_with_the_metrics_log_whose_first_record_names_its_run(tmp_path):
    run, log = _run_with_id(tmp_path / "run", "mine"), _log_of(tmp_path / "m.jsonl", "mine")
    check_outputs(run_outputs(Config(resume=str(run), metrics_out=str(log))), overwrite=False)


@pytest.mark.slow
@pytest.mark.parametrize("twin", ["torch_impl", "jax_impl"])
def test_each_twin_refuses_a_metrics_log_inside_its_save_dir_before_reading_the_data(tmp_path, twin):
    # The corpus named does not exist: a check made after reading it would fail on the data instead.
    (tmp_path / "m.jsonl").write_text('{"step": 0, "run": "kept"}\n', encoding="utf-8")
    proc = run_python(["-m", f"{twin}.train", "--pos", str(tmp_path / "absent.txt"), "--neg",
                       str(tmp_path / "absent.txt"), "--no-progress", "--save-dir", str(tmp_path), "--metrics-out",
                       str(tmp_path / "m.jsonl")])
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: --metrics-out {tmp_path / 'm.jsonl'} is inside --save-dir {tmp_path}, which each "
                           f"save replaces whole: the metrics log would be lost; give each its own path\n")
    assert (tmp_path / "m.jsonl").read_bytes() == b'{"step": 0, "run": "kept"}\n'


# ---------------------------------------------------------------- modes of what a save writes


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in (root, *root.rglob("*"))}


def test_a_saved_neutral_checkpoint_gets_the_ordinary_modes_under_the_umask(tmp_path, umask_022):
    vocab = Vocab(("<pad>", "<unk>", "a"), "unk")
    cfg = Config(embed_dim=2, hidden_dim=2, layers=1)
    save_checkpoint(tmp_path / "ckpt", init_params(len(vocab), 2, 2, 1, seed=0), cfg, vocab, "word")
    assert _modes(tmp_path / "ckpt") == {".": 0o755, "config.json": 0o644, "vocab.json": 0o644,
                                         "model.safetensors": 0o644, "checksums.sha256": 0o644}


def test_an_atomic_directory_follows_the_umask_whatever_its_writer_chose(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_dir(tmp_path / "out", "a test") as tmp:
            (tmp / "sub").mkdir(mode=0o700)
            (tmp / "sub" / "f").write_bytes(b"x")
            (tmp / "sub" / "f").chmod(0o600)
    finally:
        os.umask(old)
    assert _modes(tmp_path / "out") == {".": 0o750, "sub": 0o750, "sub/f": 0o640}


def test_ordinary_modes_leave_a_symlinks_target_alone(tmp_path, umask_022):
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "target").chmod(0o600)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "link").symlink_to(tmp_path / "target")
    ordinary_modes(tmp_path / "d")
    assert stat.S_IMODE((tmp_path / "target").stat().st_mode) == 0o600


def test_a_ctrl_c_between_the_renames_of_a_directory_swap_leaves_the_new_directory_whole(tmp_path, monkeypatch):
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "weights").write_text("old")
    rename = os.replace

    def rename_then_interrupt(source, target):
        rename(source, target)
        signal.raise_signal(signal.SIGINT)  # right after the old directory is moved aside, before the new one lands

    monkeypatch.setattr(os, "replace", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt), interrupts.handled():
        with atomic_dir(final, "a checkpoint") as tmp:
            (tmp / "weights").write_text("new")
    assert (final / "weights").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # the old one removed, no debris

"""Training checkpoints: exact resume after a real SIGKILL, damage detection, and non-finite steps."""
from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common.errors import ConfigError
from common.loop import NonFiniteError
from common.metrics import read_metrics
from common.runstate import checkpoint_dirs, load_latest
from torch_impl import classifier as torch_classifier
from torch_impl import train as torch_train
from torch_impl.state import CARRY_FILE, MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE, load_training_state
from torch_impl.tests.conftest import run_cli, spawn_cli, tiny_args

pytestmark = pytest.mark.slow  # tens of seconds each on a 2-core CPU

EPOCHS = 3  # 24 steps each: the run ends at step 72
KILL_AFTER = 11  # between two checkpoints, in the first epoch


def _only_run_dir(cwd: Path) -> Path:
    (run_dir,) = (cwd / "runs").iterdir()
    return run_dir


def test_resume_after_sigkill_is_bitwise_the_uninterrupted_run(tmp_path, tiny_cfg):
    args = [*tiny_args(tiny_cfg.replace(epochs=EPOCHS)), "--checkpoint-every", "2"]
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full_dir.mkdir()
    cut_dir.mkdir()
    # The uninterrupted run and the one to kill run side by side (each is one thread). The second kills itself
    # right after step 11 returns: its newest checkpoint is step 10's, and step 11's work is lost.
    full = spawn_cli("torch_impl.train", *args, "--metrics-out", str(full_dir / "metrics.jsonl"),
                     "--save-dir", str(full_dir / "best"), cwd=full_dir)
    cut = spawn_cli("common.tests.kill_at_step", "torch_impl.train", "after", str(KILL_AFTER), *args,
                    "--metrics-out", str(cut_dir / "metrics.jsonl"), "--save-dir", str(cut_dir / "best"), cwd=cut_dir)
    assert cut.wait(timeout=120) == -signal.SIGKILL, cut.stderr.read()
    assert full.wait(timeout=120) == 0, full.stderr.read()
    run_dir = _only_run_dir(cut_dir)
    killed_at = checkpoint_dirs(run_dir)[-1][0]
    assert killed_at == 10  # the newest multiple of --checkpoint-every 2 before step 11

    resumed = run_cli("torch_impl.train", *args, "--metrics-out", str(cut_dir / "metrics.jsonl"),
                      "--save-dir", str(cut_dir / "best"), "--resume", str(run_dir), cwd=cut_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {run_dir / f'step_{killed_at:08d}'}" in resumed.stderr

    final = f"step_{24 * EPOCHS:08d}"
    for name in (MODEL_FILE, OPTIMIZER_FILE, CARRY_FILE, RNG_FILE):
        a = load_file(str(_only_run_dir(full_dir) / final / name))
        b = load_file(str(run_dir / final / name))
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key}"
    best = Path("best") / "model.safetensors"
    assert (full_dir / best).read_bytes() == (cut_dir / best).read_bytes()
    # The metrics file has every step once, no gap, and the same numbers.
    full_records = read_metrics(full_dir / "metrics.jsonl", timing=False)
    cut_records = read_metrics(cut_dir / "metrics.jsonl", timing=False)
    assert cut_records == full_records
    steps = [r["step"] for r in cut_records if "epoch" in r]
    assert steps == list(range(1, 24 * EPOCHS + 1))


def _short_run(tmp_path, monkeypatch, cfg, **changes):
    monkeypatch.chdir(tmp_path)
    return torch_train.train(cfg.replace(checkpoint_every=2, device="cpu", **changes))


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory, tiny_cfg):
    """A run directory holding step_2, step_4 and step_6."""
    folder = tmp_path_factory.mktemp("ckpts")
    with pytest.MonkeyPatch.context() as mp:
        _short_run(folder, mp, tiny_cfg, max_steps=6)
    return _only_run_dir(folder)


@pytest.mark.parametrize("damage", [_truncate, _flip_middle_byte])
@pytest.mark.parametrize("name", [MODEL_FILE, OPTIMIZER_FILE, CARRY_FILE, RNG_FILE, STATE_FILE, "progress.json"])
def test_a_damaged_state_file_is_named_and_the_previous_checkpoint_used(tmp_path, three_checkpoints, name, damage,
                                                                         capsys):
    root = tmp_path / "run"
    shutil.copytree(three_checkpoints, root)
    damage(root / "step_00000006" / name)
    progress, state, path = load_latest(root, load_training_state)
    assert progress.step == 4 and path.name == "step_00000004"
    assert f"{root / 'step_00000006' / name}:" in capsys.readouterr().err


def test_resume_refuses_other_trajectory_settings(tmp_path, three_checkpoints, tiny_cfg):
    with pytest.raises(ConfigError, match="--lr"):
        load_latest(three_checkpoints, load_training_state, cfg=tiny_cfg.replace(lr=0.01))


def _poison_gradient_at(monkeypatch, step: int) -> None:
    """Make the output layer's gradient infinite at training step ``step`` (a finite loss, a bad gradient)."""
    build = torch_classifier.model_from_config
    calls = {"n": 0}

    def poison(grad):
        calls["n"] += 1
        return grad * float("inf") if calls["n"] == step else grad

    def model_from_config(cfg, vocab_size):
        model = build(cfg, vocab_size)
        model.fc.bias.register_hook(poison)
        return model

    monkeypatch.setattr(torch_classifier, "model_from_config", model_from_config)


def test_nonfinite_step_stops_naming_it_and_keeps_the_good_checkpoint(tmp_path, monkeypatch, tiny_cfg):
    _poison_gradient_at(monkeypatch, 3)
    with pytest.raises(NonFiniteError, match=r"step 3 .*not finite"):
        _short_run(tmp_path, monkeypatch, tiny_cfg, max_steps=6)
    run_dir = _only_run_dir(tmp_path)
    assert [step for step, _ in checkpoint_dirs(run_dir)] == [2]
    params = load_file(str(run_dir / "step_00000002" / MODEL_FILE))
    assert all(torch.isfinite(t).all() for t in params.values())


def test_skip_nonfinite_skips_and_counts(tmp_path, monkeypatch, tiny_cfg):
    _poison_gradient_at(monkeypatch, 3)
    metrics = tmp_path / "metrics.jsonl"
    result = _short_run(tmp_path, monkeypatch, tiny_cfg, max_steps=6, skip_nonfinite=True,
                        metrics_out=str(metrics))
    assert result["steps"] == 6 and result["skipped_steps"] == 1
    record = read_metrics(metrics, timing=False)[3]  # after the run record and steps 1, 2
    assert record == {"step": 3, "epoch": 1, "loss": None}  # null: the step was skipped
    adam = load_file(str(_only_run_dir(tmp_path) / "step_00000006" / OPTIMIZER_FILE))
    assert adam["fc.bias.step"].item() == 5  # five updates in six steps
    assert json.loads((_only_run_dir(tmp_path) / "step_00000006" / "progress.json").read_text())["skipped"] == 1


def test_nan_output_is_a_nonfinite_step_too(tmp_path, monkeypatch, tiny_cfg):
    build = torch_classifier.model_from_config
    calls = {"n": 0}

    def nan_at_second_training_forward(module, inputs, output):
        if module.training:
            calls["n"] += 1
            if calls["n"] == 2:
                return output * float("nan")
        return output

    def model_from_config(cfg, vocab_size):
        model = build(cfg, vocab_size)
        model.fc.register_forward_hook(nan_at_second_training_forward)
        return model

    monkeypatch.setattr(torch_classifier, "model_from_config", model_from_config)
    result = _short_run(tmp_path, monkeypatch, tiny_cfg, max_steps=4, skip_nonfinite=True)
    assert result["skipped_steps"] == 1 and result["steps"] == 4


def test_resume_with_another_model_size_names_it_in_one_line(three_checkpoints, tiny_cfg, capsys):
    args = [*tiny_args(tiny_cfg), "--hidden-dim", "8", "--checkpoint-every", "2", "--resume", str(three_checkpoints)]
    assert torch_train.main(args) == 2
    assert capsys.readouterr().err == (f"error: --resume {three_checkpoints}: the run was trained with --hidden-dim "
                                       f"16, not 8. Resume with the same settings and data\n")


def test_resume_of_a_run_the_jax_twin_wrote_names_that_twin_in_one_line(tmp_path, tiny_cfg, capsys):
    args = [*tiny_args(tiny_cfg), "--checkpoint-every", "2", "--max-steps", "2", "--device", "cpu"]
    jax_run = run_cli("jax_impl.train", *args, "--checkpoint-dir", "run", cwd=tmp_path)
    assert jax_run.returncode == 0, jax_run.stderr
    assert torch_train.main([*args, "--resume", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (f"error: --resume {tmp_path / 'run'}: the run was written by the JAX twin "
                                       f"(python -m jax_impl.train), whose training checkpoints the PyTorch twin "
                                       f"(python -m torch_impl.train) does not read; resume it with that twin\n")

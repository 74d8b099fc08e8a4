"""Ctrl-C: SIGINT sent at a chosen point of a real training run (``common.tests.interrupt_at``) ends it with one line
and exit status 130, no traceback, the newest complete training checkpoint valid, and a run that resumes from it;
after training and in predict too (``common.tests.interrupt_program``)."""
from __future__ import annotations

import pytest

from common.checkpoint import save_checkpoint
from common.config import Config
from common.metrics import read_metrics, training_steps
from common.params import init_params
from common.runstate import checkpoint_dirs, load_latest
from common.text import Vocab
from torch_impl.state import load_training_state
from torch_impl.tests.conftest import run_cli, tiny_args

pytestmark = pytest.mark.slow  # a training subprocess each

# The tiny run: 24 steps an epoch, two epochs, a checkpoint every 2 steps, validation at each epoch's end.
# Each case: where SIGINT is sent, at which call, then the steps done and the newest checkpoint's step.
CASES = {"during a step": ("step", 5, 4, 4),
         "during a checkpoint save": ("save", 2, 4, 4),  # step 4's: it is finished first
         "during evaluation": ("eval", 1, 24, 22),  # the first epoch's end, before its checkpoint
         "in a garbage-collection callback": ("gc", 3, 2, 2)}  # raised at the next step's start


def _interrupted(tmp_path, tiny_cfg, point: str, n: int):
    args = [*tiny_args(tiny_cfg), "--checkpoint-every", "2", "--checkpoint-dir", "run",
            "--metrics-out", "metrics.jsonl"]
    return args, run_cli("common.tests.interrupt_at", "torch_impl.train", point, str(n), *args, cwd=tmp_path)


@pytest.mark.parametrize("case", list(CASES))
def test_sigint_is_one_line_and_exit_130_and_keeps_the_newest_checkpoint(tmp_path, tiny_cfg, capsys, case):
    point, n, done, newest = CASES[case]
    _, proc = _interrupted(tmp_path, tiny_cfg, point, n)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines() == ["training checkpoints: run (continue a stopped run with --resume run)",
                                        f"interrupted at step {done}; resume with --resume run"]
    steps = [step for step, _ in checkpoint_dirs(tmp_path / "run")]
    assert steps[-1] == newest and len(list((tmp_path / "run").iterdir())) == len(steps)  # nothing half-written
    progress, _, _ = load_latest(tmp_path / "run", load_training_state)
    assert progress.step == newest and capsys.readouterr().err == ""  # complete: no fallback
    records = training_steps(read_metrics(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == list(range(1, done + 1))


def test_a_run_interrupted_during_a_save_resumes_from_that_checkpoint(tmp_path, tiny_cfg):
    args, proc = _interrupted(tmp_path, tiny_cfg, "save", 2)
    assert proc.returncode == 130, proc.stderr
    resumed = run_cli("torch_impl.train", *args, "--resume", "run", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from run/step_00000004 (step 4, epoch 1, batch 4)" in resumed.stderr
    assert [r["step"] for r in training_steps(read_metrics(tmp_path / "metrics.jsonl"))] == list(range(1, 49))


def test_sigint_after_training_is_one_line_and_exit_130(tmp_path, tiny_cfg):
    proc = run_cli("common.tests.interrupt_program", "exit", "torch_impl.train", *tiny_args(tiny_cfg),
                   "--max-steps", "2", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (130, "interrupted\n")
    assert proc.stdout.splitlines()[-1].startswith("done: 2 steps")


def test_sigint_during_predict_is_one_line_and_exit_130(tmp_path):
    checkpoint = save_checkpoint(tmp_path / "ck", init_params(3, 4, 3, 1, seed=0),
                                 Config(embed_dim=4, hidden_dim=3, layers=1, seq_len=5),
                                 Vocab(("<pad>", "<unk>", "a")), "char")
    proc = run_cli("common.tests.interrupt_program", "call:common.checkpoint:load_checkpoint", "torch_impl.predict",
                   str(checkpoint), "a a", cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "interrupted\n")

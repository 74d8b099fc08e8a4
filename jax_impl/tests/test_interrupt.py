"""Ctrl-C: SIGINT sent at a chosen point of a real training run (``common.tests.interrupt_at``) ends it with one line
and exit status 130, no traceback (none from Orbax's threads either, no crash under XLA's compiler), the newest complete
training checkpoint valid, and a run that resumes from it; before training, after it, and in predict too
(``common.tests.interrupt_program``)."""
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from common.checkpoint import save_checkpoint
from common.config import Config
from common.data import prepare_data
from common.metrics import read_metrics, training_steps
from common.params import init_params
from common.runstate import checkpoint_dirs, load_latest
from common.text import Vocab
from jax_impl.classifier import model_from_config
from jax_impl.state import load_training_state
from jax_impl.step import create_train_state
from jax_impl.tests.conftest import tiny_config, write_corpus

pytestmark = pytest.mark.slow  # a training subprocess each

# 12 steps an epoch (60 texts), two epochs, a checkpoint every 2 steps, validation at each epoch's end.
# Each case: where SIGINT is sent, at which call, then the steps done and the newest checkpoint's step.
CASES = {"during a step": ("step", 5, 4, 4),  # the jitted step dispatched and running
         "during a checkpoint save": ("save", 2, 4, 4),  # step 4's, as Orbax has written it: it is finished first
         "during evaluation": ("eval", 1, 12, 10),  # the first epoch's end, before its checkpoint
         "in a garbage-collection callback": ("gc", 3, 2, 2)}  # where JAX's own callback runs; raised at step 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    return write_corpus(tmp_path_factory.mktemp("interrupt-corpus"), per_class=30)


def _flags(corpus) -> list[str]:
    return ["--pos", str(corpus[0]), "--neg", str(corpus[1]), "--embed-dim", "8", "--hidden-dim", "16", "--seq-len",
            "12", "--batch-size", "4", "--epochs", "2", "--log-every", "0", "--checkpoint-every", "2",
            "--checkpoint-dir", "run", "--metrics-out", "metrics.jsonl", "--no-progress", "--device", "cpu"]


def _run(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def _load(corpus, path: Path):
    cfg = tiny_config(*corpus, epochs=2)
    data = prepare_data(cfg)
    model = model_from_config(cfg, len(data.vocab))
    params = init_params(len(data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)
    device = jax.devices("cpu")[0]
    template = create_train_state(model, cfg, params, device)
    return load_training_state(path, template, jax.device_put(model.zero_carry(cfg.batch_size), device))


@pytest.mark.parametrize("case", list(CASES))
def test_sigint_is_one_line_and_exit_130_and_keeps_the_newest_checkpoint(tmp_path, corpus, capsys, case):
    point, n, done, newest = CASES[case]
    proc = _run(tmp_path, "common.tests.interrupt_at", "jax_impl.train", point, str(n), *_flags(corpus))
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines() == ["training checkpoints: run (continue a stopped run with --resume run)",
                                        f"interrupted at step {done}; resume with --resume run"]
    steps = [step for step, _ in checkpoint_dirs(tmp_path / "run")]
    assert steps[-1] == newest and len(list((tmp_path / "run").iterdir())) == len(steps)  # no Orbax temporary
    progress, _, _ = load_latest(tmp_path / "run", lambda p: _load(corpus, p))
    assert progress.step == newest and capsys.readouterr().err == ""  # complete, checksums and all: no fallback
    records = training_steps(read_metrics(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == list(range(1, done + 1))


def test_sigint_during_xla_compilation_is_one_line_and_exit_130_not_a_crash(tmp_path, corpus):
    # XLA compiles in a thread of its own, still at work when the interrupt ends the run: the interpreter's
    # finalisation would crash under it (SIGSEGV). Without the compilation cache, the step is compiled here.
    env = {name: value for name, value in os.environ.items() if name != "JAX_COMPILATION_CACHE_DIR"}
    proc = _run(tmp_path, "common.tests.interrupt_at", "jax_impl.train", "compile", "1", *_flags(corpus), env=env)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines() == ["training checkpoints: run (continue a stopped run with --resume run)",
                                        "interrupted at step 0; no training checkpoint to resume from"]
    assert not (tmp_path / "run").exists()  # nothing was saved, nothing half-written


def test_a_run_interrupted_during_a_save_resumes_from_that_checkpoint(tmp_path, corpus):
    assert _run(tmp_path, "common.tests.interrupt_at", "jax_impl.train", "save", "2", *_flags(corpus)).returncode == 130
    resumed = _run(tmp_path, "jax_impl.train", *_flags(corpus), "--resume", "run")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from run/step_00000004 (step 4, epoch 1, batch 4)" in resumed.stderr
    assert [r["step"] for r in training_steps(read_metrics(tmp_path / "metrics.jsonl"))] == list(range(1, 25))


def _flags_for_two_steps(corpus) -> list[str]:
    """:func:`_flags`' model (its compiled steps, cached, are the same), two steps, no checkpoints and no metrics."""
    return ["--pos", str(corpus[0]), "--neg", str(corpus[1]), "--embed-dim", "8", "--hidden-dim", "16", "--seq-len",
            "12", "--batch-size", "4", "--max-steps", "2", "--log-every", "0", "--no-progress", "--device", "cpu"]


def test_sigint_in_a_garbage_collection_callback_before_training_is_one_line_and_exit_130(tmp_path, corpus):
    # JAX runs a callback at every collection; Python drops what one raises, and the run used to go on to its end.
    proc = _run(tmp_path, "common.tests.interrupt_program", "gc:common.loop:train", "jax_impl.train",
                *_flags_for_two_steps(corpus), "--save-dir", "best")
    assert (proc.returncode, proc.stderr) == (130, "interrupted\n")
    assert "done:" not in proc.stdout and not (tmp_path / "best").exists()


def test_sigint_after_training_is_one_line_and_exit_130(tmp_path, corpus):
    proc = _run(tmp_path, "common.tests.interrupt_program", "exit", "jax_impl.train", *_flags_for_two_steps(corpus))
    assert (proc.returncode, proc.stderr) == (130, "interrupted\n")
    assert proc.stdout.splitlines()[-1].startswith("done: 2 steps")


def test_sigint_in_a_garbage_collection_callback_during_predict_is_one_line_and_exit_130(tmp_path):
    checkpoint = save_checkpoint(tmp_path / "ck", init_params(3, 4, 3, 1, seed=0),
                                 Config(embed_dim=4, hidden_dim=3, layers=1, seq_len=5),
                                 Vocab(("<pad>", "<unk>", "a")), "char")
    proc = _run(tmp_path, "common.tests.interrupt_program", "gc:common.checkpoint:load_checkpoint",
                "jax_impl.predict", str(checkpoint), "a a", "--device", "cpu")
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "interrupted\n", "")  # stopped before printing

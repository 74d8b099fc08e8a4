"""Training checkpoints: a run killed with SIGKILL and resumed ends bitwise where an uninterrupted run ends;
a damaged checkpoint is detected, named, and the previous one is used; a resume compares the LSTM implementation
that ran, not the flag that chose it."""
import logging
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from common.checkpoint import load_checkpoint
from common.config import Config
from common.errors import CheckpointError, ConfigError
from common.files import CHECKSUM_FILE
from common.metrics import read_metrics
from common.runstate import Progress, checkpoint_dirs, load_latest, step_dir
from common.data import prepare_data
from common.params import init_params
from jax_impl.recurrences import native
from jax_impl.recurrences.choice import Run, auto
from jax_impl.classifier import model_from_config
from jax_impl.tests.conftest import Tiny
from jax_impl.state import STATE_ITEM, load_training_state, save_training_state
from jax_impl.step import create_train_state
from jax_impl.train import train

pytestmark = pytest.mark.slow  # tens of seconds each on a 2-core CPU

RUN_DIR = Path("checkpoints")
PROGRESS_FILE = "progress/metadata"  # Orbax's JSON item  # relative to each run's working directory
KILL_BEFORE = 7  # the step after a checkpoint (--checkpoint-every 2)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Tiny:
    """A smaller corpus than ``tiny``'s (12 batches an epoch), so the runs below stay short."""
    from jax_impl.tests.conftest import tiny_config, write_corpus
    cfg = tiny_config(*write_corpus(tmp_path_factory.mktemp("small-corpus"), per_class=30))
    data = prepare_data(cfg)
    model = model_from_config(cfg, len(data.vocab))
    neutral = init_params(len(data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)
    return Tiny(cfg, data, model, neutral, None, None, jax.devices("cpu")[0])


def run_flags(tiny) -> list[str]:
    cfg = tiny.cfg
    return ["--pos", cfg.pos, "--neg", cfg.neg, "--embed-dim", "8", "--hidden-dim", "16", "--seq-len", "12",
            "--batch-size", "4", "--epochs", "2", "--log-every", "5", "--checkpoint-every", "2",
            "--checkpoint-dir", str(RUN_DIR), "--metrics-out", "metrics.jsonl", "--save-dir", "best",
            "--no-progress", "--device", "cpu"]  # bitwise reproducibility is a CPU claim


def load_state(tiny, step_dir: Path):
    template = create_train_state(tiny.model, tiny.cfg, tiny.neutral, tiny.device)
    carry = jax.device_put(tiny.model.zero_carry(tiny.cfg.batch_size), tiny.device)
    return load_training_state(step_dir, template, carry)


def uninterrupted(flags: list[str], folder: Path) -> Path:
    """A run of ``flags``, uninterrupted, in ``folder``; the folder. In its own process, as the killed run is: this
    one's thread settings (the parity suite's one intra-op thread) would reach a native kernel's record."""
    done = subprocess.run([sys.executable, "-m", "jax_impl.train", *flags], cwd=folder, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture(scope="module")
def reference(small, tmp_path_factory) -> Path:
    """An uninterrupted run of the same command line; its working directory."""
    return uninterrupted(run_flags(small), tmp_path_factory.mktemp("uninterrupted"))


def assert_killed_run_resumes_bitwise(small, flags: list[str], reference: Path, tmp_path: Path) -> None:
    """A run of ``flags`` killed with SIGKILL as step 7 begins, then resumed, ends where ``reference`` ended:
    the metrics, the final training state and the best-validation checkpoint, bit for bit."""
    command = [sys.executable, "-m", "jax_impl.train", *flags]
    # Killed as step 7 begins, right after the loop wrote step 6's checkpoint: the newest one, complete.
    victim = subprocess.run([sys.executable, "-m", "common.tests.kill_at_step", "jax_impl.train", "before",
                             str(KILL_BEFORE), *flags], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert victim.returncode == -signal.SIGKILL, victim.stderr
    killed_at = checkpoint_dirs(tmp_path / RUN_DIR)[-1][0]
    assert killed_at == 6
    total = sum(1 for line in (reference / "metrics.jsonl").read_text().splitlines() if '"epoch"' in line)
    assert total == 24  # two epochs of 12 batches: the kill is inside the run

    resumed = subprocess.run([*command, "--resume", str(RUN_DIR)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {RUN_DIR / f'step_{killed_at:08d}'}" in resumed.stderr

    # The metrics file: truncated at the resumed step, then the same records, bit for bit (timings aside).
    assert read_metrics(tmp_path / "metrics.jsonl", timing=False) == read_metrics(reference / "metrics.jsonl",
                                                                                  timing=False)
    # The final training state: params, Adam moments, step and carry identical.
    end_ref, end_res = (checkpoint_dirs(d / RUN_DIR)[-1] for d in (reference, tmp_path))
    assert end_ref[0] == end_res[0] == total
    for a, b in zip(jax.tree_util.tree_leaves(load_state(small, end_ref[1])[1]),
                    jax.tree_util.tree_leaves(load_state(small, end_res[1])[1])):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    # The best-validation neutral checkpoint too.
    best_ref, best_res = (load_checkpoint(d / "best").params for d in (reference, tmp_path))
    assert all(np.array_equal(best_ref[k], best_res[k]) for k in best_ref)


def test_a_killed_run_resumes_to_bitwise_the_same_end(small, reference, tmp_path):
    assert_killed_run_resumes_bitwise(small, run_flags(small), reference, tmp_path)


@pytest.mark.parametrize("impl,library", [("fused", None), ("onednn", "onednn_lstm"), ("kernel", "lstm_kernel")])
def test_a_killed_run_on_each_named_implementation_resumes_to_bitwise_the_same_end(small, tmp_path_factory, tmp_path,
                                                                                   impl, library):
    if library and native.unavailable(library):
        pytest.skip(native.unavailable(library))
    flags = [*run_flags(small), "--lstm-impl", impl]
    reference = uninterrupted(flags, tmp_path_factory.mktemp(f"uninterrupted-{impl}"))
    assert read_metrics(reference / "metrics.jsonl")[0]["run"]["lstm_impl"] == impl
    assert_killed_run_resumes_bitwise(small, flags, reference, tmp_path)


def test_reading_a_checkpoint_logs_no_warning(small, reference, caplog):
    with caplog.at_level(logging.WARNING):  # Orbax logs through absl, which hands its records to logging
        progress, _ = load_state(small, checkpoint_dirs(reference / RUN_DIR)[-1][1])
    assert progress.step == 24
    assert [record.getMessage() for record in caplog.records] == []


# Saves step 4, then is killed by SIGKILL inside the save of step 8, with Orbax's writes under way: when the save
# waits for them (its second wait: the first, at the save's start, waits for an earlier save). The debris a kill
# mid-save leaves.
KILLED_IN_A_SAVE = """
import os, signal, sys
from types import SimpleNamespace
import jax.numpy as jnp
import orbax.checkpoint as ocp
from common.runstate import Progress
from jax_impl.state import save_training_state
state = lambda step: SimpleNamespace(params={"w": jnp.ones(3)}, opt_state=(), step=jnp.int32(step))
save_training_state(sys.argv[1], Progress(4, 0, 4), state(4), jnp.zeros(2), keep=3)
waits, wait = [], ocp.CheckpointManager.wait_until_finished
def dying(manager):
    waits.append(manager)
    if len(waits) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return wait(manager)
ocp.CheckpointManager.wait_until_finished = dying
save_training_state(sys.argv[1], Progress(8, 0, 8), state(8), jnp.zeros(2), keep=3)
"""


def test_a_save_after_a_kill_inside_a_save_logs_no_warning_and_leaves_no_debris(tmp_path, caplog):
    from types import SimpleNamespace

    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    killed = subprocess.run([sys.executable, "-c", KILLED_IN_A_SAVE, str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert ocp.step.tmp_checkpoints(tmp_path) != []  # Orbax's temporary step directory, half written
    with caplog.at_level(logging.WARNING):  # Orbax logs through absl, which hands its records to logging
        save_training_state(tmp_path, Progress(8, 0, 8), SimpleNamespace(
            params={"w": jnp.ones(3)}, opt_state=(), step=jnp.int32(8)), jnp.zeros(2), keep=3)
    assert [record.getMessage() for record in caplog.records] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000008"]


def test_a_validation_that_is_not_finite_is_saved_as_standard_json(tmp_path):
    import json
    from types import SimpleNamespace

    import jax.numpy as jnp

    from common.runstate import read_progress

    last_val = {"step": 2, "loss": 710.0, "perplexity": float("inf")}
    path = save_training_state(tmp_path, Progress(2, 0, 2, best_val_loss=710.0, last_val=last_val), SimpleNamespace(
        params={"w": jnp.ones(3)}, opt_state=(), step=jnp.int32(2)), jnp.zeros(2), keep=1)

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    written = json.loads((path / PROGRESS_FILE).read_text(encoding="utf-8"), parse_constant=refuse)
    assert written["last_val"] == {"step": 2, "loss": 710.0, "perplexity": None}
    assert np.isnan(read_progress(path, "jax").last_val["perplexity"])


def damage(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if len(data) > 1 else b"\xff\xfe")


def test_every_damaged_file_is_named_and_the_previous_checkpoint_is_used(small, reference, tmp_path, capsys):
    steps = checkpoint_dirs(reference / RUN_DIR)
    (_, newest_dir), (previous, _) = steps[-1], steps[-2]
    files = sorted(p.relative_to(newest_dir) for p in newest_dir.rglob("*") if p.is_file())
    assert Path(CHECKSUM_FILE) in files and Path(PROGRESS_FILE) in files and len(files) > 5
    for relative in files:
        root = tmp_path / str(relative).replace("/", "_")
        shutil.copytree(reference / RUN_DIR, root)
        damage(root / newest_dir.name / relative)
        progress, _, used = load_latest(root, lambda p: load_state(small, p))
        assert progress.step == previous and used.name == f"step_{previous:08d}", relative
        warning = capsys.readouterr().err
        assert str(relative.name) in warning and "falling back" in warning, (relative, warning)


def test_an_altered_byte_is_detected_even_when_the_size_is_unchanged(small, reference, tmp_path):
    step_dir = checkpoint_dirs(reference / RUN_DIR)[-1][1]
    copy = tmp_path / step_dir.name
    shutil.copytree(step_dir, copy)
    biggest = max((p for p in (copy / STATE_ITEM).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0x01
    biggest.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{biggest.name}: contents differ"):
        load_state(small, copy)


def test_a_state_with_nonfinite_values_is_refused(tiny, tmp_path):
    state = create_train_state(tiny.model, tiny.cfg, tiny.neutral, tiny.device)
    params = jax.tree_util.tree_map(lambda x: x, state.params)
    params["fc"]["bias"] = params["fc"]["bias"] * np.nan
    save_training_state(tmp_path, Progress(0, 0, 0), state.replace(params=params),
                        jax.device_put(tiny.model.zero_carry(4), tiny.device), keep=1)
    with pytest.raises(CheckpointError, match=r"\['params'\]\['fc'\]\['bias'\] holds non-finite values"):
        load_state(tiny, step_dir(tmp_path, 0))


def test_resume_with_another_model_size_names_it_in_one_line(small, reference, tmp_path):
    shutil.copytree(reference / RUN_DIR, tmp_path / RUN_DIR)
    flags = [*run_flags(small), "--hidden-dim", "8", "--resume", str(RUN_DIR)]
    resumed = subprocess.run([sys.executable, "-m", "jax_impl.train", *flags], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 2
    assert resumed.stderr == (f"error: --resume {RUN_DIR}: the run was trained with --hidden-dim 16, not 8. Resume "
                              f"with the same settings and data\n")


def test_resume_of_a_run_the_torch_twin_wrote_names_that_twin_in_one_line(small, tmp_path):
    def run(trainer: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", trainer, *run_flags(small), *extra], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    assert run("torch_impl.train", "--max-steps", "2").returncode == 0
    resumed = run("jax_impl.train", "--resume", str(RUN_DIR))
    assert resumed.returncode == 2
    assert resumed.stderr == (f"error: --resume {RUN_DIR}: the run was written by the PyTorch twin (python -m "
                              f"torch_impl.train), whose training checkpoints the JAX twin (python -m jax_impl.train) "
                              f"does not read; resume it with that twin\n")


@pytest.fixture(scope="module")
def auto_run(small, tmp_path_factory) -> tuple[Config, str]:
    """Two steps under ``--lstm-impl auto`` with a training checkpoint at step 2: (its config, the implementation auto
    ran)."""
    cfg = small.cfg.replace(lstm_impl="auto", max_steps=2, checkpoint_every=2,
                            checkpoint_dir=str(tmp_path_factory.mktemp("auto-run") / "run"))
    ran = train(cfg)["lstm_impl"]
    assert ran == auto(Run(platform="cpu"))[0]
    return cfg, ran


def resume_of(auto_run, tmp_path: Path, lstm_impl: str) -> Config:
    """The config resuming a copy of ``auto_run``'s checkpoints (a resume writes its own) for 2 more steps under
    ``--lstm-impl lstm_impl``."""
    cfg, _ = auto_run
    shutil.copytree(cfg.checkpoint_dir, tmp_path / "run")
    return cfg.replace(lstm_impl=lstm_impl, resume=str(tmp_path / "run"), checkpoint_dir=None, max_steps=4)


def test_a_run_under_auto_resumes_under_the_implementation_auto_ran_by_name(auto_run, tmp_path):
    ran = auto_run[1]
    result = train(resume_of(auto_run, tmp_path, ran))
    assert (result["steps"], result["lstm_impl"]) == (4, ran)


def test_a_run_under_auto_is_refused_under_another_implementation_naming_both(auto_run, tmp_path):
    with pytest.raises(ConfigError, match=rf"^--resume {tmp_path / 'run'}: the run was trained with --lstm-impl "
                                          rf"'auto' \(which ran {auto_run[1]}\), not 'scan'\. Resume with the same "
                                          rf"settings and data$"):
        train(resume_of(auto_run, tmp_path, "scan"))

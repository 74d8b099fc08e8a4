"""Data parallelism under torchrun: 2 gloo processes train what 1 process trains, and what 2 JAX devices train.

The 2-process run is the real command line, ``torchrun --nproc_per_node 2 -m torch_impl.train`` on 127.0.0.1,
the JAX run ``python -m jax_impl.train --devices 2`` on 2 simulated CPU devices (both subprocesses: this
module imports no JAX). Small model: embed 32, hidden 32, seq_len 50, global batch 50, 50 steps over 3 epochs,
dropout 0 (each rank draws its own dropout masks, so with dropout the runs differ by design).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from common.batches import Batch
from common.config import Config, parse_config
from common.errors import ConfigError
from common.metrics import evaluations as metric_evaluations, read_metrics
from common.tests.losses import step_losses
from torch_impl.distributed import World, check_config, dropout_seed
from torch_impl.tests.conftest import ROOT, write_corpus
from torch_impl.train import train

pytestmark = pytest.mark.slow  # tens of seconds each on a 2-core CPU

STEPS = 50


def small_flags(pos: Path, neg: Path) -> list[str]:
    return ["--pos", str(pos), "--neg", str(neg), "--tokenizer", "word", "--embed-dim", "32", "--hidden-dim", "32",
            "--seq-len", "50", "--batch-size", "50", "--epochs", "3", "--max-steps", str(STEPS), "--dropout", "0",
            "--fc-dropout", "0", "--log-every", "0", "--no-progress", "--device", "cpu"]


def run_flags(pos: Path, neg: Path, out: Path) -> list[str]:
    """The small run with the log line every 25 steps, writing its metrics, best-validation checkpoint and
    training checkpoints (every 25 steps and at epoch ends) under ``out``."""
    return [*small_flags(pos, neg), "--log-every", "25", "--metrics-out", str(out / "metrics.jsonl"), "--save-dir",
            str(out / "best"), "--checkpoint-every", "25", "--checkpoint-dir", str(out / "checkpoints")]


def losses(path: Path) -> np.ndarray:
    """Per-step training losses of a metrics JSONL file, in step order."""
    return np.array(step_losses(read_metrics(path)), np.float64)


def evaluations(path: Path) -> np.ndarray:
    """(loss, accuracy) of every validation and test record."""
    return np.array([(r["loss"], r["accuracy"]) for r in metric_evaluations(read_metrics(path))], np.float64)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    # A JAX process shares a GPU only if it does not take 75% of its memory at start.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           **extra}
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo talks over the loopback interface only
    return env


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    # 1400 texts → 1120 training texts → 22 batches of 50 per epoch.
    return write_corpus(tmp_path_factory.mktemp("dp-corpus"), per_class=700, seed=1)


def start(command: list[str], out: Path, **env: str) -> subprocess.Popen:
    """``command`` in the background, its output in ``out``/stdout.txt and stderr.txt."""
    return subprocess.Popen(command, cwd=ROOT, env=subprocess_env(**env), stdout=open(out / "stdout.txt", "w"),
                            stderr=open(out / "stderr.txt", "w"))


def finished(proc: subprocess.Popen, out: Path) -> str:
    """Wait for ``proc``; its stdout (the test fails with its stderr's tail if it failed)."""
    proc.wait(timeout=600)
    assert proc.returncode == 0, (out / "stderr.txt").read_text()[-3000:]
    return (out / "stdout.txt").read_text()


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """The torchrun run and the JAX run, started together: each spends most of its time in single-threaded
    start-up (imports, rendezvous, compilation), so on 2 cores they overlap well."""
    torch_out, jax_out = tmp_path_factory.mktemp("dp-torch-two"), tmp_path_factory.mktemp("dp-jax-two")
    torchrun = ["--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                str(free_port())]
    procs = {"torch": (torch_out, start([sys.executable, "-m", "torch.distributed.run", *torchrun, "-m",
                                         "torch_impl.train", *run_flags(*corpus, torch_out)], torch_out)),
             "jax": (jax_out, start([sys.executable, "-m", "jax_impl.train", *small_flags(*corpus), "--devices", "2",
                                     "--metrics-out", str(jax_out / "metrics.jsonl")], jax_out,
                                    XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu"))}
    yield procs
    for _, proc in procs.values():
        if proc.poll() is None:  # a test failed before waiting for it
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def two_processes(runs) -> tuple[Path, str]:
    """``torchrun --nproc_per_node 2 -m torch_impl.train``: its output directory and stdout."""
    out, proc = runs["torch"]
    return out, finished(proc, out)


@pytest.fixture(scope="module")
def jax_two_devices(runs) -> Path:
    """``python -m jax_impl.train --devices 2`` on 2 simulated CPU devices: its metrics file."""
    out, proc = runs["jax"]
    finished(proc, out)
    return out / "metrics.jsonl"


@pytest.fixture(scope="module")
def one_process(corpus, runs, tmp_path_factory) -> Path:
    """The same run in this process (while the subprocess runs go on)."""
    out = tmp_path_factory.mktemp("dp-torch-one")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun process (OMP_NUM_THREADS=1)
    try:
        train(parse_config(run_flags(*corpus, out), "test", "test"))
    finally:
        torch.set_num_threads(threads)
    return out


def test_two_processes_train_what_one_process_trains(one_process, two_processes):
    one, two = losses(one_process / "metrics.jsonl"), losses(two_processes[0] / "metrics.jsonl")
    assert len(one) == len(two) == STEPS
    diff = np.abs(one - two)
    print(f"torch 1 vs 2 processes: max per-step loss difference {diff.max():.3g}")
    # DDP's average of the two half-batch mean gradients is the global-batch mean gradient exactly in
    # arithmetic; only the order of float32 sums differs.
    assert diff.max() <= 1e-5
    # Validation and test (of the best-validation weights, which rank 0 read back and broadcast).
    np.testing.assert_allclose(evaluations(two_processes[0] / "metrics.jsonl"),
                               evaluations(one_process / "metrics.jsonl"), atol=1e-5)


def test_the_training_checkpoint_holds_the_global_carry(one_process, two_processes):
    # The ranks' carries, gathered in rank order, are the single process's carry over the whole batch.
    one = load_file(str(one_process / "checkpoints" / f"step_{STEPS:08d}" / "carry.safetensors"))
    two = load_file(str(two_processes[0] / "checkpoints" / f"step_{STEPS:08d}" / "carry.safetensors"))
    assert one["h"].shape == two["h"].shape == (2, 50, 32)
    np.testing.assert_allclose(two["h"], one["h"], atol=1e-5)
    np.testing.assert_allclose(two["c"], one["c"], atol=1e-5)


def test_only_rank_zero_prints(two_processes):
    stdout = two_processes[1]
    assert sum(line.startswith("done:") for line in stdout.splitlines()) == 1
    assert sum(line.startswith("Epoch:") for line in stdout.splitlines()) == 2  # --log-every 25, 50 steps


def test_two_processes_train_what_two_jax_devices_train(two_processes, jax_two_devices):
    torch_losses, jax_losses = losses(two_processes[0] / "metrics.jsonl"), losses(jax_two_devices)
    assert len(torch_losses) == len(jax_losses) == STEPS
    diff = np.abs(torch_losses - jax_losses)
    print(f"torch 2 processes vs jax 2 devices: max per-step loss difference {diff.max():.3g}")
    # Two frameworks' float32 kernels and reduction orders over 50 Adam steps: the parity suite's tolerance.
    assert diff.max() <= 1e-4


def test_each_rank_takes_its_contiguous_rows_of_the_global_batch():
    tokens = np.arange(6 * 3, dtype=np.int32).reshape(6, 3)
    batch = Batch(tokens, np.arange(6, dtype=np.float32), np.arange(1, 7, dtype=np.int32))
    parts = [World(rank, 2, rank).part(batch) for rank in range(2)]
    assert [p.size for p in parts] == [3, 3]
    np.testing.assert_array_equal(np.concatenate([p.tokens for p in parts]), tokens)
    np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), batch.labels)
    hidden = (torch.arange(2 * 6 * 4.0).reshape(2, 6, 4), torch.zeros(2, 6, 4))
    assert torch.equal(torch.cat([World(r, 2, r).part_hidden(hidden)[0] for r in range(2)], dim=1), hidden[0])


def test_an_evaluation_batch_splits_into_shares_differing_by_at_most_one():
    assert [World(rank, 3, rank).rows(7) for rank in range(3)] == [slice(0, 2), slice(2, 4), slice(4, 7)]
    assert [World(rank, 2, rank).rows(1) for rank in range(2)] == [slice(0, 0), slice(0, 1)]


def test_devices_must_agree_with_torchrun():
    with pytest.raises(ConfigError, match=r"--devices 2: .*torchrun --nproc_per_node 2"):
        check_config(Config(devices=2), None)
    check_config(Config(devices=2), World(0, 2, 0))
    check_config(Config(devices=0), World(0, 2, 0))


def test_the_global_batch_must_split_evenly_over_the_processes():
    with pytest.raises(ConfigError, match="--batch-size 50 does not split evenly over 3 processes"):
        check_config(Config(batch_size=50), World(0, 3, 0))


def test_rank_zero_keeps_the_single_process_dropout_seed():
    assert dropout_seed(7, 0) == 7
    assert len({dropout_seed(7, rank) for rank in range(4)}) == 4
    assert dropout_seed(7, 1, step=100) != dropout_seed(7, 1)


def test_a_rank_that_fails_ends_the_whole_run_within_seconds_with_its_line(corpus, tmp_path):
    # Rank 0 alone checks --save-dir (here a file) and stops; rank 1 goes on into DDP's first broadcast, which
    # rank 0 never joins. torchrun ends rank 1 as soon as rank 0 exits; the process group's timeout is the backstop.
    (tmp_path / "file").write_text("")
    torchrun = ["--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                str(free_port())]
    tic = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", *torchrun, "-m", "torch_impl.train",
                           *small_flags(*corpus), "--save-dir", str(tmp_path / "file")], cwd=ROOT,
                          env=subprocess_env(LSTM_TWINS_DDP_TIMEOUT="20"), capture_output=True, text=True,
                          timeout=300)
    elapsed = time.monotonic() - tic
    assert proc.returncode != 0
    assert f"error: --save-dir {tmp_path / 'file'}: exists and is not a directory" in proc.stderr
    assert elapsed < 20 + 40, elapsed  # start-up (imports, rendezvous, data) plus at most the timeout


def mean_of_a_nan_worker(rank: int, port: int, folder: str) -> None:
    """One gloo rank: the mean over 2 ranks of a loss that is NaN on rank 1 only, written to ``folder/<rank>``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    loss = World(rank, 2, rank).mean(torch.tensor(float("nan") if rank == 1 else 0.25))
    Path(folder, str(rank)).write_text(repr(float(loss)))
    torch.distributed.destroy_process_group()


def test_a_nan_on_one_rank_is_the_loss_every_rank_sees(tmp_path):
    # The loop stops on a non-finite step loss; every rank reads this mean, so every rank stops at the same step.
    torch.multiprocessing.spawn(mean_of_a_nan_worker, args=(free_port(), str(tmp_path)), nprocs=2)
    assert [(tmp_path / str(rank)).read_text() for rank in range(2)] == ["nan", "nan"]

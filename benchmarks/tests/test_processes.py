"""The worker processes: one past its limit is stopped and becomes a result; a worker's environment; the load
meter's arithmetic."""
import os
import signal
import time

import pytest

from benchmarks import processes


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="the request that never ends waits on a FIFO")
def test_a_worker_past_its_timeout_becomes_a_timeout_result(tmp_path):
    # A request that can never be answered: the run's metrics file is a FIFO nobody reads, and opening it for
    # writing blocks until a reader comes. (The corpus cannot be the FIFO: the reader refuses what is not a file.)
    # Whatever the worker is doing when the timeout ends (importing torch, reading the corpus, blocked on the FIFO),
    # it cannot have replied, so the outcome does not depend on how fast this machine is.
    (tmp_path / "pos.txt").write_text("".join(f"good {i}\n" for i in range(20)), encoding="utf-8")
    (tmp_path / "neg.txt").write_text("".join(f"bad {i}\n" for i in range(20)), encoding="utf-8")
    os.mkfifo(tmp_path / "metrics.jsonl")
    config = {"pos": str(tmp_path / "pos.txt"), "neg": str(tmp_path / "neg.txt"), "batch_size": 4,
              "metrics_out": str(tmp_path / "metrics.jsonl")}
    worker = processes.Worker("torch", processes.worker_environ(1, "cpu", str(tmp_path)), tmp_path)
    worker.send({"op": "train", "config": config, "threads": 1})
    assert worker.receive(0.2) == {"error": "timeout: stopped after 0.2 s", "timed_out": True}
    assert worker.receive(5) == {"error": "timeout: stopped after 0.2 s"}  # and it stays dead
    assert worker.proc.poll() == -signal.SIGKILL  # stopped by the harness, and gone


def test_workers_sharing_a_gpu_do_not_preallocate_and_cpu_workers_hide_it(tmp_path):
    gpu = processes.worker_environ(2, "gpu", str(tmp_path))
    assert gpu["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and gpu["OMP_NUM_THREADS"] == "2"
    cpu = processes.worker_environ(1, "cpu", str(tmp_path))
    assert (cpu["JAX_PLATFORMS"], cpu["CUDA_VISIBLE_DEVICES"]) == ("cpu", "")
    assert cpu.get("XLA_PYTHON_CLIENT_PREALLOCATE") == os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")  # untouched


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the load meter reads /proc")
def test_cpu_seconds_count_this_process_as_its_own_work():
    before, cpu0 = processes.cpu_seconds([os.getpid()]), time.process_time()
    while time.process_time() - cpu0 < 0.3:  # 0.3 s of this process's CPU time, however busy the machine is
        pass
    after, own = processes.cpu_seconds([os.getpid()]), time.process_time() - cpu0
    assert after[1] - before[1] == pytest.approx(own, abs=0.05)  # clock ticks of 10 ms
    # The machine's busy time includes it, so others' load (busy minus own) leaves this process's work out.
    assert after[0] - before[0] >= after[1] - before[1] - 0.05


def test_load_from_others_is_unknown_without_a_reading():
    assert processes.others_load(None, (5.0, 1.0), 1.0) is None
    assert processes.others_load((1.0, 0.5), (4.0, 1.5), 2.0) == pytest.approx(1.0)  # (3 s busy - 1 s own) / 2 s


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="the vector width is read from /proc/cpuinfo")
def test_the_environment_names_the_cpus_widest_vector_set():
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    expected = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"
    assert processes.environment()["vector_isa"] == expected


def test_a_worker_compiles_into_its_entrys_cache_and_nowhere_else(tmp_path):
    env = processes.worker_environ(1, "cpu", str(tmp_path))
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "xla")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"  # every program, however quick to compile


def test_a_worker_of_another_environment_starts_outside_the_checkout_without_it_on_its_path(tmp_path):
    # A stand-in interpreter that writes down where it started, its arguments and whether PYTHONPATH reached it.
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\n{ pwd; echo "$@"; echo "PYTHONPATH=${PYTHONPATH-unset}"; } > "$0.said"\n',
                      encoding="utf-8")
    python.chmod(0o755)
    env = processes.worker_environ(1, "cpu", str(tmp_path / "cache"))
    assert env["PYTHONPATH"] == str(processes.REPO_ROOT)
    worker = processes.Worker("jax", env, tmp_path, python=str(python))
    assert "exited with status 0" in worker.receive(30)["error"]
    assert (tmp_path / "python.said").read_text(encoding="utf-8").splitlines() == [
        str(tmp_path), "-m benchmarks.worker jax", "PYTHONPATH=unset"]

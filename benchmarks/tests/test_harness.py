"""The subprocess runner: a worker past its limit is stopped and becomes a result; the load meter's arithmetic."""
import os
import time

import pytest

from benchmarks import harness


def test_a_worker_past_its_timeout_becomes_a_timeout_result(tmp_path):
    env = harness.worker_environ(1, "cpu", str(tmp_path))
    worker = harness.Worker("torch", env, tmp_path)
    start = time.perf_counter()
    worker.send({"op": "setup", "config": {"batch_size": 4}, "hooks": {}, "threads": 1, "warmup": 0,
                 "phases": ["eval"], "n_train": 1})
    reply = worker.receive(0.2)  # far less than importing a framework takes
    assert reply == {"error": "timeout: stopped after 0.2 s", "timed_out": True}
    assert worker.receive(5) == {"error": "timeout: stopped after 0.2 s"}  # and it stays dead
    assert worker.proc.poll() is not None and time.perf_counter() - start < 10


def test_workers_sharing_a_gpu_do_not_preallocate_and_cpu_workers_hide_it(tmp_path):
    gpu = harness.worker_environ(2, "gpu", str(tmp_path))
    assert gpu["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and gpu["OMP_NUM_THREADS"] == "2"
    cpu = harness.worker_environ(1, "cpu", str(tmp_path))
    assert (cpu["JAX_PLATFORMS"], cpu["CUDA_VISIBLE_DEVICES"]) == ("cpu", "")
    assert cpu.get("XLA_PYTHON_CLIENT_PREALLOCATE") == os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")  # untouched


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the load meter reads /proc")
def test_load_from_others_does_not_count_the_benchmarks_own_work():
    pids = [os.getpid()]
    start, before = time.perf_counter(), harness.cpu_seconds(pids)
    end = start + 0.3
    while time.perf_counter() < end:  # this process keeps one core busy: its own, so not "other" load
        pass
    after = harness.cpu_seconds(pids)
    assert after[1] - before[1] >= 0.2  # the busy loop is counted as this process's own
    load = harness.others_load(before, after, time.perf_counter() - start)
    # Other processes may use the other cores meanwhile (a shared machine), but not this one's: it is subtracted.
    assert load is not None and load < harness.usable_cpus() - 0.5


def test_load_from_others_is_unknown_without_a_reading():
    assert harness.others_load(None, (5.0, 1.0), 1.0) is None
    assert harness.others_load((1.0, 0.5), (4.0, 1.5), 2.0) == pytest.approx(1.0)  # (3 s busy - 1 s own) / 2 s

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
def test_cpu_seconds_count_this_process_as_its_own_work():
    before, cpu0 = harness.cpu_seconds([os.getpid()]), time.process_time()
    while time.process_time() - cpu0 < 0.3:  # 0.3 s of this process's CPU time, however busy the machine is
        pass
    after, own = harness.cpu_seconds([os.getpid()]), time.process_time() - cpu0
    assert after[1] - before[1] == pytest.approx(own, abs=0.05)  # clock ticks of 10 ms
    # The machine's busy time includes it, so others' load (busy minus own) leaves this process's work out.
    assert after[0] - before[0] >= after[1] - before[1] - 0.05


def test_load_from_others_is_unknown_without_a_reading():
    assert harness.others_load(None, (5.0, 1.0), 1.0) is None
    assert harness.others_load((1.0, 0.5), (4.0, 1.5), 2.0) == pytest.approx(1.0)  # (3 s busy - 1 s own) / 2 s

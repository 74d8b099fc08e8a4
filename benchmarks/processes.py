"""The benchmark's processes, seen from the parent: a persistent worker (``python -m benchmarks.worker``) with its
environment fixed before it imports a framework, the request and reply lines it answers, and how it is stopped; and
what the machine gives them: the usable CPUs, the load from *other* processes, the environment a run records.

Every worker gets a session of its own, so a timeout or Ctrl-C ends it and whatever it started
(:func:`kill_group`); :func:`ending_raises` and :func:`signals_held` let a parent stop its children on SIGTERM as
on Ctrl-C.
"""
import contextlib
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Iterator

from benchmarks.hosts import isa_from_flags

REPO_ROOT = Path(__file__).resolve().parents[1]
REPLY_TAG = "@@ "  # a worker's answer line; anything else on its stdout is ignored
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity): what the thread pools size themselves to."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def environment() -> dict:
    """Machine, CPU model, software versions and date; the workers add devices, threads, precision, XLA's setup."""
    installed = {str(d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            first = f.read().split("\n\n")[0]  # the first CPU's block
        info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)}
        cpu, flags = info["model name"], info.get("flags", "")
    except (OSError, KeyError):
        cpu, flags = platform.processor() or platform.machine(), ""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu_model": cpu,
            "vector_isa": isa_from_flags(flags) if flags else None,
            "cpu_count": os.cpu_count(), "usable_cpus": usable_cpus(), "platform": platform.platform(),
            "python": sys.version.split()[0], "load_average_start": load_average(),
            "versions": {n: installed.get(n) for n in ("jax", "jaxlib", "flax", "optax", "torch", "numpy")}}


def worker_environ(threads: int, device: str, cache_dir: str, extra: dict | None = None) -> dict[str, str]:
    """A child's environment, fixed before it imports a framework: thread pools, platform, and compile caches in
    ``cache_dir`` only (empty for the first process that uses it: nothing compiled before the run is reused)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", **(extra or {}),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
           "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton"), "JAX_ENABLE_COMPILATION_CACHE": "true",
           "JAX_COMPILATION_CACHE_DIR": os.path.join(cache_dir, "xla"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    env.update({var: str(threads) for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    if device == "cpu":
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the workers share the GPU: else the first takes 75%
        if device == "gpu":
            env.setdefault("JAX_PLATFORMS", "cuda")
    return env


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc`` and every process in its group, then reap it. ``proc`` must lead a group of its own
    (started with ``start_new_session=True``): the group is named by its pid."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


ENDING = (signal.SIGTERM, signal.SIGHUP)  # what a supervisor, ``timeout`` or a closed terminal sends to end a program


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and :data:`ENDING` held back inside the block and delivered as it ends: a clean-up that runs whole."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *ENDING})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _exit_on(signum, frame) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def ending_raises() -> Iterator[None]:
    """Inside the block (in the main thread, where Python runs handlers), SIGTERM and SIGHUP raise
    ``SystemExit(128 + signal)`` where the program is, so that its ``finally`` blocks run (children stopped,
    temporary files removed) and it ends with the status a shell gives a process the signal ended (143, 129)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _exit_on) for s in ENDING}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


class Worker:
    """One persistent worker: ``send(msg)``, then ``receive(timeout_s)`` its reply (``{"error": ...}`` once dead;
    :func:`benchmarks.harness.outcome` reads any reply).

    ``python``: the interpreter of another environment (a venv of ``python -m studies.versions``), whose worker runs
    the copy of this package installed there: it starts in ``workdir``, without this checkout on its path."""

    def __init__(self, framework: str, env: dict, workdir: Path, python: str | None = None):
        self.log = Path(tempfile.mkstemp(prefix=f"{framework}-", suffix=".stderr", dir=workdir)[1])
        if python is not None:
            env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        with open(self.log, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen([python or sys.executable, "-m", "benchmarks.worker", framework],
                                         cwd=REPO_ROOT if python is None else workdir, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                         start_new_session=True)
        self.replies: queue.Queue = queue.Queue()
        self.dead: str | None = None
        self.waiting = False  # a request is unanswered: on close the worker is busy, so it is stopped
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(REPLY_TAG):
                self.replies.put(json.loads(line[len(REPLY_TAG):]))
        self.replies.put(None)  # the worker exited

    def send(self, msg: dict) -> None:
        self.waiting = True
        with contextlib.suppress(OSError):  # it died: receive() says how
            print(json.dumps(msg), file=self.proc.stdin, flush=True)

    def receive(self, timeout_s: float) -> dict:
        if self.dead is None:
            try:
                reply = self.replies.get(timeout=timeout_s)
            except queue.Empty:
                kill_group(self.proc)
                self.dead = f"timeout: stopped after {timeout_s:g} s"
                return {"error": self.dead, "timed_out": True}
            if reply is not None:
                self.waiting = False
                return reply
            self.proc.wait()
            last = self.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]  # its stderr's
            self.dead = f"worker exited with status {self.proc.returncode}: {' | '.join(last)}"
        return {"error": self.dead}

    def close(self) -> None:
        """Ask an idle worker to quit; stop a busy one (Ctrl-C in the middle of a request)."""
        if self.waiting:
            kill_group(self.proc)
        elif self.proc.poll() is None:
            self.send({"op": "quit"})
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_group(self.proc)


def cpu_seconds(pids: list[int]) -> tuple[float, float] | None:
    """The machine's busy CPU seconds so far (/proc/stat; steal counts) and those of ``pids`` (all their threads);
    None where /proc is missing. Two readings give the load from *other* processes: :func:`others_load`."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return None
    own = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="ascii") as f:  # OSError: gone
            own += sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])  # utime, stime
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS, own / TICKS


def others_load(before: tuple[float, float] | None, after: tuple[float, float] | None, wall_s: float) -> float | None:
    """Cores used by other processes between two :func:`cpu_seconds` readings ``wall_s`` apart."""
    if before is None or after is None:
        return None
    return max(0.0, (after[0] - before[0] - (after[1] - before[1])) / wall_s)

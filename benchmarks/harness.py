"""Every subprocess of the benchmark, and the paired, interleaved rounds that take every speed figure.

Every mode runs its work in persistent workers (:class:`Worker`, ``python -m benchmarks.worker``): convergence asks
one per run to train, and each speed entry (a variant at a configuration and replicate: the base run, a sweep point,
a device count) gets its own (one per torch rank) that builds, compiles and warms the twin once: every worker loads
its data and twin at once, then each is set up (compiled, warmed) in turn. Then, round after round
and for each step kind, the entries time their steps in turn, the order rotated by one place each round; an
entry's round time is the median of its steps there. Each round records the load from other processes (``busy``:
above half the usable cores). Every process gets a session of its own, so a timeout or Ctrl-C ends it and
whatever it started.
"""
from __future__ import annotations

from importlib import metadata
import json
import os
import platform
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.schema import EntryResult, Round, Session, Setup

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
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu_model": cpu,
            "cpu_count": os.cpu_count(), "usable_cpus": usable_cpus(), "platform": platform.platform(),
            "python": sys.version.split()[0], "load_average_start": load_average(),
            "versions": {n: installed.get(n) for n in ("jax", "jaxlib", "flax", "optax", "torch", "numpy")}}


def worker_environ(threads: int, device: str, cache_dir: str, extra: dict | None = None) -> dict[str, str]:
    """A child's environment, fixed before it imports a framework: thread pools, platform, cold compile caches."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", **(extra or {}),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
           "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton"), "JAX_ENABLE_COMPILATION_CACHE": "false"}
    env.update({var: str(threads) for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if device == "cpu":
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the workers share the GPU: else the first takes 75%
        if device == "gpu":
            env.setdefault("JAX_PLATFORMS", "cuda")
    return env


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _tail(path: Path, lines: int) -> str:
    return " | ".join(path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:])


class Worker:
    """One persistent worker: ``send(msg)``, then ``receive(timeout_s)`` its reply (``{"error": ...}`` once dead)."""

    def __init__(self, framework: str, env: dict, workdir: Path):
        self.log = Path(tempfile.mkstemp(prefix=f"{framework}-", suffix=".stderr", dir=workdir)[1])
        with open(self.log, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.worker", framework], cwd=REPO_ROOT, env=env,
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
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it died: receive() says how

    def receive(self, timeout_s: float) -> dict:
        if self.dead is None:
            try:
                reply = self.replies.get(timeout=timeout_s)
            except queue.Empty:
                _kill(self.proc)
                self.dead = f"timeout: stopped after {timeout_s:g} s"
                return {"error": self.dead, "timed_out": True}
            if reply is not None:
                self.waiting = False
                return reply
            self.proc.wait()
            self.dead = f"worker exited with status {self.proc.returncode}: {_tail(self.log, 5)}"
        return {"error": self.dead}

    def close(self) -> None:
        """Ask an idle worker to quit; stop a busy one (Ctrl-C in the middle of a request)."""
        if self.waiting:
            _kill(self.proc)
        elif self.proc.poll() is None:
            self.send({"op": "quit"})
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _kill(self.proc)


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
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                own += sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])  # utime, stime
        except OSError:  # gone
            pass
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS, own / TICKS


def others_load(before: tuple[float, float] | None, after: tuple[float, float] | None, wall_s: float) -> float | None:
    """Cores used by other processes between two :func:`cpu_seconds` readings ``wall_s`` apart."""
    if before is None or after is None:
        return None
    return max(0.0, (after[0] - before[0] - (after[1] - before[1])) / wall_s)


@dataclass(frozen=True)
class Entry:
    label: str
    framework: str
    config: dict  # Config fields, validated by the worker (a choice this Config lacks makes a skipped entry)
    threads: int = 1
    few_steps: bool = False  # one training step per round
    parity: bool = False  # runs the parity steps
    parity_reference: str | None = None  # also runs them in this dtype (the baseline's float32 for a bfloat16 run)
    timeout_s: float = 1800.0  # per request: set-up, or one round's steps
    ranks: int = 1  # torch data-parallel processes (torchrun's environment, without the launcher)
    xla_devices: int = 0  # simulated XLA CPU devices
    replicate: int = 1  # which of the variant's worker processes (each with its own start and compile)

    @property
    def key(self) -> str:
        return f"{self.label}#{self.replicate}"


@dataclass(frozen=True)
class Plan:
    rounds: int
    steps: int  # training steps per entry and round
    eval_steps: int
    warmup: int
    parity_steps: int = 0
    gemm_n: int = 0  # side of the peak-rate matmul (0: not measured)
    phases: tuple[str, ...] = ("eval", "train")  # set-up order: inference first, its peak memory read before
    parts_steps: int = 1  # training steps per entry and round in the "parts" phase


class Member:
    """An entry's processes: a request goes to every rank; the answer is rank 0's, or the first error."""

    def __init__(self, e: Entry, device: str, work: Path):
        extra = {"BENCH_THREADS": str(e.threads)}
        if e.xla_devices:  # read by the host platform only: a GPU host's real devices are unaffected
            extra["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} " \
                f"--xla_force_host_platform_device_count={e.xla_devices}".strip()
        if e.ranks > 1:
            with socket.socket() as s:  # a free port for the process group
                s.bind(("127.0.0.1", 0))
                extra.update(WORLD_SIZE=str(e.ranks), LOCAL_WORLD_SIZE=str(e.ranks), MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=str(s.getsockname()[1]))
        env = worker_environ(e.threads, device, tempfile.mkdtemp(prefix="cache-", dir=work), extra)
        ranks = [{**env, "RANK": str(r), "LOCAL_RANK": str(r)} if e.ranks > 1 else env for r in range(e.ranks)]
        self.entry, self.workers = e, [Worker(e.framework, env, work) for env in ranks]

    def send(self, msg: dict) -> None:
        for w in self.workers:
            w.send(msg)

    def receive(self) -> dict:
        replies = [w.receive(self.entry.timeout_s) for w in self.workers]
        return next((r for r in replies if "error" in r or "user_error" in r), replies[0])

    def request(self, msg: dict) -> dict:
        self.send(msg)
        return self.receive()

    def close(self) -> None:
        for w in self.workers:
            w.close()


def run(entries: list[Entry], plan: Plan, device: str, progress: bool = True) -> Session:
    """Every entry set up, then ``plan.rounds`` paired rounds, then parity and the GEMM peak. An entry that raised a
    user error is ``skipped``; one that crashed or overran ``failed``/``timeout``."""
    from tqdm import tqdm

    out = Session(entries={}, rounds={k: [] for k in plan.phases})
    live: list[Member] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as work, \
            tqdm(total=len(entries) + plan.rounds, unit="stage", file=sys.stderr, disable=not progress) as bar:
        loading: dict[str, Member] = {}
        try:
            # Every worker starts and loads at once (imports, corpus, vocabulary: nothing timed, mostly one thread
            # each); once all have loaded, compiling and everything timed runs one worker at a time.
            bar.set_description("load")
            for e in entries:
                loading[e.key] = Member(e, device, Path(work))
                loading[e.key].send({"op": "load", "config": e.config, "threads": e.threads})
            loaded = {key: member.receive() for key, member in loading.items()}
            for e in entries:
                bar.set_description(f"set up {e.label}")
                refused = next((x for x in out.entries.values() if x.label == e.label and x.status in ("n/a",
                                                                                                  "skipped")), None)
                member = loading.pop(e.key)
                if refused:  # the variant does not apply here: its other replicates would say so again
                    member.close()
                    out.entries[e.key] = EntryResult(e.label, e.replicate, refused.status, refused.error)
                else:
                    live += _set_up(e, member, loaded[e.key], plan, out.entries)
                bar.update()
            pids = [os.getpid(), *(w.proc.pid for m in live for w in m.workers)]
            for r in range(plan.rounds):
                bar.set_description(f"round {r + 1}/{plan.rounds}")
                for kind in plan.phases:
                    ok = [m for m in live if out.entries[m.entry.key].status == "ok"]
                    order = ok[r % len(ok):] + ok[:r % len(ok)] if ok else []
                    start, before = time.perf_counter(), cpu_seconds(pids)
                    for m in order:
                        e = out.entries[m.entry.key]
                        reply = m.request({"op": "steps", "kind": kind, "n": e.steps_per_round[kind]})
                        if "step_s" not in reply:  # lost mid-run: its rounds so far stay, the row says why it stopped
                            e.status, e.error = "timeout" if reply.get("timed_out") else "failed", reply.get("error")
                        elif kind == "parts":  # each part's median over the round's steps
                            for part in reply["step_s"][0]:
                                median = statistics.median(x[part] for x in reply["step_s"])
                                e.round_s.setdefault(part, []).append(median)
                        else:
                            e.round_s[kind].append(statistics.median(reply["step_s"]))
                    load = others_load(before, cpu_seconds(pids), time.perf_counter() - start)
                    out.rounds[kind].append(Round([m.entry.key for m in order], load,
                                                  load is not None and load > 0.5 * usable_cpus()))
                bar.update()
            _parity_and_peak([m for m in live if out.entries[m.entry.key].status == "ok"], plan, out)
        finally:
            for m in [*live, *loading.values()]:
                m.close()
    return out


def _set_up(e: Entry, member: Member, reply: dict, plan: Plan, entries: dict[str, EntryResult]) -> list[Member]:
    """``member``, whose load answered ``reply``, set up: ``[member]``, or ``[]`` and its entry's reason."""
    if "loaded" in reply:
        reply = member.request({"op": "setup", "warmup": plan.warmup, "phases": plan.phases})
    if "error" in reply or "user_error" in reply or "not_applicable" in reply:
        member.close()
        status = ("n/a" if "not_applicable" in reply else "skipped" if "user_error" in reply
                  else "timeout" if reply.get("timed_out") else "failed")
        # n/a after set-up (Dynamo compiled nothing) keeps what was measured; refused before it, nothing was
        setup = Setup(**{k: v for k, v in reply.items() if k != "not_applicable"}) if "vocab_size" in reply else None
        entries[e.key] = EntryResult(e.label, e.replicate, status, reply.get("not_applicable") or
                                     reply.get("user_error") or reply["error"], setup)
        return []
    entries[e.key] = EntryResult(e.label, e.replicate, "ok", None, Setup(**reply),
                                 {k: [] for k in plan.phases if k != "parts"},
                                 {"train": 1 if e.few_steps else plan.steps, "eval": plan.eval_steps,
                                  "parts": plan.parts_steps})
    return [member]


def _parity_and_peak(ok: list[Member], plan: Plan, out: Session) -> None:
    for m in (m for m in ok if plan.parity_steps and m.entry.parity):
        for dtype in (None, m.entry.parity_reference) if m.entry.parity_reference else (None,):
            reply = m.request({"op": "parity", "n": plan.parity_steps, "dtype": dtype})
            out.parity[m.entry.label + (f" {dtype}" if dtype else "")] = (reply.get("losses") or reply.get("error")
                                                                          or reply.get("user_error"))
    for framework in dict.fromkeys(m.entry.framework for m in ok) if plan.gemm_n else ():  # one worker per library
        reply = next(m for m in ok if m.entry.framework == framework).request({"op": "gemm", "n": plan.gemm_n})
        for library, v in reply.get("gemm", {}).items():
            if library not in out.gemm or v["gflop_s"] > out.gemm[library]["gflop_s"]:
                out.gemm[library] = v

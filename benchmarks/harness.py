"""The paired, interleaved rounds that take every speed figure, and what a worker's reply means.

Each speed entry (a variant at a configuration and replicate: the base run, a sweep point, a device count) gets its
own worker process (one per torch rank: :class:`Member`) that builds, compiles and warms the twin once: the workers
load their data and twin as many at a time as there are usable cores, then each is set up (compiled, warmed) in turn,
a variant's replicates sharing one compile cache (:func:`compile_cache`). Then, round after round and for each
step kind, the entries time their steps in turn, the order rotated by one place each round; an entry's round time is
the median of its steps there. Each round records the load from other processes (``busy``: above half the usable
cores). Every reply, from set-up to the GEMM peak (and convergence mode's whole trainings), is read by
:func:`outcome`.
"""
import hashlib
import json
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from benchmarks.processes import Worker, cpu_seconds, others_load, usable_cpus, worker_environ
from benchmarks.schema import EntryResult, Round, Session, Setup


def outcome(reply: dict) -> tuple[str, str | None]:
    """A worker's reply as ``(status, message)``, the statuses of :class:`EntryResult`: ``ok`` (no message);
    ``n/a``, the library cannot compute the variant (``not_applicable``: its reason); ``skipped``, a user error (the
    variant does not apply here); ``failed``, it raised or its worker died; ``timeout``, stopped at its limit."""
    if "not_applicable" in reply:
        return "n/a", reply["not_applicable"]
    if "user_error" in reply:
        return "skipped", reply["user_error"]
    if "error" in reply:
        return "timeout" if reply.get("timed_out") else "failed", reply["error"]
    return "ok", None


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
    parts: bool = True  # times the training step's parts (the "parts" phase), if the plan has that phase
    python: str | None = None  # the interpreter of another environment, whose installed package the worker runs

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

    def phases_of(self, e: Entry) -> tuple[str, ...]:
        """The phases ``e`` runs: the plan's, less the parts where the entry does not time them."""
        return tuple(k for k in self.phases if k != "parts" or e.parts)


def compile_cache(e: Entry, work: Path) -> Path:
    """The compile caches of ``e``'s replicates, one folder for all of them and for no other entry: the first replicate
    compiles cold (its compile time is the row's), the others load the same executables instead of compiling them
    again (a replicate samples a fresh process, not a fresh compiler: XLA's output for one program is the same)."""
    key = json.dumps([e.label, e.config, e.xla_devices, e.ranks, e.python], sort_keys=True)
    return work / f"cache-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


class Member:
    """An entry's processes: a request goes to every rank; the answer is rank 0's, or the first that is not ok."""

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
        env = worker_environ(e.threads, device, str(compile_cache(e, work)), extra)
        ranks = [{**env, "RANK": str(r), "LOCAL_RANK": str(r)} if e.ranks > 1 else env for r in range(e.ranks)]
        self.entry, self.workers = e, [Worker(e.framework, env, work, e.python) for env in ranks]

    def send(self, msg: dict) -> None:
        for w in self.workers:
            w.send(msg)

    def receive(self) -> dict:
        replies = [w.receive(self.entry.timeout_s) for w in self.workers]
        return next((r for r in replies if outcome(r)[0] != "ok"), replies[0])

    def request(self, msg: dict) -> dict:
        self.send(msg)
        return self.receive()

    def close(self) -> None:
        for w in self.workers:
            w.close()


def run(entries: list[Entry], plan: Plan, device: str, progress: bool = True) -> Session:
    """Every entry set up, then ``plan.rounds`` paired rounds, then parity and the GEMM peak. An entry whose reply is
    not ok, in set-up or in a round, takes the status :func:`outcome` reads in it (``n/a``, ``skipped``, ``failed``,
    ``timeout``) and keeps the rounds it had."""
    from tqdm import tqdm

    out = Session(entries={}, rounds={k: [] for k in plan.phases})
    members: dict[str, Member] = {}  # every entry's, closed at the end whatever happens
    live: list[Member] = []  # those set up
    with tempfile.TemporaryDirectory(prefix="bench-") as work, \
            tqdm(total=len(entries) + plan.rounds, unit="stage", file=sys.stderr, disable=not progress) as bar:
        try:
            # The workers load (imports, corpus, vocabulary, the part-timed step's functions, the parity twin's step:
            # nothing timed or reported) as many at a time as there are usable cores, most of that work being
            # single-threaded: more at once only thrash. Once all have loaded, compiling and all timing run one worker
            # at a time.
            bar.set_description("load")
            clock = time.perf_counter()
            loaded = _load(entries, members, plan, device, Path(work))
            clock = _lap(out.wall_s, "load", clock)
            for e in entries:
                bar.set_description(f"set up {e.label}")
                refused = next((x for x in out.entries.values() if x.label == e.label and x.status in ("n/a",
                                                                                                  "skipped")), None)
                if refused:  # the variant does not apply here: its other replicates would say so again
                    members[e.key].close()
                    out.entries[e.key] = EntryResult(e.label, e.replicate, refused.status, refused.error)
                else:
                    live += _set_up(e, members[e.key], loaded[e.key], plan, out.entries)
                clock = _lap(out.wall_s, f"setup {e.key}", clock)
                bar.update()
            pids = [os.getpid(), *(w.proc.pid for m in live for w in m.workers)]
            for r in range(plan.rounds):
                bar.set_description(f"round {r + 1}/{plan.rounds}")
                for kind in plan.phases:
                    ok = [m for m in live if out.entries[m.entry.key].status == "ok"
                          and kind in plan.phases_of(m.entry)]
                    order = ok[r % len(ok):] + ok[:r % len(ok)] if ok else []
                    start, before = time.perf_counter(), cpu_seconds(pids)
                    for m in order:
                        e = out.entries[m.entry.key]
                        reply = m.request({"op": "steps", "kind": kind, "n": e.steps_per_round[kind]})
                        status, message = outcome(reply)
                        if status != "ok":  # lost mid-run: its rounds so far stay, the row says why it stopped
                            e.status, e.error = status, message
                        elif kind == "parts":  # each part's median over the round's steps
                            for part in reply["step_s"][0]:
                                e.round_s.setdefault(part, []).append(median(x[part] for x in reply["step_s"]))
                        else:
                            e.round_s[kind].append(median(reply["step_s"]))
                    load = others_load(before, cpu_seconds(pids), time.perf_counter() - start)
                    out.rounds[kind].append(Round([m.entry.key for m in order], load,
                                                  load is not None and load > 0.5 * usable_cpus()))
                bar.update()
            clock = _lap(out.wall_s, "rounds", clock)
            _parity_and_peak([m for m in live if out.entries[m.entry.key].status == "ok"], plan, out)
        finally:
            for m in members.values():
                m.close()
    return out


def parity_dtypes(e: Entry) -> list[str | None]:
    """The dtypes of ``e``'s parity runs: its own (None), and its reference's where it has one."""
    return [None, e.parity_reference] if e.parity_reference else [None]


def _load(entries: list[Entry], members: dict[str, Member], plan: Plan, device: str, work: Path) -> dict[str, dict]:
    """Every entry's worker started and loaded, :func:`usable_cpus` at a time (the next starting as one finishes);
    ``members`` gets each as it starts. Returns each one's reply to ``load``, by key."""
    done: queue.Queue = queue.Queue()

    def start(e: Entry) -> None:
        members[e.key] = member = Member(e, device, work)
        member.send({"op": "load", "config": e.config, "threads": e.threads, "parts": "parts" in plan.phases_of(e),
                     "parity_dtypes": parity_dtypes(e) if plan.parity_steps and e.parity else []})
        threading.Thread(target=lambda: done.put((e.key, member.receive())), daemon=True).start()

    def collect() -> None:
        key, reply = done.get()
        loaded[key] = reply

    lanes, loaded = usable_cpus(), {}
    for e in entries[:lanes]:
        start(e)
    for e in entries[lanes:]:
        collect()
        start(e)
    while len(loaded) < len(entries):
        collect()
    return loaded


def _lap(wall_s: dict[str, float], stage: str, since: float) -> float:
    """``wall_s[stage]`` the seconds since ``since``; returns now."""
    now = time.perf_counter()
    wall_s[stage] = now - since
    return now


def _set_up(e: Entry, member: Member, reply: dict, plan: Plan, entries: dict[str, EntryResult]) -> list[Member]:
    """``member``, whose load answered ``reply``, set up: ``[member]``, or ``[]`` and its entry's reason."""
    if outcome(reply)[0] == "ok":
        reply = member.request({"op": "setup", "warmup": plan.warmup, "phases": plan.phases_of(e),
                                "overheads": e.replicate == 1})
    status, message = outcome(reply)
    # n/a after set-up (Dynamo compiled nothing) keeps what was measured; refused before it, nothing was
    setup = Setup(**{k: v for k, v in reply.items() if k != "not_applicable"}) if "vocab_size" in reply else None
    if status != "ok":
        member.close()
        entries[e.key] = EntryResult(e.label, e.replicate, status, message, setup)
        return []
    entries[e.key] = EntryResult(e.label, e.replicate, "ok", None, setup,
                                 {k: [] for k in plan.phases_of(e) if k != "parts"},
                                 {"train": 1 if e.few_steps else plan.steps, "eval": plan.eval_steps,
                                  "parts": plan.parts_steps})
    return [member]


def _parity_and_peak(ok: list[Member], plan: Plan, out: Session) -> None:
    """Each parity entry's losses (or why it has none) into ``out.parity``; each library's best GEMM rate into
    ``out.gemm``, measured by one worker per framework (a worker that fails it measures nothing)."""
    clock = time.perf_counter()
    for m in (m for m in ok if plan.parity_steps and m.entry.parity):
        for dtype in parity_dtypes(m.entry):
            reply = m.request({"op": "parity", "n": plan.parity_steps, "dtype": dtype})
            status, message = outcome(reply)
            key = m.entry.label + (f" {dtype}" if dtype else "")
            out.parity[key] = reply["losses"] if status == "ok" else message
        clock = _lap(out.wall_s, f"parity {m.entry.label}", clock)
    for framework in dict.fromkeys(m.entry.framework for m in ok) if plan.gemm_n else ():  # one worker per library
        reply = next(m for m in ok if m.entry.framework == framework).request({"op": "gemm", "n": plan.gemm_n})
        for library, v in reply["gemm"].items() if outcome(reply)[0] == "ok" else ():
            if library not in out.gemm or v["gflop_s"] > out.gemm[library]["gflop_s"]:
                out.gemm[library] = v
    if plan.gemm_n:
        _lap(out.wall_s, "gemm", clock)

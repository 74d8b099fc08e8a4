"""What a benchmark run does: the variants, the sweeps, the quick configuration, and the list of jobs.

Every job is one worker process (``benchmarks.worker``) timing one variant of one twin at one
configuration. Sweeps vary one :class:`~common.config.Config` field at a time around the base
configuration and run each framework's main variant.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from common.config import Config
from common.errors import ConfigError

FRAMEWORKS = ("torch", "jax")


@dataclass(frozen=True)
class Variant:
    framework: str
    name: str
    description: str
    default: bool  # part of a run without --variants
    main: bool = False  # the variant users train with: parity and sweeps run it
    timeout_s: float | None = None  # a tighter limit for variants known to compile for a very long time

    @property
    def label(self) -> str:
        return f"{self.framework}:{self.name}"


VARIANTS = (
    Variant("torch", "eager", "nn.LSTM in eager mode (oneDNN kernels on the CPU, cuDNN on a GPU)", True, True),
    Variant("torch", "compile", "torch.compile(model) with default settings", True),
    Variant("torch", "compile-rnn", "torch.compile with torch._dynamo.config.allow_rnn=True (LSTM traced "
            "and unrolled; experimental, compiles very slowly)", False, timeout_s=300.0),
    Variant("torch", "compile-step", "torch.compile of the trainer's train_step/eval_step functions (loss, "
            "backward, clipping and Adam included where Dynamo traces them)", False),
    Variant("jax", "jit", "the jitted train/eval steps as the trainer builds them (the fast recurrence of "
            "jax_impl.recurrence: custom VJP, two-layer wavefront, embedding folded in)", True, True),
    Variant("jax", "scan", "the reference path: Flax nn.RNN over the cell (a lax.scan, autodiff), the same "
            "jitted steps otherwise", True),
    Variant("jax", "unroll-2", "the reference scan unrolled 2 steps per loop iteration", False),
    Variant("jax", "unroll-4", "the reference scan unrolled 4 steps per loop iteration (SentimentRNN.unroll)", False),
    Variant("jax", "unroll-8", "the reference scan unrolled 8 steps per loop iteration", False),
    Variant("jax", "unroll-16", "the reference scan unrolled 16 steps per loop iteration", False),
)

# --quick: a smoke run of the whole pipeline in well under a minute.
QUICK_CONFIG = {"embed_dim": 16, "hidden_dim": 16, "seq_len": 16, "batch_size": 8}
QUICK_STEPS, QUICK_WARMUP, QUICK_PARITY_STEPS = 5, 1, 5
MIN_STEPS = 20


def select_variants(spec: str, frameworks: Sequence[str]) -> list[Variant]:
    """``'default'``, ``'all'``, or a comma list of ``framework:name`` (or a bare name, unique to a twin)."""
    available = [v for v in VARIANTS if v.framework in frameworks]
    if spec == "default":
        return [v for v in available if v.default]
    if spec == "all":
        return available
    chosen: list[Variant] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        matches = [v for v in VARIANTS if item in (v.label, v.name)]
        if not matches:
            raise ConfigError(f"--variants: unknown variant {item!r} (known: default, all, "
                              f"{', '.join(v.label for v in VARIANTS)})")
        for v in matches:
            if v.framework not in frameworks:
                raise ConfigError(f"--variants {item}: the {v.framework} twin is not among --frameworks")
            if v not in chosen:
                chosen.append(v)
    if not chosen:
        raise ConfigError("--variants: no variant named")
    return chosen


def main_variant(framework: str) -> Variant:
    return next(v for v in VARIANTS if v.framework == framework and v.main)


def parse_frameworks(spec: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        if name not in FRAMEWORKS:
            raise ConfigError(f"--frameworks: unknown framework {name!r} (known: {', '.join(FRAMEWORKS)})")
    if not names:
        raise ConfigError("--frameworks: name at least one of torch, jax")
    return list(dict.fromkeys(names))


def _parse_value(f: dataclasses.Field, text: str, where: str) -> Any:
    kind = type(f.default) if f.default is not None else str
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
        return kind(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a valid {kind.__name__}") from None


@dataclass(frozen=True)
class Sweep:
    field: str
    values: tuple[Any, ...]


def parse_sweep(spec: str, base: Config) -> Sweep:
    """``'batch_size=16,50,128'`` (``batch-size`` also accepted) → a :class:`Sweep`; every value is checked
    by building the Config it gives."""
    where = f"--sweep {spec}"
    if "=" not in spec:
        raise ConfigError(f"{where}: expected FIELD=V1,V2,... (e.g. batch_size=16,50,128)")
    name, _, values_text = spec.partition("=")
    name = name.strip().replace("-", "_")
    known = {f.name: f for f in dataclasses.fields(Config)}
    if name not in known:
        raise ConfigError(f"{where}: no configuration field {name!r} (e.g. batch_size, hidden_dim, seq_len)")
    items = [v.strip() for v in values_text.split(",") if v.strip()]
    if not items:
        raise ConfigError(f"{where}: no values")
    values = tuple(dict.fromkeys(_parse_value(known[name], v, where) for v in items))
    for value in values:
        try:
            base.replace(**{name: value})
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
    return Sweep(name, values)


@dataclass(frozen=True)
class Job:
    """One worker process. ``sweep`` is ``(field, value)`` for a sweep point, None for the base run."""

    framework: str
    variant: str
    config: dict
    steps: int
    warmup: int
    block: int
    parity_steps: int
    gemm: bool  # measure the float32 GEMM peak after the timings
    quick: bool
    device: str
    threads: int
    allow_tf32: bool
    phases: tuple[str, ...] = ("eval", "train")
    sweep: tuple[str, Any] | None = None
    timeout_s: float = 1800.0

    @property
    def label(self) -> str:
        where = f" {self.sweep[0]}={self.sweep[1]}" if self.sweep else ""
        return f"{self.framework}:{self.variant}{where}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Settings:
    steps: int
    warmup: int
    block: int
    parity_steps: int
    device: str
    threads: int
    allow_tf32: bool
    quick: bool
    timeout_s: float
    sweeps: tuple[Sweep, ...] = field(default_factory=tuple)


def make_jobs(base: Config, variants: Sequence[Variant], frameworks: Sequence[str], s: Settings) -> list[Job]:
    """The base run: every chosen variant; the main variant of each twin also runs parity. Then each sweep
    point, main variants only (a point equal to the base is not rerun when the base run has it). Every job
    also measures the GEMM peak after its timings: the run's peak is the best of all of them, so one
    measurement disturbed by other work on the machine does not set it."""
    common = dict(steps=s.steps, warmup=s.warmup, block=s.block, device=s.device, threads=s.threads,
                  allow_tf32=s.allow_tf32, quick=s.quick)
    jobs: list[Job] = []
    for v in variants:
        jobs.append(Job(v.framework, v.name, base.to_dict(), parity_steps=s.parity_steps if v.main else 0,
                        gemm=True, timeout_s=min(s.timeout_s, v.timeout_s or s.timeout_s), **common))
    chosen = {v.label for v in variants}
    for sweep in s.sweeps:
        for value in sweep.values:
            if getattr(base, sweep.field) == value and all(main_variant(f).label in chosen for f in frameworks):
                continue  # the base run already measured this point
            cfg = base.replace(**{sweep.field: value})
            for framework in frameworks:
                v = main_variant(framework)
                if getattr(base, sweep.field) == value and v.label in chosen:
                    continue
                jobs.append(Job(framework, v.name, cfg.to_dict(), parity_steps=0, gemm=True,
                                sweep=(sweep.field, value), timeout_s=s.timeout_s, **common))
    return jobs


def expected_steps(job: Job) -> int:
    """Steps a job reports to the progress bar (first + warm-up + timed, per phase, plus parity)."""
    return len(job.phases) * (1 + job.warmup + job.steps) + job.parity_steps

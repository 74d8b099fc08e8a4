#!/usr/bin/env python
"""Benchmark the PyTorch and JAX/Flax twins of the LSTM sentiment classifier, fairly.

    python benchmarks/bench.py                      # the seed's configuration, both twins (~5 min, 2 CPUs)
    python benchmarks/bench.py --quick              # a smoke run of everything (< 1 min)
    python benchmarks/bench.py --variants all       # also torch.compile(allow_rnn) and JAX scan unrolling
    python benchmarks/bench.py --sweep batch_size=16,50,128 --sweep hidden_dim=128,256,512

Each variant runs in a fresh worker process, one at a time, timing the twins' own ``train_step`` and
``eval_step`` on real batches (see benchmarks/README in the project README for the method and schema).
Writes results.json, results.md and PNG charts to --out (default bench-results/<timestamp>/).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from benchmarks import convergence, env, plan, plots, report, scaling  # noqa: E402
from benchmarks.launch import run_jobs  # noqa: E402
from common.config import Config, config_from_namespace, field_names, make_parser  # noqa: E402
from common.errors import ConfigError, cli_main  # noqa: E402

# Config fields that mean nothing to a benchmark (checkpoints, run length). `--epochs` and `--log-every`
# (validation every N steps) serve the convergence mode; its scaling list is `--device-counts`.
EXCLUDED_FIELDS = (*field_names("files"), "max_steps", "skip_nonfinite", "devices")


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("benchmarks/bench.py", __doc__.split("\n\n")[0], exclude=EXCLUDED_FIELDS)
    b = parser.add_argument_group("benchmark")
    b.add_argument("--mode", choices=("speed", "convergence"), default="speed",
                   help="speed: time the steps (default); convergence: train both twins to the end and compare "
                        "learning curves, time-to-accuracy and test accuracy")
    b.add_argument("--device-counts", default=None, metavar="N1,N2,...",
                   help="speed mode: also measure data-parallel scaling at these device counts (JAX: simulated "
                        "CPU devices; torch: gloo processes)")
    c = parser.add_argument_group("convergence mode")
    c.add_argument("--seeds", default="0", help="comma list of seeds; the whole comparison is repeated per seed")
    c.add_argument("--target", type=float, default=0.85, help="validation accuracy for time-to-accuracy")
    b.add_argument("--frameworks", default=None,
                   help="comma list of twins to run: torch, jax (default: those installed)")
    b.add_argument("--variants", default="default",
                   help="'default', 'all', or a comma list of framework:variant "
                        f"({', '.join(v.label for v in plan.VARIANTS)})")
    b.add_argument("--steps", type=int, default=None,
                   help=f"timed steps per measurement (default 20, >= {plan.MIN_STEPS} unless --quick)")
    b.add_argument("--warmup", type=int, default=None, help="untimed steps after the first (default 2)")
    b.add_argument("--block", type=int, default=0, help="steps per synchronised block (0: auto)")
    b.add_argument("--parity-steps", type=int, default=None,
                   help="training steps of the parity run (default 20; 0: off)")
    b.add_argument("--sweep", action="append", default=[], metavar="FIELD=V1,V2,...",
                   help="also time each twin's main variant at these values of one Config field (repeatable)")
    b.add_argument("--quick", action="store_true", help="a smoke run: tiny model, few steps")
    b.add_argument("--threads", type=int, default=None, help="CPU threads for both twins (default: all usable CPUs)")
    b.add_argument("--allow-tf32", action="store_true", help="let float32 matmuls use TF32 on a GPU (off by default)")
    b.add_argument("--timeout", type=float, default=1800.0, help="seconds one worker may run before it is "
                   "stopped and reported as timed out")
    b.add_argument("--out", default=None, help="output directory (default bench-results/<timestamp>/)")
    return parser


def resolve_frameworks(spec: str | None) -> list[str]:
    """Twins to run; an installed-but-missing one is named on stderr (default) or refused (asked for)."""
    asked = plan.parse_frameworks(spec) if spec else list(plan.FRAMEWORKS)
    ready = []
    for name in asked:
        missing = env.missing_modules(name)
        if not missing:
            ready.append(name)
        elif spec:
            raise ConfigError(f"--frameworks {name}: not installed ({', '.join(missing)} missing)")
        else:
            print(f"note: skipping the {name} twin: {', '.join(missing)} not installed", file=sys.stderr)
    if not ready:
        raise ConfigError("neither twin can run: install torch and/or jax, flax, optax")
    return ready


def base_config(ns: argparse.Namespace, quick: bool) -> Config:
    cfg = config_from_namespace(ns)
    if quick:  # the tiny sizes replace any size left at its default
        defaults = Config()
        cfg = cfg.replace(**{k: v for k, v in plan.QUICK_CONFIG.items() if getattr(cfg, k) == getattr(defaults, k)})
    if cfg.device == "tpu":
        raise ConfigError("--device: the benchmark runs on cpu or gpu (auto picks a GPU when both twins see one)")
    return cfg.replace(device="gpu" if cfg.device == "cuda" else cfg.device)


def settings_from(ns: argparse.Namespace, cfg: Config) -> plan.Settings:
    steps = ns.steps if ns.steps is not None else (plan.QUICK_STEPS if ns.quick else 20)
    warmup = ns.warmup if ns.warmup is not None else (plan.QUICK_WARMUP if ns.quick else 2)
    parity_steps = ns.parity_steps if ns.parity_steps is not None else (plan.QUICK_PARITY_STEPS if ns.quick else 20)
    if steps < 1 or (steps < plan.MIN_STEPS and not ns.quick):
        raise ConfigError(f"--steps must be >= {plan.MIN_STEPS} for a steady-state measurement, got {steps} "
                          "(--quick allows fewer)")
    for flag, value in (("--warmup", warmup), ("--block", ns.block), ("--parity-steps", parity_steps)):
        if value < 0:
            raise ConfigError(f"{flag} must be >= 0, got {value}")
    threads = ns.threads if ns.threads is not None else env.usable_cpus()
    if not 1 <= threads <= env.usable_cpus():
        raise ConfigError(f"--threads must be between 1 and {env.usable_cpus()} (the usable CPUs), got {threads}")
    if ns.timeout <= 0:
        raise ConfigError(f"--timeout must be > 0, got {ns.timeout}")
    sweeps = tuple(plan.parse_sweep(s, cfg) for s in ns.sweep)
    return plan.Settings(steps=steps, warmup=warmup, block=ns.block, parity_steps=parity_steps, device=cfg.device,
                         threads=threads, allow_tf32=ns.allow_tf32, quick=ns.quick,
                         timeout_s=ns.timeout, sweeps=sweeps)


def output_dir(spec: str | None) -> Path:
    out = Path(spec) if spec else Path("bench-results") / datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot create the directory ({err.strerror})") from None
    return out


def parse_device_counts(spec: str | None) -> list[int]:
    if spec is None:
        return []
    try:
        counts = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--device-counts takes a comma list of device counts, got {spec!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise ConfigError(f"--device-counts takes positive device counts, got {spec!r}")
    return sorted(set(counts))


def convergence_main(ns: argparse.Namespace, cfg: Config, frameworks: list[str], argv: list[str]) -> int:
    """--mode convergence: full trainings of both twins per seed (see benchmarks/convergence.py)."""
    seeds = convergence.parse_seeds(ns.seeds)
    out = output_dir(ns.out)
    if ns.quick:
        cfg = convergence.quick_corpus(cfg.replace(**convergence.QUICK_CONFIG), out)
    eval_every = cfg.log_every
    start = time.perf_counter()
    doc = convergence.run_convergence(cfg, frameworks, seeds, ns.target, out, eval_every, ns.timeout,
                                      progress=cfg.progress)
    doc.update(environment=env.environment(), command=["benchmarks/bench.py", *argv],
               run_wall_s=time.perf_counter() - start)
    report.write_json(doc, out / "results.json")
    charts = convergence.write_curves(doc, out)
    tables = convergence.markdown_tables(doc)
    (out / "results.md").write_text(f"# Convergence\n\n{tables}\n\n" + "".join(f"![{c}]({c})\n" for c in charts),
                                    encoding="utf-8")
    print(tables)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {', '.join(charts)} in {out} "
          f"({doc['run_wall_s'] / 60:.1f} min)")
    return 0


@cli_main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ns = build_parser().parse_args(argv)
    cfg = base_config(ns, ns.quick)
    settings = settings_from(ns, cfg)
    frameworks = resolve_frameworks(ns.frameworks)
    if ns.mode == "convergence":
        return convergence_main(ns, cfg, frameworks, argv)
    device_counts = parse_device_counts(ns.device_counts)
    variants = plan.select_variants(ns.variants, frameworks)
    out = output_dir(ns.out)
    jobs = plan.make_jobs(cfg, variants, frameworks, settings)
    environment = env.environment()
    busy = environment["load_average_start"]
    if busy is not None and busy > report.BUSY_LOAD * environment["usable_cpus"]:
        print(f"note: the machine is busy (load average {busy:.1f} on {environment['usable_cpus']} CPUs): "
              "times will be inflated and noisy", file=sys.stderr)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-") as work:
        results = run_jobs(jobs, Path(work), progress=cfg.progress)
    environment.update(load_average_end=env.load_average(), run_wall_s=time.perf_counter() - start)
    doc = report.build_document(jobs, results, cfg, settings, environment, frameworks, ["benchmarks/bench.py", *argv])
    scaling_md = ""
    if device_counts:
        rows = scaling.measure_scaling(frameworks, device_counts, cfg, steps=settings.steps)
        doc["scaling"] = rows
        scaling_md = f"\n\n## Data-parallel scaling\n\n{scaling.scaling_table(rows)}\n"
    report.write_json(doc, out / "results.json")
    charts = plots.write_charts(doc, out)
    if device_counts and scaling.scaling_plot(doc["scaling"], out / "scaling.png") is not None:
        charts.append("scaling.png")
    (out / "results.md").write_text(report.markdown_report(doc, charts) + scaling_md, encoding="utf-8")
    print(report.stdout_report(doc) + scaling_md)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {', '.join(charts)} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

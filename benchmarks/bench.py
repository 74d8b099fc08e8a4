#!/usr/bin/env python
"""Benchmark the PyTorch and JAX/Flax twins of the LSTM sentiment classifier or of the word-level language model,
fairly.

    python benchmarks/bench.py                      # the seed's configuration, the headline rows (< 5 min, 2 CPUs)
    python benchmarks/bench.py --full               # every variant the device runs, more rounds and parity steps
    python benchmarks/bench.py --quick              # a smoke run of everything (< 1 min)
    python benchmarks/bench.py --workload lm        # the LM at pytorch/examples' small size (E = H = 200, L 2)
    python benchmarks/bench.py --workload lm --embed-dim 650 --hidden-dim 650 --dropout 0.5   # its medium size
    python benchmarks/bench.py --sweep seq_len=50,200,800 --out docs/bench/sweep_seq_len
    python benchmarks/bench.py compare RUN_A RUN_B [--out FILE.md]
    python benchmarks/bench.py coverage RUN_1 RUN_2 RUN_3 ... [--out FILE.md]   # intervals against other runs

Each variant runs in a worker of its own, timing the trainers' own steps on real batches, in paired rounds; every
ratio against torch:eager has a 95% bootstrap interval. Writes results.json, results.md and PNG charts to --out.
"""
import argparse
import dataclasses
import importlib.util
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from common import interrupts  # noqa: E402

from benchmarks import convergence, crossrun, harness, plan, plots, processes, render, results, schema  # noqa: E402
from common.config import (INT64_MAX, Config, config_from_namespace, field_names, flag, make_parser,  # noqa: E402
                           parse_with_workload)
from common.errors import ConfigError, cli_main  # noqa: E402
from common.files import Output, check_outputs  # noqa: E402

# Config fields that mean nothing to a benchmark (checkpoints, run length; --device-counts replaces --devices).
EXCLUDED_FIELDS = (*field_names("files"), "max_steps", "skip_nonfinite", "devices")
MIN_ROUNDS = 5
DEFAULTS = {"rounds": 6, "steps": 1, "eval_steps": 1, "parts_steps": 0, "warmup": 1, "parity_steps": 10,
            "replicates": 2}
FULL = {"rounds": 8, "steps": 1, "eval_steps": 2, "parts_steps": 1, "warmup": 2, "parity_steps": 20, "replicates": 2}
# The language model's default times its parts: the decoder's share is what its comparison turns on.
LM_DEFAULTS = {**DEFAULTS, "parts_steps": 1}
QUICK = {"rounds": 5, "steps": 2, "eval_steps": 2, "parts_steps": 1, "warmup": 1, "parity_steps": 5, "replicates": 1}
GEMM_N = {"cpu": 2048, "gpu": 8192, "quick": 512}
FRAMEWORK_MODULES = {"torch": ("torch",), "jax": ("jax", "flax", "optax")}  # what each twin needs importable


def missing_modules(framework: str) -> list[str]:
    return [m for m in FRAMEWORK_MODULES[framework] if importlib.util.find_spec(m) is None]


def resolve_frameworks(spec: str | None) -> list[str]:
    """``--frameworks``: the twins to run; a missing one is named on stderr (default) or refused (asked for)."""
    asked = list(dict.fromkeys(plan.comma_list(spec, "--frameworks"))) if spec is not None else list(plan.FRAMEWORKS)
    ready = []
    for name in asked:
        if name not in plan.FRAMEWORKS:
            raise ConfigError(f"--frameworks: unknown framework {name!r} (known: {', '.join(plan.FRAMEWORKS)})")
        missing = missing_modules(name)
        if spec and missing:
            raise ConfigError(f"--frameworks {name}: not installed ({', '.join(missing)} missing)")
        if missing:
            print(f"note: skipping the {name} twin: {', '.join(missing)} not installed", file=sys.stderr)
        else:
            ready.append(name)
    if not ready:
        raise ConfigError("neither twin can run: install torch and/or jax, flax, optax")
    return ready


class OneDefaultFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """The Config flags' defaults appended to their help, except where the help states its own (the benchmark's
    counts, whose default depends on --quick, and the options whose default is decided at run time)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if "(default" in (action.help or "") else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("benchmarks/bench.py", __doc__.split("\n\n")[0], exclude=EXCLUDED_FIELDS)
    parser.formatter_class = OneDefaultFormatter
    b = parser.add_argument_group("benchmark")
    b.add_argument("--mode", choices=("speed", "convergence"), default="speed", help="speed: time the steps; "
                   "convergence: train both twins to the end (uses --epochs, --log-every)")
    b.add_argument("--frameworks", default=None, help="comma list of twins to run: torch, jax (default: installed)")
    b.add_argument("--variants", default="default", help="'default', 'all', or a comma list of framework:variant "
                   f"({', '.join(v.label for v in plan.VARIANTS)})")
    for name, text in (("rounds", f"paired rounds per step kind (>= {MIN_ROUNDS}; >= 1 under --quick)"),
                       ("replicates", "worker processes per variant, each with its own start and compile"),
                       ("steps", "training steps per process and round"), ("warmup", "untimed steps after the first"),
                       ("eval_steps", "evaluation steps per process and round"),
                       ("parts_steps", "training steps timed part by part per round by each variant's first "
                        "process, 0: none; 1 under --workload lm"),
                       ("parity_steps", "training steps of each variant's parity run, 0: none")):
        other = "".join(f", with --{mode} {counts[name]}" for mode, counts in (("full", FULL), ("quick", QUICK))
                        if counts[name] != DEFAULTS[name])
        b.add_argument(f"--{flag(name)}", type=int, default=None, help=f"{text} (default {DEFAULTS[name]}{other})")
    b.add_argument("--sweep", action="append", default=[], metavar="FIELD=V1,V2,...",
                   help="also time the variants named in --variants (default: the main ones) at these values of one "
                   "Config field, paired (repeatable)")
    b.add_argument("--device-counts", default=None, metavar="N1,N2,...",
                   help="also measure data-parallel scaling at these device counts (JAX: simulated CPU devices; "
                   "torch: gloo processes) (default: not measured)")
    size = b.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="every variant (--variants all unless named; those that "
                      "cannot run here say why) with more rounds, evaluation steps, warm-up and parity steps")
    size.add_argument("--quick", action="store_true", help="a smoke run: tiny model, few rounds")
    b.add_argument("--threads", type=int, default=None, help="CPU threads of each worker (default: all usable CPUs)")
    b.add_argument("--timeout", type=float, default=1800.0, help="seconds one worker may take for one request "
                   "(set-up or a round's steps) before it is stopped and reported as timed out")
    b.add_argument("--out", default=None, help="output directory (default bench-results/<timestamp>/)")
    b.add_argument("--overwrite", action="store_true", help="replace the results already in --out")
    c = parser.add_argument_group("convergence mode")
    c.add_argument("--seeds", default="0", help="comma list of seeds; the whole comparison is repeated per seed")
    c.add_argument("--target", type=float, default=0.85, help="validation accuracy for time-to-accuracy")
    return parser


def base_config(ns: argparse.Namespace) -> Config:
    cfg = config_from_namespace(ns)
    if ns.quick:  # the tiny sizes replace any size left at its workload's default
        default = Config.for_workload(cfg.workload)
        cfg = cfg.replace(**{k: v for k, v in plan.QUICK_CONFIG[cfg.workload].items()
                             if getattr(cfg, k) == getattr(default, k)})
    if cfg.device == "tpu":
        raise ConfigError("--device: the benchmark runs on cpu or gpu (auto picks a GPU when both twins see one)")
    return cfg.replace(device="gpu" if cfg.device == "cuda" else cfg.device)


def settings_from(ns: argparse.Namespace, cfg: Config) -> dict:
    counts = QUICK if ns.quick else FULL if ns.full else LM_DEFAULTS if cfg.workload == "lm" else DEFAULTS
    s = {k: getattr(ns, k) if getattr(ns, k) is not None else counts[k] for k in DEFAULTS}
    if ns.quick and s["rounds"] < 1:
        raise ConfigError(f"--rounds must be >= 1 under --quick (a smoke run), got {s['rounds']}")
    if not ns.quick and s["rounds"] < MIN_ROUNDS:
        raise ConfigError(f"--rounds must be >= {MIN_ROUNDS} for an interval over paired rounds (>= 1 under --quick, "
                          f"a smoke run), got {s['rounds']}")
    for name, low in (("steps", 1), ("eval_steps", 1), ("warmup", 0), ("parity_steps", 0), ("parts_steps", 0),
                      ("replicates", 1)):
        if s[name] < low:
            raise ConfigError(f"--{flag(name)} must be >= {low}, got {s[name]}")
    s["threads"] = ns.threads if ns.threads is not None else processes.usable_cpus()
    if not 1 <= s["threads"] <= processes.usable_cpus():
        raise ConfigError(f"--threads must be between 1 and {processes.usable_cpus()} (the usable CPUs), "
                          f"got {s['threads']}")
    if not 0 < ns.timeout < float("inf"):  # NaN too: every comparison with it is false
        raise ConfigError(f"--timeout must be a finite number of seconds > 0, got {ns.timeout}")
    sweeps = [plan.parse_sweep(x, cfg) for x in ns.sweep]
    if ns.device_counts is not None:  # data-parallel scaling is a sweep of --devices
        sweeps.append(plan.Sweep("devices", tuple(sorted(plan.int_list(ns.device_counts, "--device-counts", 1)))))
    for given, sweep in zip([*(f"--sweep {x}" for x in ns.sweep), "--device-counts"], sweeps):
        if sweep.field == "devices" and cfg.workload == "lm":
            raise ConfigError(f"{given}: data-parallel scaling is the classifier's; the language model trains on one "
                              f"device (its trainers refuse --devices and torchrun)")
    return {**s, "device": cfg.device, "timeout_s": ns.timeout, "quick": ns.quick, "sweeps": sweeps}


def results_held(out: Path) -> str | None:
    """The refusal of an --out holding an earlier run's results (other files there are left alone)."""
    if (out / "results.json").exists():
        return (f"--out {out}: holds the results of an earlier run; choose another directory, or pass --overwrite "
                f"to replace them")
    return None


def output_dir(spec: str | None, overwrite: bool) -> Path:
    """``--out`` (default ``bench-results/<timestamp>``), checked (:func:`common.files.check_outputs`), then made:
    called once every flag is checked and before any worker starts."""
    out = Path(spec) if spec else Path("bench-results") / datetime.now().strftime("%Y%m%d-%H%M%S")
    check_outputs([Output("--out", out, directory=True, contents="the results", held=results_held)], overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot create the directory ({err.strerror})") from None
    return out


def measure(cfg: Config, variants, s: dict, base: bool, parity: bool = False) -> tuple[dict, dict]:
    """One paired session of ``variants`` at ``cfg`` (the base run adds parity and the GEMM peak, ``parity`` parity
    alone); ``(session, configs by label)``, each variant's Config as the trainers would get it. ``cfg.devices`` > 1
    runs torch as that many DDP ranks (the threads split between them) and JAX over that many devices (simulated on a
    CPU). Under bfloat16 the baseline also trains its parity steps in float32: every row's reference."""
    n = cfg.devices if cfg.devices > 1 else 1
    reference = "float32" if cfg.dtype == "bfloat16" else None
    # The first replicate times the training step's parts and trains the parity steps; the others time whole steps.
    entries = [harness.Entry(v.label, v.framework, {**cfg.to_dict(), **v.changes}, few_steps=v.few_steps,
                             parity=r == 1, parts=r == 1,
                             parity_reference=reference if v.label == plan.BASELINE else None,
                             timeout_s=s["timeout_s"], ranks=n if v.framework == "torch" else 1,
                             threads=max(1, s["threads"] // n) if v.framework == "torch" else s["threads"],
                             xla_devices=n if v.framework == "jax" and n > 1 else 0, replicate=r)
               for v in variants for r in range(1, (1 if v.few_steps else s["replicates"]) + 1)]
    gemm_n = GEMM_N["quick" if s["quick"] else "gpu" if s["device"] == "gpu" else "cpu"] if base else 0
    # The base run also times the training step's parts.
    p = harness.Plan(s["rounds"], s["steps"], s["eval_steps"], s["warmup"], s["parity_steps"] if base or parity else 0,
                     gemm_n, ("eval", "train", "parts") if base and s["parts_steps"] else ("eval", "train"),
                     s["parts_steps"])
    return harness.run(entries, p, s["device"], progress=cfg.progress), {e.label: e.config for e in entries}


def speed_main(ns: argparse.Namespace, cfg: Config, s: dict, frameworks: list[str], variants: list[plan.Variant],
               out: Path, argv: list[str]) -> int:
    environment, start = processes.environment(), time.perf_counter()
    session, configs = measure(cfg, variants, s, base=True)
    ok = [e.setup for e in session.entries.values() if e.status == "ok"]
    if not ok:  # e.g. --device gpu without a GPU
        raise ConfigError("no variant ran: " + next(iter(session.entries.values())).error)
    peak = results.gemm_peak(session.gemm, ok[0].info["device"])
    parity = results.parity(session.parity, s["parity_steps"])
    rows = results.rows_for(session, configs, None, peak["gflop_s"], parity)
    comparisons = results.comparisons_for(session, None)
    sweep_rounds: dict[str, list] = {}
    # Sweeps time the variants named in --variants, else the main ones.
    main = variants if ns.variants not in ("default", "all") else plan.main_variants(variants, frameworks,
                                                                                      cfg.workload)
    for sweep in s["sweeps"]:
        for value in sweep.values:
            where = {"field": sweep.field, "value": value}
            # A sweep of numerics (dtype) checks each point's parity against the float32 baseline, as the base run.
            numerics = sweep.field == "dtype"
            point, point_configs = measure(cfg.replace(**{sweep.field: value}), main, s, base=False, parity=numerics)
            point_parity = results.parity(point.parity, s["parity_steps"]) if numerics else None
            rows += results.rows_for(point, point_configs, where, peak["gflop_s"], point_parity)
            comparisons += results.comparisons_for(point, where)
            sweep_rounds[f"{sweep.field}={value}"] = [r for kind in point.rounds.values() for r in kind]
    info = {e.label.split(":")[0]: e.setup.info for e in session.entries.values() if e.setup}
    environment.update({key: {k: i[key] for k, i in info.items()} for key in ("threads", "precision")},
                       devices={k: i["device_name"] for k, i in info.items()},
                       xla_env=info.get("jax", {}).get("xla_env"), load_average_end=processes.load_average(),
                       run_wall_s=time.perf_counter() - start, stage_wall_s=session.wall_s)
    results.add_efficiency(rows)
    run = schema.Run(
        schema.SCHEMA_VERSION, ["benchmarks/bench.py", *argv], environment,
        {**s, "frameworks": frameworks, "sweeps": [dataclasses.asdict(x) for x in s["sweeps"]]}, cfg.to_dict(),
        ok[0].vocab_size, results.descriptions(session, variants, cfg.workload), peak, rows, comparisons,
        results.tier_sentences(rows, comparisons), session.rounds, sweep_rounds, parity,
        results.warnings(rows, [r for v in session.rounds.values() for r in v]))
    schema.write_json(run, out / "results.json")
    doc = dataclasses.asdict(run)  # the reports read what results.json holds
    charts = plots.write_charts(doc, out)
    (out / "results.md").write_text(render.render(doc, charts, markdown=True), encoding="utf-8")
    print(render.render(doc))
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {', '.join(charts)} in {out} "
          f"({environment['run_wall_s']:.0f} s)")
    return 0


@cli_main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["compare"], ["coverage"]):
        return (crossrun.compare_main if argv[0] == "compare" else crossrun.coverage_main)(argv[1:])
    ns = parse_with_workload(build_parser(), argv)  # --workload lm: the language model's defaults
    cfg = base_config(ns)
    s = settings_from(ns, cfg)
    frameworks = resolve_frameworks(ns.frameworks)
    if ns.mode == "convergence" and cfg.workload == "lm":
        raise ConfigError("--mode convergence trains the classifier to a validation accuracy; the language model's "
                          "curves of perplexity are python -m studies.lm_convergence's: --workload lm runs in "
                          "--mode speed here")
    if ns.mode == "convergence":
        seeds = plan.int_list(ns.seeds, "--seeds", 0, INT64_MAX)
        if not 0.0 < ns.target <= 1.0:
            raise ConfigError(f"--target is a validation accuracy in (0, 1], got {ns.target}")
        return convergence.main(cfg, frameworks, seeds, ns.target, output_dir(ns.out, ns.overwrite), ns.timeout,
                                ns.quick, ["benchmarks/bench.py", *argv])
    spec = "all" if ns.full and ns.variants == "default" else ns.variants
    variants = plan.select_variants(spec, frameworks, "gpu" if s["device"] == "gpu" else "cpu", cfg.workload, ns.quick)
    return speed_main(ns, cfg, s, frameworks, variants, output_dir(ns.out, ns.overwrite), argv)


if __name__ == "__main__":
    interrupts.exit_process(main())

"""The tools that read several saved runs (``results.json``, read back through :func:`schema.read_run`):
``bench.py compare`` sets two runs side by side, row by row, and ``bench.py coverage`` measures how often each run's
95% intervals hold the other runs' median ratio (``--rounds-only``: with the intervals recomputed without resampling
the worker processes, for comparison)."""
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from benchmarks import hosts, schema
from benchmarks.plan import BASELINE
from benchmarks.stats import paired_ratio, round_means
from benchmarks.tables import label, ms, table
from common.config import Config, Parser, field_names
from common.errors import ConfigError
from common.files import Output, atomic_file, check_outputs

WORKLOADS = {"classifier": "the classifier", "lm": "the language model"}
# Config fields that do not change what a run times: where files go, how long a trainer would run, what it prints,
# the seed of its weights (the shapes, hence the work, are the same for every seed).
UNTIMED = (*field_names("files"), "epochs", "max_steps", "log_every", "progress", "seed")


def configuration(doc: dict) -> dict:
    """What a run timed: its base configuration less :data:`UNTIMED`, a field it predates read as the classifier's
    default (the value every run before the field ran)."""
    return {k: v for k, v in {**Config().to_dict(), **doc.get("base_config", {})}.items() if k not in UNTIMED}


def machine(doc: dict, name: str) -> tuple:
    """Where run ``name`` timed: the CPU model, its vector width (:func:`benchmarks.hosts.vector_isa`; None where
    nothing says) and count, and the device it timed on."""
    e = doc.get("environment", {})
    try:
        isa = hosts.vector_isa(e, schema.results_path(name).parent)
    except hosts.UnknownHost:
        isa = None
    return e.get("cpu_model"), isa, e.get("cpu_count"), doc.get("settings", {}).get("device")


def one_workload(docs: Sequence[dict], names: Sequence[str], command: str) -> None:
    """Refuse, in one line, runs of different workloads: a language model's step and a classifier's do different
    work, so no ratio between them means anything."""
    kinds = [configuration(d)["workload"] for d in docs]
    other = next((i for i, k in enumerate(kinds) if k != kinds[0]), None)
    if other is not None:
        raise ConfigError(f"{command}: {names[0]} is a run of {WORKLOADS.get(kinds[0], kinds[0])} and {names[other]} "
                          f"one of {WORKLOADS.get(kinds[other], kinds[other])}: their steps do different work; "
                          f"{command} needs runs of one workload")


def one_configuration(docs: Sequence[dict], names: Sequence[str]) -> None:
    """Refuse, in one line, runs of different workloads, configurations (:func:`configuration`) or machines: an
    interval can only be expected to hold the median of runs measuring the same thing."""
    one_workload(docs, names, "coverage")
    first = configuration(docs[0])
    for name, doc in zip(names[1:], docs[1:]):
        differ = next((k for k, v in configuration(doc).items() if first.get(k) != v), None)
        if differ is not None:
            raise ConfigError(f"coverage: {names[0]} and {name} are runs of different configurations ({differ} "
                              f"{first.get(differ)!r} and {configuration(doc)[differ]!r}); coverage needs runs of "
                              f"one configuration on one machine")
        if (theirs := machine(doc, name)) != (mine := machine(docs[0], names[0])):
            said = [f"{cpu}, {isa or 'vector width unknown'}, {count} CPUs, device {device}"
                    for cpu, isa, count, device in (mine, theirs)]
            raise ConfigError(f"coverage: {names[0]} and {name} ran on different machines or devices ({said[0]}; "
                              f"{said[1]}); coverage needs runs of one configuration on one machine")


def rounds_only(doc: dict) -> dict:
    """``doc`` with its base train and eval comparisons' intervals recomputed as a one-level bootstrap over the rounds,
    each round's replicates averaged and held fixed: what the intervals would be without resampling the workers."""
    per = {(label(r), r["step"]): r["round_s"] for r in doc["results"] if r["sweep"] is None and r["step_s"]}

    def level_one(c: dict) -> dict:
        sides = [[round_means(per[name, c["step"]])] for name in (BASELINE, c["variant"])]  # one "replicate" each
        return {**c, "ci95": paired_ratio(*sides)[1]}

    return {**doc, "comparisons": [level_one(c) for c in doc["comparisons"]
                                   if c["sweep"] is None and c["step"] in ("train", "eval")]}


def coverage(docs: Sequence[dict], names: Sequence[str], markdown: bool) -> str:
    """For each base-configuration comparison (variant and step kind) found in every run: whether each run's 95%
    interval holds the median ratio of the other runs. Intervals that describe the spread between runs do so about
    95% of the time; a lower rate means each run's interval is narrower than run-to-run variation."""
    keyed = [{(c["variant"], c["step"]): c for c in d["comparisons"] if c["sweep"] is None} for d in docs]
    shared = [k for k in keyed[0] if all(k in x for x in keyed[1:])]
    if not shared:
        raise ConfigError("coverage: the runs have no comparison in common (same variant and step kind)")
    rows, held = [], {}
    for key in shared:
        cells = []
        for i, run in enumerate(keyed):
            others = float(np.median([x[key]["ratio"] for j, x in enumerate(keyed) if j != i]))
            (low, high), hit = run[key]["ci95"], run[key]["ci95"][0] <= others <= run[key]["ci95"][1]
            held.setdefault(key[1], []).append(hit)
            cells.append(f"{run[key]['ratio']:.2f} [{low:.2f}–{high:.2f}]" + ("" if hit else " ✗"))
        rows.append([*key, *cells, f"{sum(held[key[1]][-len(docs):])}/{len(docs)}"])
    head = [f"run {i + 1}: {name} ({d['environment'].get('date', '?')}, {d['environment'].get('cpu_model', '?')}, "
            f"{d['settings'].get('replicates', 1)} replicates × {d['settings'].get('rounds')} rounds)"
            for i, (name, d) in enumerate(zip(names, docs))]
    body = table(["variant", "step", *(f"run {i + 1}" for i in range(len(docs))), "held"], rows, markdown)
    summary = [f"{kind}: {sum(x)} of {len(x)} intervals ({100 * sum(x) / len(x):.0f}%) hold the other runs' median "
               f"ratio" for kind, x in held.items()]
    everything = [x for v in held.values() for x in v]
    summary.append(f"all: {sum(everything)} of {len(everything)} ({100 * sum(everything) / len(everything):.0f}%); "
                   "✗: the interval misses it")
    return "\n".join((["# Interval coverage between runs", ""] if markdown else []) + [("- " if markdown else "") + h
                                                                                   for h in head]
                     + ["", body, ""] + [("- " if markdown else "") + x for x in summary]) + "\n"


def compare(a: dict, b: dict, names: Sequence[str], markdown: bool) -> str:
    """Rows measured in both runs (same variant, step kind and sweep point): A's and B's ms, and A ms / B ms."""
    def key(r):
        return label(r), r["step"], json.dumps(r["sweep"], sort_keys=True)

    theirs = {key(r): r for r in b["results"] if r["step_s"]}
    rows = [[label(r), r["step"], f"{r['sweep']['field']}={r['sweep']['value']}" if r["sweep"] else "base", ms(r),
             ms(theirs[key(r)]), f"{r['step_s']['median'] / theirs[key(r)]['step_s']['median']:.2f}×"]
            for r in a["results"] if r["step_s"] and key(r) in theirs]
    if not rows:
        raise ConfigError("compare: the two runs have no rows in common (same variant, step and sweep point)")
    head = [f"{tag}: {name} ({d['environment'].get('date', '?')}, {d['environment'].get('cpu_model', '?')}, "
            f"{', '.join(f'{k} {v}' for k, v in d['environment'].get('devices', {}).items())})"
            for tag, d, name in zip("AB", (a, b), names)]
    body = table(["variant", "step", "config", "A ms", "B ms", "A ms / B ms (above 1: B faster)"], rows, markdown)
    return "\n".join((["# Two benchmark runs side by side", ""] if markdown else [])
                     + [("- " if markdown else "") + h for h in head] + ["", body]) + "\n"


def same_run(runs: Sequence[str], docs: Sequence[dict]) -> tuple[str, str, str] | None:
    """The first two ``runs`` that are one run: ``(a, b, how)``, by the results.json they resolve to or, copied, by
    identical contents; None when all are distinct."""
    for j in range(len(runs)):
        for i in range(j):
            if schema.results_path(runs[i]).resolve() == schema.results_path(runs[j]).resolve():
                return runs[i], runs[j], "the same results.json"
            if docs[i] == docs[j]:
                return runs[i], runs[j], "identical results"
    return None


def report_output(path: str | None, overwrite: bool, runs: Sequence[str]) -> None:
    """``--out``, checked before any run is read (:func:`common.files.check_outputs`): a report there, or a run's
    results.json, is replaced only with ``--overwrite``."""
    if path:
        check_outputs([Output("--out", Path(path), directory=False, contents="the report",
                              replaced="which the report replaces"),
                       *(Output("the run", schema.results_path(run), directory=False, contents="its results",
                                read=True) for run in runs)], overwrite)


def emit(report: Callable[[bool], str], path: str | None) -> None:
    """``report`` as text on stdout and, when ``--out`` gave a ``path``, as Markdown there."""
    print(report(False), end="")
    if path:
        try:
            atomic_file(Path(path), lambda tmp: tmp.write_text(report(True), encoding="utf-8"))
        except OSError as err:
            raise ConfigError(f"--out {path}: cannot write ({err.strerror})") from None


def add_out(parser: Parser) -> None:
    parser.add_argument("--out", default=None, help="also write the table as Markdown to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")


def coverage_main(argv: list[str]) -> int:
    """``bench.py coverage RUN_1 RUN_2 RUN_3 ... [--rounds-only] [--out FILE.md [--overwrite]]``."""
    parser = Parser(prog="benchmarks/bench.py coverage", description="how often each run's 95%% interval holds the "
                    "median ratio of the other runs (runs of one configuration on one machine)")
    parser.add_argument("runs", nargs="+", help="results directories or their results.json (at least 3 distinct runs)")
    add_out(parser)
    parser.add_argument("--rounds-only", action="store_true", help="the train and eval intervals recomputed as a "
                        "one-level bootstrap over rounds, the replicates held fixed (for comparison)")
    ns = parser.parse_args(argv)
    if len(ns.runs) < 3:
        raise ConfigError(f"coverage: needs at least 3 runs, got {len(ns.runs)}")
    report_output(ns.out, ns.overwrite, ns.runs)
    docs = [schema.read_run(x, "coverage") for x in ns.runs]
    if same := same_run(ns.runs, docs):  # a run against itself would hold its own median: coverage inflated
        raise ConfigError(f"coverage: {same[0]} and {same[1]} are one run ({same[2]}); coverage needs distinct runs")
    one_configuration(docs, ns.runs)
    docs = [rounds_only(d) for d in docs] if ns.rounds_only else docs
    emit(lambda markdown: coverage(docs, ns.runs, markdown), ns.out)
    return 0


def compare_main(argv: list[str]) -> int:
    """``bench.py compare RUN_A RUN_B [--out FILE.md [--overwrite]]``."""
    parser = Parser(prog="benchmarks/bench.py compare", description="two benchmark runs of one workload side by side")
    parser.add_argument("run_a", help="a results directory or its results.json")
    parser.add_argument("run_b")
    add_out(parser)
    ns = parser.parse_args(argv)
    report_output(ns.out, ns.overwrite, [ns.run_a, ns.run_b])
    a, b = schema.read_run(ns.run_a), schema.read_run(ns.run_b)
    one_workload([a, b], [ns.run_a, ns.run_b], "compare")
    if same := same_run([ns.run_a, ns.run_b], [a, b]):  # allowed: a check of the tool itself
        print(f"note: compare: {same[0]} and {same[1]} are one run ({same[2]}): every ratio is 1.00× by "
              f"construction", file=sys.stderr)
    emit(lambda markdown: compare(a, b, (ns.run_a, ns.run_b), markdown), ns.out)
    return 0

"""The views of a published run that the documentation quotes, each as Markdown lines, from the run's results file
alone: its headline sentences, its speed table, its wall time and settings, its parity, what its FLOPs explain, a
sweep's table, a dtype sweep's bfloat16 speed-ups, the language model's table, a loop-cost measurement, a
versions study's tables.

Every view takes the run (:class:`Run`) and the words after the view's name in the block that asks for it;
:func:`render` prefixes the line that names the host and the run, so that no figure appears without where it came
from. The cells are the reports' own (:mod:`benchmarks.tables`, :mod:`benchmarks.render`): a figure in the docs reads
as it does in the run's results.md."""
import json
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks import hosts, render as report
from benchmarks.plan import BASELINE
from benchmarks.results import PARITY_TOL
from benchmarks.tables import fmt, kernel, label, ms, parity_cell, ratio_cell, table
from common.errors import UserError

WIDTH = 120
RESULTS = ("results.json", "loop_cost.json", "versions.json")  # what a run directory may hold, in this order
# Names a reader types: variants, PyTorch's and Flax's modules, our trainers.
CODE = re.compile(r"(?<![\w`.])((?:torch|jax):[\w-]+|nnx?\.\w+|jax_impl\.\w+)")


@dataclass(frozen=True)
class Run:
    """A published run: its directory (relative to the repository), its results document and the page quoting it."""

    path: Path
    doc: dict
    page: Path  # the Markdown page the block is in, relative to the repository: links are relative to it

    @property
    def file(self) -> Path:
        """The results file the run directory holds."""
        return next(self.path / f for f in RESULTS if (hosts.ROOT / self.path / f).is_file())

    def link(self, name: str) -> str:
        """A link from the page to ``name`` in the run's directory."""
        return os.path.relpath(self.path / name, self.page.parent).replace(os.sep, "/")


def load(path: Path, page: Path) -> Run:
    """The run in ``path`` (a directory relative to the repository), quoted on ``page``; FileNotFoundError where it
    holds no results file, :class:`UserError` naming the file where that is not a JSON object."""
    found = next((hosts.ROOT / path / f for f in RESULTS if (hosts.ROOT / path / f).is_file()), None)
    if found is None:
        raise FileNotFoundError(f"{path}: no {' or '.join(RESULTS)}")
    try:
        doc = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError and UnicodeDecodeError
        raise UserError(f"{found.relative_to(hosts.ROOT)}: not a results file ({str(err).splitlines()[0]}); restore "
                        f"it (git checkout) or rerun its command") from None
    if not isinstance(doc, dict):
        raise UserError(f"{found.relative_to(hosts.ROOT)}: not a results file (a JSON {type(doc).__name__}, not an "
                        f"object); restore it (git checkout) or rerun its command")
    return Run(path, doc, page)


def wrap(text: str, bullet: bool = False) -> list[str]:
    """A paragraph (or a bullet) in lines of at most :data:`WIDTH` characters."""
    return textwrap.wrap(text, WIDTH, initial_indent="- " if bullet else "", subsequent_indent="  " if bullet else "",
                         break_long_words=False, break_on_hyphens=False)


def code(text: str) -> str:
    """A report's sentence with the names in it set as code."""
    return CODE.sub(r"`\1`", text)


def provenance(run: Run) -> str:
    """Where a block's figures come from: the host (its slug and in words), the run and when it started."""
    env = run.doc.get("environment")
    if env is None:  # a loop-cost file records no environment: its host is its directory's
        return f"Host `{run.path.parent.name}`, run [`{run.path.name}`]({run.link(run.file.name)}):"
    host = hosts.host_slug(env, hosts.ROOT / run.path)
    when = env["date"][:16].replace("T", " ") + " UTC"
    report = "results.md" if (hosts.ROOT / run.path / "results.md").is_file() else run.file.name
    return (f"Host `{host}` ({hosts.describe(env, hosts.ROOT / run.path)}), run "
            f"[`{run.path.name}`]({run.link(report)}), {when}:")


def base(doc: dict, variant: str, step: str) -> dict | None:
    """The base configuration's row of ``variant`` and ``step`` that ran, or None."""
    return next((r for r in report.base_rows(doc) if label(r) == variant and r["step"] == step), None)


def headline(run: Run, args: list[str]) -> list[str]:
    """The run's tier sentences, as it printed them; with arguments, those that name every one (``jax:jit``)."""
    return [x for s in run.doc["headline"] if all(a in s for a in args) for x in wrap(code(s), bullet=True)]


def settings(run: Run, args: list[str]) -> list[str]:
    """The command, the replicates and rounds, busy rounds, the run's wall time, the baseline's step, the GEMM
    peak."""
    doc, s = run.doc, run.doc["settings"]
    busy = sum(r["busy"] for rounds in doc["rounds"].values() for r in rounds)
    eager = base(doc, BASELINE, "train")
    peak = doc["gemm_peak"]
    text = (f"`python {' '.join(doc['command'])}` ({report.config_line(doc)}): {s['replicates']} worker processes "
            f"per variant × {s['rounds']} paired rounds, {busy} busy round{'s' * (busy != 1)}, "
            f"{doc['environment']['run_wall_s']:.0f} s in all (`run_wall_s`)"
            + (f"; `{BASELINE}` {ms(eager)} ms a training step" if eager else "")
            + (f"; float32 GEMM peak {peak['gflop_s']:.1f} GFLOP/s ({peak['backend']})" if peak["gflop_s"] else "")
            + "".join(f"; sweep of {w['field']}: {', '.join(map(str, w['values']))}" for w in s["sweeps"]) + ".")
    return wrap(text)


STAGES = ("load", "setup", "rounds", "parity", "gemm")  # the harness's stages, in the order they run


def stages(run: Run, args: list[str]) -> list[str]:
    """Where the run's wall time went, stage by stage (``stage_wall_s``: each entry's set-up and each parity run
    summed into its stage), the rest being the parent's start, the report and the charts."""
    e = run.doc["environment"]
    if "stage_wall_s" not in e:
        return wrap("This run predates the record of its stages (`stage_wall_s`).")
    total = {k: sum(v for name, v in e["stage_wall_s"].items() if name.split()[0] == k) for k in STAGES}
    rest = e["run_wall_s"] - sum(total.values())
    rows = [*(f"| {k} | {v:.0f} |" for k, v in total.items() if v),
            f"| the rest (start, report, charts) | {rest:.0f} |",
            f"| **all** (`run_wall_s`) | **{e['run_wall_s']:.0f}** |"]
    return ["| stage | s |", "|---|---|", *rows]


def parity(run: Run, args: list[str]) -> list[str]:
    """Each timed row's parity trajectory against the baseline, as a range, and any row beyond its band."""
    q = run.doc["parity"]
    if q["status"] != "ok" or not q["max_abs_dloss"]:
        return wrap(f"Parity: {q['status']}.")
    values = q["max_abs_dloss"].values()
    beyond = [label(r) for r in report.base_rows(run.doc) if r["step"] == "train" and r["parity_ok"] is False]
    return wrap(f"Every timed row trained {q['steps']} steps beside `{q['baseline']}` (same weights and batches, "
                f"dropout 0): max |Δloss| {min(values):.1e} to {max(values):.1e}; "
                + (f"beyond its band: {', '.join(f'`{b}`' for b in beyond)}." if beyond else
                   f"every row within its band (float32: {PARITY_TOL:g})."))


def speed_table(run: Run, args: list[str]) -> list[str]:
    """The base rows by tier: kernel, parity, train and eval medians with their ratios, executed GFLOP."""
    doc, rows = run.doc, []
    for r in (r for r in report.base_rows(doc) if r["step"] == "train"):
        ev = base(doc, label(r), "eval")
        rows.append([r["tier"], f"`{label(r)}`" + (" (fallback)" if r["fallback"] else ""), kernel(r),
                     parity_cell(r), ms(r), ratio_cell(doc, r), ms(ev), ratio_cell(doc, ev),
                     fmt(r["executed_gflop_per_step"], ".2f")])
    return table(("tier", "variant", "kernel", "parity", "train ms", f"train vs {BASELINE}", "eval ms",
                  f"eval vs {BASELINE}", "exec GFLOP"), rows, True).splitlines()


def parts(run: Run, args: list[str]) -> list[str]:
    """The training step part by part (the report's own table)."""
    columns = report.PARTS_COLUMNS + (report.DECODER_COLUMNS if report.is_lm(run.doc) else ())
    return table(columns, report.parts_rows(run.doc), True).splitlines()


def flops(run: Run, args: list[str]) -> list[str]:
    """For each variant named (default ``jax:jit``): how much of its lead its executed FLOPs explain, and how much
    its code's speed per FLOP does, in training and at inference."""
    doc, out = run.doc, []
    for variant in args or ["jax:jit"]:
        said = []
        for step, verb in (("train", "trains"), ("eval", "infers")):
            mine, theirs = base(doc, variant, step), base(doc, BASELINE, step)
            c = next((c for c in doc["comparisons"] if c["variant"] == variant and c["step"] == step
                      and c["sweep"] is None), None)
            if not (mine and theirs and c):
                continue
            by_flops = theirs["executed_gflop_per_step"] / mine["executed_gflop_per_step"]
            said.append(f"{'a training' if step == 'train' else 'an inference'} step executes "
                        f"{mine['executed_gflop_per_step']:.2f} GFLOP against `{BASELINE}`'s "
                        f"{theirs['executed_gflop_per_step']:.2f}, {by_flops:.2f}× by FLOPs alone; it {verb} at "
                        f"{c['ratio']:.2f}×, so its code runs {c['ratio'] / by_flops:.2f}× as fast per FLOP")
        if said:
            out += wrap(f"`{variant}`: " + "; ".join(said) + ".", bullet=True)
    return out


def sweep(run: Run, args: list[str]) -> list[str]:
    """A sweep's table: per value, the baseline's training ms, then each other variant's training ms and its train /
    eval ratios (and, for devices, its efficiency)."""
    doc, field = run.doc, args[0]
    at = [r for r in doc["results"] if r["sweep"] and r["sweep"]["field"] == field]
    values = list(dict.fromkeys(r["sweep"]["value"] for r in at))
    variants = [v for v in dict.fromkeys(label(r) for r in at) if v != BASELINE]
    row = lambda v, value, step: next((r for r in at if label(r) == v and r["sweep"]["value"] == value  # noqa: E731
                                       and r["step"] == step), None)
    columns = [field, f"{BASELINE} ms"] + [c for v in variants for c in (f"{v} ms", f"{v} train / eval")]
    rows = []
    for value in values:
        eager = row(BASELINE, value, "train")
        cells = [str(value), ms(eager) + (f" (efficiency {fmt(eager.get('efficiency'), '.2f')})"
                                          if field == "devices" and eager else "")]
        for v in variants:
            train, ev = row(v, value, "train"), row(v, value, "eval")
            cells += [ms(train), f"{ratio_cell(doc, train)} / {ratio_cell(doc, ev)}"
                      + (f" (efficiency {fmt(train.get('efficiency'), '.2f')})" if field == "devices" and train
                         else "")]
        rows.append(cells)
    return table(columns, rows, True).splitlines()


def dtype(run: Run, args: list[str]) -> list[str]:
    """A dtype sweep: per variant and step kind, float32 and bfloat16 medians, bfloat16's speed-up over float32
    (unpaired: two sessions), its speed against the baseline in bfloat16, and its parity there."""
    doc = run.doc
    at = {(label(r), r["step"], r["sweep"]["value"]): r for r in doc["results"]
          if r["sweep"] and r["sweep"]["field"] == "dtype"}
    rows = [[f"`{name}` {kind}", ms(at.get((name, kind, "float32"))), ms(at.get((name, kind, "bfloat16"))),
             f"{x:.2f}× [{lo:.2f}–{hi:.2f}]", ratio_cell(doc, at.get((name, kind, "bfloat16"))),
             parity_cell(at[name, kind, "bfloat16"]) if kind == "train" else ""]
            for (name, kind), (x, lo, hi) in report.bfloat16_speedups(doc).items()]
    return table(("row", "float32 ms", "bfloat16 ms", "float32 ms / bfloat16 ms (unpaired)",
                  f"bfloat16 vs {BASELINE} in bfloat16", "parity"), rows, True).splitlines()


def language_model(run: Run, args: list[str]) -> list[str]:
    """The language model's rows: train and eval ratios, parity, and the decoder's and the rest's ratios (the
    baseline's row: its own milliseconds)."""
    doc, rows = run.doc, []
    for r in (r for r in report.base_rows(doc) if r["step"] == "train"):
        decoder = report.decoder_cells(doc, r) if r["parts"] else ["–"] * len(report.DECODER_COLUMNS)
        ev = base(doc, label(r), "eval")
        if label(r) == BASELINE:  # its own times, against which the other rows' ratios read
            rows.append([f"`{label(r)}` ({r['tier']})", f"{ms(r)} ms a window", f"{ms(ev)} ms", parity_cell(r),
                         f"{decoder[0]} ms", f"{decoder[1]} ms"])
            continue
        rows.append([f"`{label(r)}` ({r['tier']})", ratio_cell(doc, r), ratio_cell(doc, ev), parity_cell(r),
                     decoder[3], decoder[4]])
    return table(("variant", f"train vs {BASELINE}", "eval vs", "parity", "decoder vs",
                  "embedding + recurrence vs"), rows, True).splitlines()


def loop_cost_lines(doc: dict) -> list[str]:
    """``python -m studies.loop_cost``'s report of a measurement: each piece's median ms with its interval (a
    matmul chain's rate beside it), then the differences paired by round."""
    s = doc["shape"]
    width = max(map(len, [*doc["pieces"], *doc["differences"]]))

    def line(name: str, p: dict) -> str:
        rate = f"  {p['gflop_s']:.0f} GFLOP/s" if "gflop_s" in p else ""
        return f"{name:<{width}}  {p['ms']:7.1f} [{p['ci95_ms'][0]:.1f}–{p['ci95_ms'][1]:.1f}]{rate}"

    return [f"One LSTM layer's forward at B {s['batch']}, T {s['steps']}, H {s['hidden']}, D {s['input']} (float32, "
            f"{doc['rounds']} interleaved rounds; median ms [95% interval])", "",
            *(line(*x) for x in doc["pieces"].items()), "", "differences, paired by round:",
            *(line(*x) for x in doc["differences"].items())]


def loop_cost(run: Run, args: list[str]) -> list[str]:
    """A loop-cost measurement's report, as its command prints it."""
    return ["```", *loop_cost_lines(run.doc), "```"]


def walls(run: Run, args: list[str]) -> list[str]:
    """A convergence run's wall time per training (evaluation and start-up included), per framework: its range over
    the seeds."""
    by: dict[str, list[float]] = {}
    for r in run.doc["runs"]:
        by.setdefault(r["framework"], []).append(r["wall_s"])
    return wrap("Wall time per training (`wall_s`): " + ", ".join(
        f"{fw} {min(v):.0f}–{max(v):.0f} s over {len(v)} seed{'s' * (len(v) != 1)}" for fw, v in by.items()) + ".")


def versions(run: Run, args: list[str]) -> list[str]:
    """A versions study's tables (``python -m studies.versions``): its sets, the ratios per set, each row's time
    against the newest set's."""
    from studies.version_report import tables

    return tables(run.doc)


VIEWS: dict[str, Callable[[Run, list[str]], list[str]]] = {
    "headline": headline, "settings": settings, "stages": stages, "parity": parity, "table": speed_table,
    "parts": parts, "flops": flops, "sweep": sweep, "dtype": dtype, "lm": language_model, "loop-cost": loop_cost,
    "walls": walls, "versions": versions}


def render(run: Run, view: str, args: list[str]) -> str:
    """A block's body: the lines naming the host and run, then the view."""
    return "\n".join([*wrap(provenance(run)), "", *VIEWS[view](run, args)])

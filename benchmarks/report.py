"""Rows and paired comparisons from the rounds, results.json, the same tables as text (stdout) and Markdown
(results.md), and ``compare``. An entry's time per step is the median over rounds of its per-round medians; a
comparison's ratio is the median of the per-round ratios baseline / variant (above 1: the variant is faster), its
95% interval the percentiles of that median over bootstrap resamples of the rounds."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

from benchmarks import flops
from benchmarks.plan import BASELINE
from benchmarks.schema import Comparison, Round, Row, Session, Setup, Spread
from common.errors import ConfigError
RESAMPLES = 10_000
METHOD = (f"median of per-round ratios (baseline s / variant s) over paired, interleaved rounds; 95% interval: "
          f"percentile bootstrap over the rounds ({RESAMPLES} resamples, seed 0)")
MAIN_COLUMNS = ("variant", "step", "flush", "median ms", "p25–p75 ms", f"vs {BASELINE} [95% CI]", "rounds×steps",
                "compile s", "first s", "samples/s", "peak MB", "model GFLOP", "exec GFLOP", "GFLOP/s", "util")
SWEEP_COLUMNS = ("value", "variant", "train ms", f"train vs {BASELINE}", "eval ms", f"eval vs {BASELINE}",
                 "train samples/s", "exec GFLOP train", "rounds")
SCALING = ("At a fixed global batch, torch runs N DDP ranks (gloo on a CPU, the threads split between them) and JAX "
           "one process over N devices (simulated on a CPU); efficiency = training throughput / (N × the smallest "
           "count's per device), 1.0 is linear. On a CPU the N devices share the same cores: this measures the "
           "overhead of data parallelism, not a speed-up.")


def paired_ratio(base_s: Sequence[float], variant_s: Sequence[float], seed: int = 0) -> tuple[float, list[float]]:
    """``(ratio, [low, high])``: the median of ``base_s[i] / variant_s[i]`` (seconds) and its 95% bootstrap interval."""
    n = min(len(base_s), len(variant_s))
    ratios = np.asarray(base_s[:n], dtype=np.float64) / np.asarray(variant_s[:n], dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, n, size=(RESAMPLES, n))
    low, high = np.percentile(np.median(ratios[picks], axis=1), [2.5, 97.5])
    return float(np.median(ratios)), [float(low), float(high)]


def rows_for(session: Session, configs: dict[str, dict], sweep: dict | None, peak: float | None) -> list[Row]:
    """One row per entry and step kind."""
    rows = []
    for name, e in session.entries.items():
        cfg = SimpleNamespace(**configs[name])  # not a Config: a skipped variant's choice may not validate
        setup = e.setup or Setup(0, {}, {}, {})
        record, info = setup.record, setup.info
        folds = record.get("lstm_impl") == "fused" and cfg.embed_fold
        for kind in (k for k in ("train", "eval") if k in session.rounds):
            phase, times = setup.phases.get(kind, {}), e.round_s.get(kind, [])
            model = flops.step_flops(cfg, kind) / 1e9
            spread = Spread(*(float(x) for x in np.percentile(times, [50, 25, 75]))) if times else None
            median = spread and spread.median
            rows.append(Row(
                framework=name.split(":")[0], variant=name.split(":", 1)[1], step=kind, sweep=sweep, status=e.status,
                error=e.error, config=configs[name], lstm_impl=record.get("lstm_impl"),
                device_name=info.get("device_name"), flush_denormal=record.get("flush_denormal"),
                threads=info.get("threads"),
                compile_s=phase.get("compile_s"), lower_s=phase.get("lower_s"), first_step_s=phase.get("first_step_s"),
                step_s=spread, rounds=len(times), steps_per_round=e.steps_per_round.get(kind), round_s=times,
                samples_per_s=median and cfg.batch_size / median, model_gflop_per_step=model,
                executed_gflop_per_step=flops.executed_step_flops(cfg, kind, setup.vocab_size, folds) / 1e9
                if e.setup else None, achieved_gflop_s=median and model / median,
                utilisation=median and peak and model / median / peak,
                peak_mem_mb=phase.get("peak_device_mb" if info.get("device") == "cuda" else "peak_rss_mb"),
                compile_info=setup.compile_info))
    return rows


def comparisons_for(session: Session, sweep: dict | None) -> list[Comparison]:
    """Every measured variant against :data:`BASELINE`, per step kind, over the rounds both have."""
    out = []
    base = session.entries.get(BASELINE)
    for kind, rounds in session.rounds.items():
        base_s = base.round_s.get(kind) if base else None
        for name, e in session.entries.items():
            times = e.round_s.get(kind)
            if name != BASELINE and times and base_s:
                ratio, ci = paired_ratio(base_s, times)
                n = min(len(base_s), len(times))
                out.append(Comparison(BASELINE, name, kind, sweep, ratio, ci, n, sum(r.busy for r in rounds[:n]),
                                      METHOD))
    return out


def gemm_peak(measured: dict, device: str) -> dict:
    """The highest rate among the libraries measured on the benchmark ``device`` (numpy counts on the CPU)."""
    on_device = {k: v for k, v in measured.items() if v.get("device") == device}
    best = max(on_device, key=lambda k: on_device[k]["gflop_s"]) if on_device else None
    return {"gflop_s": on_device[best]["gflop_s"] if best else None, "backend": best, "measurements": measured}


def parity(losses: dict, steps: int) -> dict:
    """Each variant's max |Δloss| against :data:`BASELINE`'s loss curve (same weights, same batches, dropout 0)."""
    curves = {k: v for k, v in losses.items() if isinstance(v, list)}
    errors = {k: v for k, v in losses.items() if k not in curves}
    base = curves.get(BASELINE)
    dloss = {k: max(abs(x - y) for x, y in zip(base, v)) for k, v in curves.items() if k != BASELINE} if base else {}
    status = ("skipped (--parity-steps 0)" if steps == 0 else "failed: " + _pairs(errors) if errors
              else f"skipped: needs {BASELINE} and another variant in the run" if not dloss else "ok")
    return {"steps": steps, "baseline": BASELINE, "losses": curves, "max_abs_dloss": dloss, "errors": errors,
            "status": status}


def warnings(rows: Sequence[Row], rounds: Sequence[Round]) -> list[str]:
    """What makes this run's numbers less comparable than they look."""
    out = []
    devices = {r.framework: r.device_name for r in rows if r.device_name}
    if len(set(devices.values())) > 1:
        out.append(f"the twins ran on different devices ({devices}): their times are not comparable")
    if any((r.utilisation or 0) > 1 for r in rows):
        out.append("a variant's achieved FLOP/s exceeds the measured GEMM peak: the peak measurement was disturbed "
                   "(other work on the machine?), so utilisation figures are unreliable")
    if sum(r.busy for r in rounds):
        out.append(f"{sum(r.busy for r in rounds)} of {len(rounds)} rounds ran while other processes used more "
                   "than half the cores (busy in results.json): times are inflated, paired ratios less so")
    return out


def _fmt(x: Any, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def _pairs(d: dict) -> str:
    return ", ".join(f"{k}: ({_pairs(v)})" if isinstance(v, dict) else f"{k}={v}" for k, v in d.items())


def label(r: dict) -> str:
    return f"{r['framework']}:{r['variant']}"


def _ratio(doc: dict, r: dict | None) -> str:
    if r and label(r) == BASELINE:
        return "baseline"
    c = r and next((c for c in doc["comparisons"] if c["variant"] == label(r) and c["step"] == r["step"]
                    and c["sweep"] == r["sweep"]), None)
    return f"{c['ratio']:.2f}× [{c['ci95'][0]:.2f}–{c['ci95'][1]:.2f}]" if c else "–"


def _ms(r: dict | None) -> str:
    return f"{r['step_s']['median'] * 1e3:.1f}" if r and r["step_s"] else "–"


def main_rows(doc: dict) -> list[list[str]]:
    return [[label(r), r["step"], {True: "yes", False: "no"}.get(r["flush_denormal"], "–"), _ms(r),
             f"{r['step_s']['p25'] * 1e3:.1f}–{r['step_s']['p75'] * 1e3:.1f}", _ratio(doc, r),
             f"{r['rounds']}×{r['steps_per_round']}", _fmt(r["compile_s"], ".2f"), _fmt(r["first_step_s"], ".2f"),
             f"{r['samples_per_s']:.1f}", _fmt(r["peak_mem_mb"], ".0f"), f"{r['model_gflop_per_step']:.4g}",
             f"{r['executed_gflop_per_step']:.4g}", f"{r['achieved_gflop_s']:.1f}",
             _fmt(r["utilisation"] and 100 * r["utilisation"], ".1f") + "%"]
            for r in doc["results"] if r["sweep"] is None and r["step_s"]]


def sweep_rows(doc: dict, name: str) -> list[list[str]]:
    """One row per (value, variant): time per step kind and the paired ratios with their intervals."""
    out = []
    for r in (r for r in doc["results"] if r["sweep"] and r["sweep"]["field"] == name and r["step"] == "train"):
        ev = next((x for x in doc["results"] if x["sweep"] == r["sweep"] and x["step"] == "eval"
                   and label(x) == label(r)), None)
        busy = sum(b["busy"] for b in doc["sweep_rounds"].get(f"{name}={r['sweep']['value']}", []))
        out.append([str(r["sweep"]["value"]), label(r), _ms(r) if r["step_s"] else r["status"], _ratio(doc, r),
                    _ms(ev), _ratio(doc, ev), _fmt(r["samples_per_s"], ".1f"), _fmt(r["executed_gflop_per_step"],
                    ".4g"), f"{r['rounds']}" + (f" ({busy} busy)" if busy else "")]
                   + ([_fmt(r.get("efficiency"), ".2f")] if name == "devices" else []))
    return out


def add_efficiency(rows: list[Row]) -> None:
    """Rows of a sweep of ``devices``: throughput per device relative to the smallest count (1.0: linear)."""
    scaled = [r for r in rows if r.sweep and r.sweep["field"] == "devices" and r.sweep["value"] and r.step_s]
    for r in scaled:
        first = min((x for x in scaled if (x.framework, x.variant, x.step) == (r.framework, r.variant, r.step)),
                    key=lambda x: x.sweep["value"])
        r.efficiency = r.samples_per_s * first.sweep["value"] / (r.sweep["value"] * first.samples_per_s)


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        cell = lambda c: str(c).replace("|", "\\|")  # noqa: E731
        return "\n".join(["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
                         + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows])
    widths = [max([len(str(c))] + [len(str(r[i])) for r in rows]) for i, c in enumerate(columns)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in rows])


def render(doc: dict, charts: Sequence[str] = (), markdown: bool = False) -> str:
    """The whole report: stdout (``markdown=False``) or results.md."""
    c, s, e, p, q = doc["base_config"], doc["settings"], doc["environment"], doc["gemm_peak"], doc["parity"]
    notes = sorted({f"{label(r)}: {r['status']}: {r['error']}" for r in doc["results"]
                    if r["sweep"] is None and not r["step_s"]})
    if p["gflop_s"]:
        notes.append(f"float32 GEMM peak (best of 8 n×n products per library): {p['gflop_s']:.1f} GFLOP/s by "
                     f"{p['backend']} [" + ", ".join(f"{k} {v['gflop_s']:.1f} ({v['device']}, n={v['n']}, "
                                                    f"{v['precision']})"
                                                    for k, v in p["measurements"].items()) + "]")
    base = q["losses"].get(BASELINE)
    parity = [f"parity over {q['steps']} training steps (same weights and batches, dropout 0), max |Δloss| against "
              f"{BASELINE} (step 1: {base[0]:.6f}, step {q['steps']}: {base[-1]:.6f}): "
              + ", ".join(f"{k} {v:.3g}" for k, v in q["max_abs_dloss"].items())
              if q["status"] == "ok" else f"parity: {q['status']}",
              f"ratios: {METHOD}; busy rounds (other processes > half the cores): "
              + ", ".join(f"{k} {sum(r['busy'] for r in v)}/{len(v)}" for k, v in doc["rounds"].items())
              + "; util = model GFLOP/s ÷ the GEMM peak; exec GFLOP: what the variant computes (benchmarks/flops.py)"]
    for r in (r for r in doc["results"] if r.get("compile_info") and r["sweep"] is None and r["step"] == "train"):
        info = r["compile_info"]
        parity.append(f"{label(r)}: Dynamo traced {info['frames_ok']} of {info['frames_total']} frames into "
                      f"{info['unique_graphs']} graph(s), {info['graph_breaks']} graph break(s); could not trace: "
                      f"{_pairs(info['unimplemented']) or 'nothing'}")
    # Everything the environment records: CPU, versions, threads, precision, XLA's setup, load.
    env = [f"{k}: {_pairs(v) if isinstance(v, dict) else _fmt(v, '.3g' if isinstance(v, float) else '')}"
           for k, v in e.items()]
    section = lambda title: ["", f"## {title}", ""] if markdown else ["", f"{title}:"]  # noqa: E731
    items = lambda lines: [("- " if markdown else "") + x for x in lines]  # noqa: E731
    out = (["# LSTM twins benchmark", ""] if markdown else []) + [
        f"config: B {c['batch_size']}, T {c['seq_len']}, E {c['embed_dim']}, H {c['hidden_dim']}, L {c['layers']}, "
        f"V {doc['vocab_size']}, {c['dtype']}, corpus {c['data']}; {s['rounds']} paired rounds per step kind of "
        f"{s['steps']} training and {s['eval_steps']} evaluation steps per variant, after the first step (reported "
        f"apart) and {s['warmup']} warm-up steps"
        + "".join(f"; {k}: 1 training step per round" for k in doc["variants"] if k.endswith("-defaults"))]
    out += [("> **Warning:** " if markdown else "WARNING: ") + w for w in doc["warnings"]]
    out += ["", table(MAIN_COLUMNS, main_rows(doc), markdown), "", *items(notes)]
    out += [*section("Parity and method"), *items(parity), *section("Environment"), *items(env)]
    for field in (sweep["field"] for sweep in doc["settings"]["sweeps"]):
        scaling = field == "devices"
        title = f"Sweep of {field}" + (" (data-parallel scaling)" if scaling else "")
        out += [*section(title), f"Others at the base config; ratios vs {BASELINE} with 95% intervals."
                + (" " + SCALING if scaling else ""), "",
                table((*SWEEP_COLUMNS, "efficiency") if scaling else SWEEP_COLUMNS, sweep_rows(doc, field), markdown)]
    out += [*section("Variants"), *[f"- `{k}`: {v}" for k, v in doc["variants"].items()]]
    if markdown:
        out += ["", "## Charts", ""] + [f"![{c}]({c})" for c in charts]
    return "\n".join(out) + "\n"


def compare(a: dict, b: dict, names: Sequence[str], markdown: bool) -> str:
    """Rows measured in both runs (same variant, step kind and sweep point): A's and B's ms, and A ms / B ms."""
    def key(r):
        return label(r), r["step"], json.dumps(r["sweep"], sort_keys=True)

    theirs = {key(r): r for r in b["results"] if r["step_s"]}
    rows = [[label(r), r["step"], f"{r['sweep']['field']}={r['sweep']['value']}" if r["sweep"] else "base", _ms(r),
             _ms(theirs[key(r)]), f"{r['step_s']['median'] / theirs[key(r)]['step_s']['median']:.2f}×"]
            for r in a["results"] if r["step_s"] and key(r) in theirs]
    if not rows:
        raise ConfigError("compare: the two runs have no rows in common (same variant, step and sweep point)")
    head = [f"{tag}: {name} ({d['environment'].get('date', '?')}, {d['environment'].get('cpu_model', '?')}, "
            f"{', '.join(f'{k} {v}' for k, v in d['environment'].get('devices', {}).items())})"
            for tag, d, name in zip("AB", (a, b), names)]
    body = table(["variant", "step", "config", "A ms", "B ms", "A ms / B ms (above 1: B faster)"], rows, markdown)
    return "\n".join((["# Two benchmark runs side by side", ""] if markdown else [])
                     + [("- " if markdown else "") + h for h in head] + ["", body]) + "\n"

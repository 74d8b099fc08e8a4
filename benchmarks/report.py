"""Results: the rows of the report (one per framework × variant × step kind × configuration), the
results.json document, and the same tables as plain text (stdout) and Markdown (results.md).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from benchmarks import flops
from benchmarks.peak import GEMM_REPEATS, combine
from benchmarks.plan import Job, Settings, VARIANTS
from common.config import Config

SCHEMA_VERSION = 1
# A 1-minute load average above this share of the usable CPUs means other work competed for them.
BUSY_LOAD = 0.5
# The Config fields a result row records (what changes the work of a step).
CONFIG_KEYS = ("batch_size", "seq_len", "embed_dim", "hidden_dim", "layers", "dtype", "carry", "tbptt",
               "padding", "dropout", "fc_dropout", "clip")
PHASES = ("train", "eval")


def _status(result: dict, error: str | None) -> str:
    if not error:
        return "ok"
    if result.get("timed_out"):
        return "timeout"
    return "unavailable" if error.startswith("unavailable:") else "failed"


def _row(job: Job, result: dict, phase: str, peak_gflop_s: float | None) -> dict:
    cfg = Config(**job.config)
    info = result.get("info", {})
    phase_result = result.get(phase, {})
    error = result.get("error") or phase_result.get("error")
    row: dict[str, Any] = {
        "framework": job.framework, "variant": job.variant, "step": phase, "lstm_impl": result.get("lstm_impl"),
        "config": {k: getattr(cfg, k) for k in CONFIG_KEYS},
        "sweep": {"field": job.sweep[0], "value": job.sweep[1]} if job.sweep else None,
        "device": info.get("device"), "device_name": info.get("device_name"),
        "status": _status(result, error),
        "error": error,
        "compile_s": None, "lower_s": None, "first_step_s": None,
        "step_s": None, "steps": None, "block": None,
        "samples_per_s": None, "tokens_per_s": None,
        "peak_mem_mb": None, "mem_kind": None, "peak_rss_mb": None, "baseline_rss_mb": result.get("baseline_rss_mb"),
        "gflop_per_step": flops.step_flops(cfg, phase) / 1e9,
        "achieved_gflop_s": None, "utilisation": None,
        "threads": info.get("threads"), "precision": info.get("precision"),
        "compile_info": result.get("compile_info"),
    }
    if error:
        return row
    median = phase_result["step_s"]["median"]
    on_gpu = info.get("device") == "cuda"
    row.update({
        "compile_s": phase_result.get("compile_s"), "lower_s": phase_result.get("lower_s"),
        "first_step_s": phase_result["first_step_s"], "step_s": phase_result["step_s"],
        "steps": phase_result["steps"], "block": phase_result["block"],
        "samples_per_s": cfg.batch_size / median, "tokens_per_s": cfg.batch_size * cfg.seq_len / median,
        "peak_rss_mb": phase_result.get("peak_rss_mb"),
        "peak_mem_mb": phase_result.get("peak_device_mb") if on_gpu else phase_result.get("peak_rss_mb"),
        "mem_kind": "device peak allocated" if on_gpu else "process peak RSS",
        "achieved_gflop_s": row["gflop_per_step"] / median,
    })
    if peak_gflop_s:
        row["utilisation"] = row["achieved_gflop_s"] / peak_gflop_s
    return row


def gemm_peak(results: Sequence[dict], device: str) -> dict:
    """The best measurement per library over all workers, then the peak on ``device``."""
    merged: dict[str, dict] = {}
    for r in results:
        for backend, m in r.get("gemm", {}).items():
            if backend not in merged or m["gflop_s"] > merged[backend]["gflop_s"]:
                merged[backend] = m
    return combine(merged, device)


def parity(jobs: Sequence[Job], results: Sequence[dict], steps: int, frameworks: Sequence[str]) -> dict:
    """max |Δloss| between the twins' loss curves (same weights, same batches, dropout 0)."""
    curves, errors = {}, {}
    for job, r in zip(jobs, results):
        if job.parity_steps:
            if "parity_losses" in r:
                curves[job.framework] = r["parity_losses"]
            else:
                errors[job.framework] = r.get("parity_error") or r.get("error") or "no parity run"
    out: dict[str, Any] = {"steps": steps, "losses": curves, "max_abs_dloss": None, "status": None,
                           "errors": errors or None}
    if steps == 0:
        out["status"] = "skipped (--parity-steps 0)"
    elif set(frameworks) != {"torch", "jax"}:
        out["status"] = "skipped: needs both twins"
    elif not any(j.parity_steps for j in jobs):
        out["status"] = "skipped: parity runs with the main variants (torch:eager, jax:jit), not in this run"
    elif len(curves) < 2:
        out["status"] = "failed: " + "; ".join(f"{k}: {v}" for k, v in errors.items())
    else:
        a, b = curves["torch"], curves["jax"]
        out["max_abs_dloss"] = max(abs(x - y) for x, y in zip(a, b))
        out["status"] = "ok"
    return out


def build_document(jobs: Sequence[Job], results: Sequence[dict], base: Config, settings: Settings,
                   environment: dict, frameworks: Sequence[str], argv: Sequence[str]) -> dict:
    devices = [r.get("info", {}).get("device") for r in results if r.get("info")]
    device = devices[0] if devices else ("cuda" if settings.device in ("gpu", "cuda") else "cpu")
    peak = gemm_peak(results, device)
    rows = [_row(j, r, phase, peak["gflop_s"]) for j, r in zip(jobs, results) for phase in PHASES
            if phase in j.phases]
    env = dict(environment)
    env["devices"] = {j.framework: r["info"].get("device_name") for j, r in zip(jobs, results) if r.get("info")}
    env["threads"] = {j.framework: r["info"].get("threads") for j, r in zip(jobs, results) if r.get("info")}
    env["precision"] = {j.framework: r["info"].get("precision") for j, r in zip(jobs, results) if r.get("info")}
    return {
        "schema_version": SCHEMA_VERSION,
        "warnings": warnings(environment, env["devices"], rows),
        "command": list(argv),
        "environment": env,
        "settings": {"steps": settings.steps, "warmup": settings.warmup, "block": settings.block or "auto",
                     "parity_steps": settings.parity_steps, "device": settings.device,
                     "threads": settings.threads, "allow_tf32": settings.allow_tf32,
                     "frameworks": list(frameworks),
                     "sweeps": [{"field": s.field, "values": list(s.values)} for s in settings.sweeps]},
        "base_config": base.to_dict(),
        "variants": {v.label: v.description for v in VARIANTS if v.framework in frameworks},
        "gemm_peak_gflop_s": peak["gflop_s"],
        "gemm_peak": peak,
        "results": rows,
        "parity": parity(jobs, results, settings.parity_steps, frameworks),
        "job_wall_s": {j.label: r.get("wall_s") for j, r in zip(jobs, results)},
    }


def warnings(environment: dict, devices: dict, rows: Sequence[dict]) -> list[str]:
    """What makes this run's numbers less comparable than they look."""
    out = []
    if len(set(devices.values())) > 1:
        out.append("the twins ran on different devices (" + ", ".join(f"{k} {v}" for k, v in devices.items())
                   + "): their times are not comparable")
    if any((r.get("utilisation") or 0) > 1 for r in rows):
        out.append("a variant's achieved FLOP/s exceeds the measured GEMM peak: the peak measurement was "
                   "disturbed (other work on the machine?), so utilisation figures are unreliable")
    for when in ("start", "end"):
        load = environment.get(f"load_average_{when}")
        if load is not None and load > BUSY_LOAD * environment["usable_cpus"]:
            out.append(f"the machine was busy at the {when} (load average {load:.1f} on "
                       f"{environment['usable_cpus']} CPUs): times are inflated and noisy")
    return out


def write_json(doc: dict, path: Path) -> None:
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- tables

def _fmt(x: Any, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def _percent(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


MAIN_COLUMNS = ("framework", "variant", "step", "compile s", "first step s", "median ms", "p25–p75 ms",
                "samples/s", "tokens/s", "peak MB", "GFLOP/step", "GFLOP/s", "util")


def main_rows(doc: dict) -> list[list[str]]:
    out = []
    for r in doc["results"]:
        if r["sweep"] is not None:
            continue
        if r["status"] != "ok":
            out.append([r["framework"], r["variant"], r["step"], r["status"], (r["error"] or "")[:60]]
                       + [""] * (len(MAIN_COLUMNS) - 5))
            continue
        s = r["step_s"]
        out.append([r["framework"], r["variant"], r["step"], _fmt(r["compile_s"], ".2f"),
                    _fmt(r["first_step_s"], ".2f"), f"{s['median'] * 1e3:.1f}",
                    f"{s['p25'] * 1e3:.1f}–{s['p75'] * 1e3:.1f}", f"{r['samples_per_s']:.1f}",
                    f"{r['tokens_per_s']:.0f}", _fmt(r["peak_mem_mb"], ".0f"), f"{r['gflop_per_step']:.4g}",
                    f"{r['achieved_gflop_s']:.1f}", _percent(r["utilisation"])])
    return out


SWEEP_COLUMNS = ("value", "framework", "variant", "train median ms", "p25–p75 ms", "samples/s", "GFLOP/step",
                 "GFLOP/s", "util", "eval median ms")


def sweep_tables(doc: dict) -> dict[str, list[list[str]]]:
    """Per swept field: one row per (value, framework) with training and inference times."""
    tables: dict[str, list[list[str]]] = {}
    base = doc["base_config"]
    for sweep in doc["settings"]["sweeps"]:
        name = sweep["field"]
        rows = []
        for value in sweep["values"]:
            for r in doc["results"]:
                if r["step"] != "train":
                    continue
                at_base = r["sweep"] is None and base[name] == value
                at_point = r["sweep"] is not None and r["sweep"]["field"] == name and r["sweep"]["value"] == value
                if not (at_base or at_point):
                    continue
                if at_base and f"{r['framework']}:{r['variant']}" not in _main_labels():
                    continue
                ev = _partner(doc, r, "eval")
                if r["status"] != "ok":
                    rows.append([str(value), r["framework"], r["variant"], r["status"], "", "", "", "", "", ""])
                    continue
                s = r["step_s"]
                rows.append([str(value), r["framework"], r["variant"], f"{s['median'] * 1e3:.1f}",
                             f"{s['p25'] * 1e3:.1f}–{s['p75'] * 1e3:.1f}", f"{r['samples_per_s']:.1f}",
                             f"{r['gflop_per_step']:.4g}", f"{r['achieved_gflop_s']:.1f}",
                             _percent(r["utilisation"]),
                             f"{ev['step_s']['median'] * 1e3:.1f}" if ev and ev["status"] == "ok" else "–"])
        tables[name] = rows
    return tables


def _main_labels() -> list[str]:
    return [v.label for v in VARIANTS if v.main]


def _partner(doc: dict, row: dict, step: str) -> dict | None:
    for r in doc["results"]:
        if (r["framework"], r["variant"], r["sweep"], r["config"], r["step"]) == (
                row["framework"], row["variant"], row["sweep"], row["config"], step):
            return r
    return None


def text_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in rows])


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _config_line(doc: dict) -> str:
    c = doc["base_config"]
    return (f"B {c['batch_size']}, T {c['seq_len']}, E {c['embed_dim']}, H {c['hidden_dim']}, L {c['layers']}, "
            f"{c['dtype']}, corpus {c['data']}")


def _peak_line(doc: dict) -> str:
    p = doc["gemm_peak"]
    if not p["gflop_s"]:
        return "float32 GEMM peak: not measured"
    parts = ", ".join(f"{k} {v['gflop_s']:.1f} ({v['device']}, n={v['n']})" for k, v in p["measurements"].items())
    return (f"float32 GEMM peak (best of {GEMM_REPEATS} n×n products per library, this run): "
            f"{p['gflop_s']:.1f} GFLOP/s by {p['backend']} [{parts}]")


def _parity_line(doc: dict) -> str:
    p = doc["parity"]
    if p["status"] != "ok":
        return f"parity: {p['status']}"
    a, b = p["losses"]["torch"], p["losses"]["jax"]
    return (f"parity over {p['steps']} training steps (same weights and batches, dropout 0): "
            f"max |Δloss| = {p['max_abs_dloss']:.3g}  (loss step 1: torch {a[0]:.6f}, jax {b[0]:.6f}; "
            f"step {len(a)}: torch {a[-1]:.6f}, jax {b[-1]:.6f})")


def _compile_lines(doc: dict) -> list[str]:
    lines = []
    seen = set()
    for r in doc["results"]:
        info = r.get("compile_info")
        if not info or r["sweep"] is not None or r["variant"] in seen:
            continue
        seen.add(r["variant"])
        breaks = "; ".join(f"{k} (x{n})" for k, n in info["graph_break_reasons"].items()) or "none"
        refused = "; ".join(f"{k} (x{n})" for k, n in info["unimplemented"].items()) or "nothing"
        lines.append(f"torch:{r['variant']}: Dynamo traced {info['frames_ok']} of {info['frames_total']} frames "
                     f"into {info['unique_graphs']} graph(s) with {info['graph_breaks']} graph break(s) [{breaks}]; "
                     f"could not trace: {refused}")
    return lines


def _pairs(d: dict | None) -> str:
    return ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in (d or {}).items())


def _env_lines(doc: dict) -> list[str]:
    e = doc["environment"]
    v = e["versions"]
    return [f"date {e['date']}; CPU {e['cpu_model']} ({e['usable_cpus']} usable of {e['cpu_count']}); "
            f"{e['platform']}",
            "python " + e["python"] + "; " + ", ".join(f"{k} {v[k] or 'not installed'}" for k in v),
            "devices: " + ", ".join(f"{k} {d}" for k, d in e["devices"].items()),
            "threads: " + "; ".join(f"{k}: {_pairs(t)}" for k, t in e["threads"].items()),
            "matmul precision: " + "; ".join(f"{k}: {_pairs(p)}" for k, p in e["precision"].items()),
            f"load average (1 min) at start {_fmt(e.get('load_average_start'), '.2f')}, at end "
            f"{_fmt(e.get('load_average_end'), '.2f')}; whole run {_fmt(e.get('run_wall_s'), '.0f')} s"]


def stdout_report(doc: dict) -> str:
    out = [f"config: {_config_line(doc)}; {doc['settings']['steps']} timed steps after "
           f"{doc['settings']['warmup']} warm-up (+ the first step, reported apart)"]
    out += [f"WARNING: {w}" for w in doc["warnings"]]
    out += ["", text_table(MAIN_COLUMNS, main_rows(doc)), "", _peak_line(doc), _parity_line(doc)]
    out += _compile_lines(doc)
    out += [""] + _env_lines(doc)
    for name, rows in sweep_tables(doc).items():
        out += ["", f"sweep {name} (others at the base config):", text_table(SWEEP_COLUMNS, rows)]
    return "\n".join(out)


def markdown_report(doc: dict, charts: Sequence[str]) -> str:
    settings = doc["settings"]
    out = ["# LSTM twins benchmark", "",
           f"Configuration: {_config_line(doc)}. {settings['steps']} timed steps per measurement after "
           f"{settings['warmup']} warm-up steps; the first step (and compilation) is reported apart.", ""]
    out += [f"> **Warning:** {w}\n" for w in doc["warnings"]]
    out += ["## Environment", ""] + [f"- {line}" for line in _env_lines(doc)]
    out += ["", "## Time per step", "", markdown_table(MAIN_COLUMNS, main_rows(doc)), "",
            f"- {_peak_line(doc)}",
            "- util = achieved model GFLOP/s ÷ the measured GEMM peak; model FLOPs count the matrix products "
            "only (see benchmarks/flops.py).",
            "- compile s: JAX `lower()` + `compile()` of the jitted step; torch.compile variants: the first "
            "call (Dynamo/Inductor work plus the step). first step s: the first call after that.",
            "- peak MB: process peak RSS on the CPU (each variant in a fresh process: framework, data and model "
            "included; inference is measured first), peak device allocation on a GPU."]
    out += [f"- {line}" for line in _compile_lines(doc)]
    out += ["", "## Parity", "", _parity_line(doc)]
    for name, rows in sweep_tables(doc).items():
        out += ["", f"## Sweep: {name}", "", markdown_table(SWEEP_COLUMNS, rows)]
    out += ["", "## Variants", ""] + [f"- `{k}`: {v}" for k, v in doc["variants"].items()]
    if charts:
        out += ["", "## Charts", ""] + [f"![{c}]({c})" for c in charts]
    return "\n".join(out) + "\n"

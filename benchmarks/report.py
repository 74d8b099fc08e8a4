"""Rows and paired comparisons from the rounds, the tier sentences, the same tables as text (stdout) and Markdown
(results.md), and ``compare``. A variant runs in several worker processes (replicates) whose rounds interleave. A
row's time per step is the median over every replicate's rounds of the per-round medians. A comparison's ratio is the
median over rounds of baseline / variant, each side the mean of its replicates in that round (above 1: the variant
is faster); its 95% interval comes from a two-level bootstrap: each side's replicates resampled, then the rounds."""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

from benchmarks import flops, plan
from benchmarks.plan import BASELINE
from benchmarks.schema import Comparison, EntryResult, Round, Row, Session, Setup, Spread
from common.errors import ConfigError

RESAMPLES = 10_000
PARITY_TOL = 1e-5  # float32: the twins' losses agree to rounding (parity_tests/test_trajectories.py measures ~1e-6)
# bfloat16 rows against the baseline's float32 losses: the parity suite's band for each twin's bfloat16 against its own
# float32 (parity_tests/test_bfloat16.py: ≤ 1.0e-3 over 50 steps, held at 3e-3); measured here at the seed's
# configuration over the default 20 parity steps: torch:eager 8.7e-4, jax:scan 8.3e-4, jax:flax 7.5e-4.
BFLOAT16_BAND = 3e-3
REFERENCE = f"{BASELINE} float32"  # the parity curve of a bfloat16 run's rows: the baseline's, trained in float32


def parity_tol(dtype: str) -> float:
    """The largest max |Δloss| a row of ``dtype`` may show against its reference curve."""
    return BFLOAT16_BAND if dtype == "bfloat16" else PARITY_TOL


PARTS = ("forward", "backward", "optimizer")
METHOD = (f"median over paired, interleaved rounds of baseline s / variant s, each the mean of its replicates; 95% "
          f"interval: two-level percentile bootstrap, replicates then rounds ({RESAMPLES} resamples, seed 0)")
MAIN_COLUMNS = ("tier", "variant", "step", "kernel", "parity", "median ms", "p25–p75 ms", f"vs {BASELINE} [95% CI]",
                "reps×rounds×steps", "compile s", "first s", "samples/s", "peak MB", "exec GFLOP", "GFLOP/s", "util")
PARTS_METHOD = ("Each part timed on its own, in the same paired rounds and batches: torch, the trainer's own step with "
                "a clock read (after a device sync) as the loss, the backward pass and the optimizer update (clip, "
                "Adam) end; JAX, the step as three jitted functions: the loss, loss and gradient (backward: its "
                "time less the loss's), and the update. sum / step: the parts' medians against the whole step's "
                "(JAX above 1: XLA fuses the whole step, not its parts).")
PARTS_COLUMNS = ("variant", *(f"{p} ms" for p in PARTS), "sum / step", *(f"{p} vs {BASELINE}" for p in PARTS))
SWEEP_COLUMNS = ("value", "variant", "kernel", "parity", "train ms", f"train vs {BASELINE}", "eval ms",
                 f"eval vs {BASELINE}", "train samples/s", "exec GFLOP train", "rounds")
SCALING = ("At a fixed global batch, torch runs N DDP ranks (gloo on a CPU, the threads split between them) and JAX "
           "one process over N devices (simulated on a CPU); efficiency = training throughput / (N × the smallest "
           "count's per device), 1.0 is linear. On a CPU the N devices share the same cores: this measures the "
           "overhead of data parallelism, not a speed-up.")


def paired_ratio(base_s: Sequence[Sequence[float]], variant_s: Sequence[Sequence[float]],
                 seed: int = 0) -> tuple[float, list[float]]:
    """``(ratio, [low, high])`` from seconds per [replicate][round] of each side, rounds paired by index: the median
    over rounds of mean(base) / mean(variant), and its 95% two-level bootstrap interval."""
    n = min(len(r) for r in (*base_s, *variant_s))
    b, v = (np.asarray([r[:n] for r in x], dtype=np.float64) for x in (base_s, variant_s))  # (replicates, n)
    rng = np.random.default_rng(seed)
    reps_b, reps_v = (rng.integers(0, len(x), size=(RESAMPLES, len(x))) for x in (b, v))
    per_round = b[reps_b].mean(axis=1) / v[reps_v].mean(axis=1)  # (RESAMPLES, n)
    picked = np.take_along_axis(per_round, rng.integers(0, n, size=(RESAMPLES, n)), axis=1)
    low, high = np.percentile(np.median(picked, axis=1), [2.5, 97.5])
    return float(np.median(b.mean(axis=0) / v.mean(axis=0))), [float(low), float(high)]


def round_means(replicates: Sequence[Sequence[float]]) -> np.ndarray:
    """Seconds per [replicate][round] → each round's mean over the replicates, over the rounds all of them have."""
    n = min(map(len, replicates))
    return np.mean([r[:n] for r in replicates], axis=0)


def by_variant(session: Session) -> dict[str, list[EntryResult]]:
    """Each variant's replicates, in the order the variants were set up."""
    out: dict[str, list[EntryResult]] = {}
    for e in session.entries.values():
        out.setdefault(e.label, []).append(e)
    return out


def _spread(times: list[float]) -> Spread | None:
    return Spread(*(float(x) for x in np.percentile(times, [50, 25, 75]))) if times else None


def fallback(label: str, setup: Setup | None) -> str | None:
    """Why the kernel that ran is not the one ``label`` promises on its device (and in its dtype), or None."""
    if setup is None or setup.provenance is None:
        return None
    device = "gpu" if setup.info.get("device") == "cuda" else setup.info.get("device")
    promises = plan.variant(label).kernel
    promised = promises.get(f"{device}:{setup.record.get('dtype')}", promises.get(device))
    kernels = setup.provenance["kernels"]
    if promised and not any(promised in k for k in kernels):
        return f"{label} promises {promised} on the {device}, but its training step ran {', '.join(kernels) or 'none'}"
    return None


def rows_for(session: Session, configs: dict[str, dict], sweep: dict | None, peak: float | None,
             parity: dict | None = None) -> list[Row]:
    """One row per variant and step kind, over its replicates that ran (all of them, for one that did not)."""
    rows = []
    for name, replicates in by_variant(session).items():
        ran = [e for e in replicates if e.status == "ok"] or replicates[:1]
        e = ran[0]
        cfg = SimpleNamespace(**configs[name])  # not a Config: a skipped variant's choice may not validate
        setup = e.setup or Setup(0, {}, {}, {})
        record, info = setup.record, setup.info
        folds = record.get("lstm_impl") == "fused" and cfg.embed_fold
        # jax:jit under bfloat16 runs the scan stack (--lstm-impl auto's choice there): a stock row then
        tier = "stock" if record.get("lstm_impl") in ("scan", "flax") else plan.variant(name).tier
        dloss = (parity or {}).get("max_abs_dloss", {}).get(name, 0.0 if name == BASELINE and parity else None)
        for kind in ("train", "eval"):
            phase, per_rep = setup.phases.get(kind, {}), [x.round_s.get(kind, []) for x in ran]
            times = [t for r in per_rep for t in r]
            model = flops.step_flops(cfg, kind) / 1e9
            spread = _spread(times)
            median = spread and spread.median
            parts = {p: _spread([t for x in ran for t in x.round_s.get(p, [])]) for p in PARTS}
            rows.append(Row(
                framework=name.split(":")[0], variant=name.split(":", 1)[1], tier=tier, step=kind,
                sweep=sweep, status=e.status, error=e.error,
                provenance=setup.provenance if kind == "train" else None,
                fallback=fallback(name, e.setup) if e.status == "ok" else None,
                parity=dloss, parity_ok=None if dloss is None else dloss <= parity_tol(cfg.dtype), config=configs[name],
                lstm_impl=record.get("lstm_impl"), device_name=info.get("device_name"),
                flush_denormal=record.get("flush_denormal"), threads=info.get("threads"),
                compile_s=phase.get("compile_s"), lower_s=phase.get("lower_s"), first_step_s=phase.get("first_step_s"),
                step_s=spread, parts=parts if kind == "train" and any(parts.values()) else None,
                replicates=len(ran) if times else 0, rounds=min((len(r) for r in per_rep), default=0),
                steps_per_round=e.steps_per_round.get(kind), round_s=per_rep,
                samples_per_s=median and cfg.batch_size / median, model_gflop_per_step=model,
                executed_gflop_per_step=flops.executed_step_flops(cfg, kind, setup.vocab_size, folds) / 1e9
                if e.setup else None, achieved_gflop_s=median and model / median,
                # The peak is a float32 GEMM's: a row of another dtype has no utilisation against it.
                utilisation=median and peak and cfg.dtype == "float32" and model / median / peak or None,
                peak_mem_mb=phase.get("peak_device_mb" if info.get("device") == "cuda" else "peak_rss_mb")))
    return rows


def comparisons_for(session: Session, sweep: dict | None) -> list[Comparison]:
    """Every measured variant against :data:`BASELINE`, per step kind and part, over the rounds both have; a
    variant whose kernel is a fallback (or a baseline that is one) is kept out."""
    out = []
    variants = {k: [e for e in v if e.status == "ok"] for k, v in by_variant(session).items()}
    base = variants.get(BASELINE) or []
    if not base or fallback(BASELINE, base[0].setup):
        return out
    for kind in ("train", "eval", *PARTS):
        rounds = session.rounds.get("parts" if kind in PARTS else kind, [])
        base_s = [e.round_s.get(kind) for e in base if e.round_s.get(kind)]
        for name, ran in variants.items():
            times = [e.round_s.get(kind) for e in ran if e.round_s.get(kind)]
            # A part measured as a difference (JAX's backward) can come out at or below 0 on tiny steps: no ratio.
            positive = all(t > 0 for r in (*base_s, *times) for t in r)
            if name != BASELINE and times and base_s and positive and not fallback(name, ran[0].setup):
                ratio, ci = paired_ratio(base_s, times)
                n = min(len(r) for r in (*base_s, *times))
                out.append(Comparison(BASELINE, name, kind, sweep, ratio, ci, n, sum(r.busy for r in rounds[:n]),
                                      METHOD))
    return out


def gemm_peak(measured: dict, device: str) -> dict:
    """The highest rate among the libraries measured on the benchmark ``device`` (numpy counts on the CPU)."""
    on_device = {k: v for k, v in measured.items() if v.get("device") == device}
    best = max(on_device, key=lambda k: on_device[k]["gflop_s"]) if on_device else None
    return {"gflop_s": on_device[best]["gflop_s"] if best else None, "backend": best, "measurements": measured}


def parity(losses: dict, steps: int) -> dict:
    """Each variant's max |Δloss| against the reference loss curve (same weights, same batches, dropout 0):
    :data:`BASELINE`'s, or in a bfloat16 run :data:`REFERENCE` (then the baseline's own curve is compared too)."""
    curves = {k: v for k, v in losses.items() if isinstance(v, list)}
    errors = {k: v for k, v in losses.items() if k not in curves}
    reference = REFERENCE if REFERENCE in losses else BASELINE
    base = curves.get(reference)
    dloss = {k: max(abs(x - y) for x, y in zip(base, v)) for k, v in curves.items() if k != reference} if base else {}
    status = ("skipped (--parity-steps 0)" if steps == 0 else "failed: " + _pairs(errors) if errors
              else f"skipped: needs {BASELINE} and another variant in the run" if not dloss else "ok")
    return {"steps": steps, "baseline": reference, "losses": curves, "max_abs_dloss": dloss, "errors": errors,
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
    for r in rows:
        if r.step == "train" and r.fallback:
            out.append(f"fallback, kept out of the comparisons: {r.fallback}")
        if r.step == "train" and r.parity_ok is False:
            out.append(f"{r.framework}:{r.variant}: max |Δloss| {r.parity:.3g} against {BASELINE} is beyond "
                       f"{parity_tol(r.config['dtype']):g} ({r.config['dtype']}): kept out of the tier sentences")
    return out


def tier_sentences(rows: Sequence[Row], comparisons: Sequence[Comparison]) -> list[str]:
    """One sentence per tier comparison, each ratio with its interval: stock against stock, the best tuned JAX
    against stock PyTorch, the same-algorithm pair, and the vendor kernels and the compiler where they ran. A row
    that is a fallback or fails float32 parity takes no part."""
    base = [r for r in rows if r.sweep is None]
    good = {f"{r.framework}:{r.variant}" for r in base if r.step == "train" and r.status == "ok" and not r.fallback
            and r.parity_ok is not False}
    ratio = {(c.variant, c.step): c for c in comparisons if c.sweep is None and c.variant in good}

    def speeds(name: str) -> str:
        return " and ".join(f"{verb} at {ratio[name, kind].ratio:.2f}× [{ratio[name, kind].ci95[0]:.2f}–"
                            f"{ratio[name, kind].ci95[1]:.2f}]" for kind, verb in (("train", "trains"),
                                                                                  ("eval", "infers"))
                            if (name, kind) in ratio) + f" the speed of {BASELINE}"

    tiers = {f"{r.framework}:{r.variant}": r.tier for r in base}
    tuned = [n for n in ("jax:jit", "jax:nofold") if (n, "train") in ratio and tiers[n] == "tuned"]
    best = max(tuned, key=lambda n: ratio[n, "train"].ratio) if tuned else None
    cells = (("jax:flax", "Flax's nn.OptimizedLSTMCell"), ("jax:scan", "PyTorch's cell"))
    stock = [f"Flax nn.RNN over {what} ({n}) {speeds(n)}" for n, what in cells if (n, "train") in ratio]
    out = [f"Stock against stock, torch:eager being PyTorch's nn.LSTM: {'; '.join(stock)}." if stock else None,
           f"Best tuned JAX against stock PyTorch: {best} {speeds(best)}." if best else None,
           f"The same algorithm as nn.LSTM, hand-tuned (jax:nofold), {speeds('jax:nofold')}."
           if ("jax:nofold", "train") in ratio else None,
           f"Vendor kernel against vendor kernel: cuDNN through JAX (jax:cudnn) {speeds('jax:cudnn')} (nn.LSTM on "
           f"cuDNN)." if ("jax:cudnn", "train") in ratio else None,
           f"Compiled: torch.compile (torch:compile) {speeds('torch:compile')}." if ("torch:compile", "train") in ratio
           else None]
    out += [f"{r.framework}:{r.variant} ({r.tier}): not timed, {r.status}: {r.error}" for r in base
            if r.step == "train" and r.status in ("n/a", "skipped")]
    return [x for x in out if x]


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


def kernel(r: dict) -> str:
    """The provenance in a table cell: torch's LSTM op, or JAX's implementation and the loops its step compiled to."""
    prov = r["provenance"]
    if not prov:
        return "–"
    if r["framework"] == "torch":  # the op, and the dtypes the LSTM's ops computed in (the ATen cell: its matmuls')
        ops = [k.removeprefix("aten::") for k in prov["kernels"] if k.startswith("aten::") and k != "aten::lstm"]
        dtypes = sorted({d for v in prov.get("kernel_dtypes", {}).values() for d in v})
        return ", ".join([min(ops, key=len)] if ops else prov["kernels"][:1]) + "".join(f" {d}" for d in dtypes) + (
            " + dynamo" if "dynamo:lstm" in prov["kernels"] else "")
    calls = [c for c in prov["custom_calls"] if "rnn" in c]
    return f"{r['lstm_impl']}, {prov['float_while_loops']} loops" + "".join(f", {c}" for c in calls)


def _parity_cell(r: dict) -> str:
    if r["parity"] is None:
        return "–"
    base = label(r) == BASELINE and r["config"]["dtype"] != "bfloat16"  # bfloat16: against its float32
    return ("base" if base else f"{r['parity']:.1e}") + ("" if r["parity_ok"] else " (!)")


def base_rows(doc: dict) -> list[dict]:
    """The base configuration's rows that ran, grouped by tier (in TIERS' order), in the run's order within one."""
    rows = [r for r in doc["results"] if r["sweep"] is None and r["step_s"]]
    return sorted(rows, key=lambda r: list(plan.TIERS).index(r["tier"]))


def main_rows(doc: dict) -> list[list[str]]:
    return [[r["tier"], label(r) + (" (fallback)" if r["fallback"] else ""), r["step"], kernel(r) if r["step"] ==
             "train" else "", _parity_cell(r) if r["step"] == "train" else "", _ms(r),
             f"{r['step_s']['p25'] * 1e3:.1f}–{r['step_s']['p75'] * 1e3:.1f}", _ratio(doc, r),
             f"{r['replicates']}×{r['rounds']}×{r['steps_per_round']}", _fmt(r["compile_s"], ".2f"),
             _fmt(r["first_step_s"], ".2f"), f"{r['samples_per_s']:.1f}", _fmt(r["peak_mem_mb"], ".0f"),
             f"{r['executed_gflop_per_step']:.4g}", f"{r['achieved_gflop_s']:.1f}",
             _fmt(r["utilisation"], ".1%")] for r in base_rows(doc)]


def parts_rows(doc: dict) -> list[list[str]]:
    """Per variant: the median of each part of the training step, their sum against the whole step, and each part's
    paired ratio against the baseline."""
    out = []
    for r in (r for r in base_rows(doc) if r["step"] == "train" and r["parts"]):
        parts = [r["parts"][p]["median"] if r["parts"].get(p) else None for p in PARTS]
        total = sum(x for x in parts if x is not None)
        out.append([label(r), *(_fmt(x and x * 1e3, ".1f") for x in parts), f"{total / r['step_s']['median']:.2f}",
                    *(_ratio(doc, {**r, "step": p}) for p in PARTS)])
    return out


def sweep_rows(doc: dict, name: str) -> list[list[str]]:
    """One row per (value, variant): time per step kind and the paired ratios with their intervals."""
    out = []
    for r in (r for r in doc["results"] if r["sweep"] and r["sweep"]["field"] == name and r["step"] == "train"):
        ev = next((x for x in doc["results"] if x["sweep"] == r["sweep"] and x["step"] == "eval"
                   and label(x) == label(r)), None)
        busy = sum(b["busy"] for b in doc["sweep_rounds"].get(f"{name}={r['sweep']['value']}", []))
        out.append([str(r["sweep"]["value"]), label(r), kernel(r), _parity_cell(r), _ms(r) if r["step_s"] else
                    r["status"], _ratio(doc, r),
                    _ms(ev), _ratio(doc, ev), _fmt(r["samples_per_s"], ".1f"), _fmt(r["executed_gflop_per_step"],
                    ".4g"), f"{r['rounds']}" + (f" ({busy} busy)" if busy else "")]
                   + ([_fmt(r.get("efficiency"), ".2f")] if name == "devices" else []))
    return out


def dtype_costs(doc: dict) -> list[str]:
    """A sweep of dtype: per variant and step kind, its float32 time over its bfloat16 time (above 1: bfloat16 is
    faster). The two points are sessions of their own, so the ratio is unpaired: its median over each side's rounds
    (each the mean of its replicates), the 95% interval a bootstrap of the two sides' rounds apart."""
    at = {(label(r), r["step"], r["sweep"]["value"]): r for r in doc["results"]
          if r["sweep"] and r["sweep"]["field"] == "dtype" and r["step_s"]}
    rng, out = np.random.default_rng(0), []
    for (name, kind, value), r in at.items():
        other = at.get((name, kind, "float32"))
        if value != "bfloat16" or other is None:
            continue
        f32, bf16 = (round_means(y["round_s"]) for y in (other, r))
        draws = [np.median(rng.choice(f32, (RESAMPLES, len(f32))), axis=1),
                 np.median(rng.choice(bf16, (RESAMPLES, len(bf16))), axis=1)]
        low, high = np.percentile(draws[0] / draws[1], [2.5, 97.5])
        out.append(f"{name} {kind}: float32 ms / bfloat16 ms = {np.median(f32) / np.median(bf16):.2f}× "
                   f"[{low:.2f}–{high:.2f}] (unpaired: two sessions)")
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
                    if r["sweep"] is None and not r["step_s"] and r["status"] != "n/a"})  # n/a: in the headline
    if p["gflop_s"]:
        notes.append(f"float32 GEMM peak (best of 8 n×n products per library): {p['gflop_s']:.1f} GFLOP/s by "
                     f"{p['backend']} [" + ", ".join(f"{k} {v['gflop_s']:.1f} ({v['device']}, n={v['n']}, "
                                                    f"{v['precision']})"
                                                    for k, v in p["measurements"].items()) + "]")
    base = q["losses"].get(q["baseline"])
    parity = [f"parity over {q['steps']} training steps (same weights and batches, dropout 0), max |Δloss| against "
              f"{q['baseline']} (step 1: {base[0]:.6f}, step {q['steps']}: {base[-1]:.6f}): "
              + ", ".join(f"{k} {v:.3g}" for k, v in q["max_abs_dloss"].items())
              if q["status"] == "ok" else f"parity: {q['status']}",
              f"ratios: {METHOD}; busy rounds (other processes > half the cores): "
              + ", ".join(f"{k} {sum(r['busy'] for r in v)}/{len(v)}" for k, v in doc["rounds"].items())
              + "; util = model GFLOP/s ÷ the GEMM peak; exec GFLOP: what the variant computes (benchmarks/flops.py)"]
    for r in (r for r in doc["results"] if r["sweep"] is None and r["step"] == "train" and r["provenance"]
              and "dynamo" in r["provenance"]):
        info = r["provenance"]["dynamo"]
        parity.append(f"{label(r)}: Dynamo traced {info['frames_ok']} of {info['frames_total']} frames into "
                      f"{info['unique_graphs']} graph(s), {info['graph_breaks']} graph break(s); could not trace: "
                      f"{_pairs(info['unimplemented']) or 'nothing'}")
    parity.append("kernel: torch, the LSTM op torch.profiler saw in a training step; JAX, the implementation and the "
                  "while loops over float arrays its compiled training step holds. A row whose kernel is not the "
                  "one its label promises is a fallback, kept out of the comparisons. parity: max |Δloss| against "
                  f"{BASELINE} over the parity steps (a bfloat16 row: against {REFERENCE}); (!) beyond its band "
                  f"(float32 {PARITY_TOL:g}, bfloat16 {BFLOAT16_BAND:g}), kept out of the tier sentences")
    # Everything the environment records: CPU, versions, threads, precision, XLA's setup, load.
    env = [f"{k}: {_pairs(v) if isinstance(v, dict) else _fmt(v, '.3g' if isinstance(v, float) else '')}"
           for k, v in e.items()]
    section = lambda title: ["", f"## {title}", ""] if markdown else ["", f"{title}:"]  # noqa: E731
    items = lambda lines: [("- " if markdown else "") + x for x in lines]  # noqa: E731
    out = (["# LSTM twins benchmark", ""] if markdown else []) + [
        f"config: B {c['batch_size']}, T {c['seq_len']}, E {c['embed_dim']}, H {c['hidden_dim']}, L {c['layers']}, "
        f"V {doc['vocab_size']}, {c['dtype']}, corpus {c['data']}; {s['replicates']} worker processes per variant, "
        f"{s['rounds']} paired rounds per step kind of {s['steps']} training, {s['eval_steps']} evaluation and "
        f"{s['parts_steps']} part-timed training steps per process, after the first step (reported apart) and "
        f"{s['warmup']} warm-up steps"
        + "".join(f"; {k}: 1 training step per round" for k in doc["variants"] if k.endswith("-defaults"))]
    out += [("> **Warning:** " if markdown else "WARNING: ") + w for w in doc["warnings"]]
    out += ["", table(MAIN_COLUMNS, main_rows(doc), markdown), "", *items(doc["headline"]), "", *items(notes)]
    if parts_rows(doc):
        out += [*section("Where the training step's time goes"), PARTS_METHOD, "",
                table(PARTS_COLUMNS, parts_rows(doc), markdown)]
    out += [*section("Parity and method"), *items(parity), *section("Environment"), *items(env)]
    for field in (sweep["field"] for sweep in doc["settings"]["sweeps"]):
        scaling = field == "devices"
        title = f"Sweep of {field}" + (" (data-parallel scaling)" if scaling else "")
        out += [*section(title), f"Others at the base config; ratios vs {BASELINE} with 95% intervals."
                + (" " + SCALING if scaling else ""), "",
                table((*SWEEP_COLUMNS, "efficiency") if scaling else SWEEP_COLUMNS, sweep_rows(doc, field), markdown)]
        if field == "dtype":
            out += ["", "What bfloat16 costs (below 1) or gains (above 1) against float32, per variant:", "",
                    *items(dtype_costs(doc))]
    out += [*section("Variants"), *[f"- `{k}`: {v}" for k, v in doc["variants"].items()]]
    if markdown:
        out += ["", "## Charts", ""] + [f"![{c}]({c})" for c in charts]
    return "\n".join(out) + "\n"


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

"""The reports, from a results document as ``results.json`` holds it: a speed run's (the main table by tier, the
headline sentences, notes, the parts table, parity and method, the environment, one table per sweep, the variants) as
text for stdout or Markdown for results.md, and convergence mode's tables in Markdown."""
from typing import Sequence

import numpy as np

from benchmarks import plan
from benchmarks.plan import BASELINE
from benchmarks.results import BFLOAT16_BAND, LM_PARITY_LR, PARITY_TOL, PARTS, REFERENCE
from benchmarks.sides import DISPATCH_CALLS
from benchmarks.stats import METHOD, round_means, unpaired_ratio
from benchmarks.tables import fmt, kernel, label, ms, pairs, parity_cell, ratio_cell, table

MAIN_COLUMNS = ("tier", "variant", "step", "kernel", "parity", "median ms", "p25–p75 ms", f"vs {BASELINE} [95% CI]",
                "reps×rounds×steps", "compile s", "first s", "samples/s", "peak MB", "exec GFLOP", "exec GFLOP/s",
                "model GFLOP/s", "util")
PARTS_METHOD = ("Each part timed on its own, in the same paired rounds and batches: torch, the trainer's own step with "
                "a clock read (after a device sync) as the loss, the backward pass and the optimizer update (clip, "
                "Adam or SGD) end; JAX, the step as three jitted functions: the loss, loss and gradient (backward: its "
                "time less the loss's), and the update. sum / step: the parts' medians against the whole step's "
                "(JAX above 1: XLA fuses the whole step, not its parts).")
PARTS_COLUMNS = ("variant", *(f"{p} ms" for p in PARTS), "sum / step", *(f"{p} vs {BASELINE}" for p in PARTS))
DECODER_METHOD = ("decoder: the language model's decoder and loss alone (the twin's own nn.Linear / Decoder and "
                  "cross-entropy on a fixed input of the step's (t, B, H) shape), forward and backward, timed in the "
                  "same rounds; the rest of forward + backward is the embedding and the recurrence (and, in JAX, the "
                  "dropout masks).")
DECODER_COLUMNS = ("decoder ms", "embedding + recurrence ms", "decoder share", f"decoder vs {BASELINE}",
                   f"embedding + recurrence vs {BASELINE}")
SWEEP_COLUMNS = ("value", "variant", "kernel", "parity", "train ms", f"train vs {BASELINE}", "eval ms",
                 f"eval vs {BASELINE}", "train samples/s", "exec GFLOP train", "rounds")
SCALING = ("At a fixed global batch, torch runs N DDP ranks (gloo on a CPU, the threads split between them) and JAX "
           "one process over N devices (simulated on a CPU); efficiency = training throughput / (N × the smallest "
           "count's per device), 1.0 is linear, – where that count ran another implementation (jax:jit runs our "
           "kernel on one device, the fused recurrence over several). On a CPU the N devices share the same cores: "
           "this measures the overhead of data parallelism, not a speed-up.")


def corpus(config: dict) -> str:
    """The corpus a run's config read: the --pos and --neg files when given (--data then keeps its default), else
    --data."""
    if config.get("pos"):
        return f"{config['pos']} (positive) and {config['neg']} (negative)"
    return config["data"]


def is_lm(doc: dict) -> bool:
    """Whether a results document is the language model's (a run from before the workloads is the classifier's)."""
    return doc["base_config"].get("workload", "classifier") == "lm"


def config_line(doc: dict) -> str:
    """The base configuration in one phrase: the classifier's B, T, E, H, L, V; the language model's cell, B, bptt,
    E, H, L, V and dropout."""
    c = doc["base_config"]
    sizes = f"E {c['embed_dim']}, H {c['hidden_dim']}, L {c['layers']}, V {doc['vocab_size']}"
    if is_lm(doc):
        return (f"language model, {c['cell'].upper()}{' tied' if c['tied'] else ''}, B {c['batch_size']}, bptt "
                f"{c['bptt']} (evaluation: 10 columns), {sizes}, dropout {c['dropout']}, {c['optimizer']} lr "
                f"{c['lr']:g}, {c['dtype']}, corpus {c['data']}")
    return f"B {c['batch_size']}, T {c['seq_len']}, {sizes}, {c['dtype']}, corpus {corpus(c)}"


def base_rows(doc: dict) -> list[dict]:
    """The base configuration's rows that ran, grouped by tier (in TIERS' order), in the run's order within one."""
    rows = [r for r in doc["results"] if r["sweep"] is None and r["step_s"]]
    return sorted(rows, key=lambda r: list(plan.TIERS).index(r["tier"]))


def main_rows(doc: dict) -> list[list[str]]:
    """The main table: each base row that ran, by tier, with its kernel, parity, times, ratio and rates."""
    return [[r["tier"], label(r) + (" (fallback)" if r["fallback"] else ""), r["step"], kernel(r) if r["step"] ==
             "train" else "", parity_cell(r) if r["step"] == "train" else "", ms(r),
             f"{r['step_s']['p25'] * 1e3:.1f}–{r['step_s']['p75'] * 1e3:.1f}", ratio_cell(doc, r),
             f"{r['replicates']}×{r['rounds']}×{r['steps_per_round']}", fmt(r["compile_s"], ".2f"),
             fmt(r["first_step_s"], ".2f"), f"{r['samples_per_s']:.1f}", fmt(r["peak_mem_mb"], ".0f"),
             f"{r['executed_gflop_per_step']:.4g}", *rates(doc, r)] for r in base_rows(doc)]


def rates(doc: dict, r: dict) -> list[str]:
    """A row's executed and model GFLOP/s and its utilisation, the executed rate over the run's GEMM peak (float32
    rows only), computed from the FLOPs and the median, which every results.json holds."""
    executed, model = (r[k] / r["step_s"]["median"] for k in ("executed_gflop_per_step", "model_gflop_per_step"))
    peak = doc["gemm_peak"]["gflop_s"]
    util = executed / peak if peak and r["config"].get("dtype", "float32") == "float32" else None
    return [f"{executed:.1f}", f"{model:.1f}", fmt(util, ".1%")]


def parts_rows(doc: dict) -> list[list[str]]:
    """Per variant: the median of each part of the training step, their sum against the whole step, and each part's
    paired ratio against the baseline; the language model's also its decoder part (:data:`DECODER_COLUMNS`)."""
    out, lm = [], is_lm(doc)
    for r in (r for r in base_rows(doc) if r["step"] == "train" and r["parts"]):
        parts = [r["parts"][p]["median"] if r["parts"].get(p) else None for p in PARTS]
        total = sum(x for x in parts if x is not None)
        out.append([label(r), *(fmt(x and x * 1e3, ".1f") for x in parts), f"{total / r['step_s']['median']:.2f}",
                    *(ratio_cell(doc, {**r, "step": p}) for p in PARTS), *(decoder_cells(doc, r) if lm else ())])
    return out


def decoder_cells(doc: dict, r: dict) -> list[str]:
    """A language-model row's decoder part, the rest of forward + backward (embedding and recurrence), the decoder's
    share of forward + backward, and the paired ratios of both against the baseline (the rest's: of the medians)."""
    decoder, forward, backward = (r["parts"].get(p) and r["parts"][p]["median"] for p in ("decoder", "forward",
                                                                                        "backward"))
    if not (decoder and forward and backward):
        return ["–"] * len(DECODER_COLUMNS)
    rest = forward + backward - decoder
    base = next((x for x in base_rows(doc) if label(x) == BASELINE and x["step"] == "train" and x["parts"]), None)
    parts = base and base["parts"]
    base_rest = parts and all(parts.get(p) for p in ("decoder", "forward", "backward")) and (
        parts["forward"]["median"] + parts["backward"]["median"] - parts["decoder"]["median"])
    rest_ratio = ("baseline" if label(r) == BASELINE
                  else f"{base_rest / rest:.2f}× (medians)" if base_rest and rest > 0 else "–")
    return [f"{decoder * 1e3:.1f}", f"{rest * 1e3:.1f}", f"{decoder / (forward + backward):.0%}",
            ratio_cell(doc, {**r, "step": "decoder"}), rest_ratio]


def sweep_rows(doc: dict, name: str) -> list[list[str]]:
    """One row per (value, variant): time per step kind and the paired ratios with their intervals."""
    out = []
    for r in (r for r in doc["results"] if r["sweep"] and r["sweep"]["field"] == name and r["step"] == "train"):
        ev = next((x for x in doc["results"] if x["sweep"] == r["sweep"] and x["step"] == "eval"
                   and label(x) == label(r)), None)
        busy = sum(b["busy"] for b in doc["sweep_rounds"].get(f"{name}={r['sweep']['value']}", []))
        out.append([str(r["sweep"]["value"]), label(r), kernel(r), parity_cell(r),
                    ms(r) if r["step_s"] else r["status"], ratio_cell(doc, r), ms(ev), ratio_cell(doc, ev),
                    fmt(r["samples_per_s"], ".1f"), fmt(r["executed_gflop_per_step"], ".4g"),
                    f"{r['rounds']}" + (f" ({busy} busy)" if busy else "")]
                   + ([fmt(r.get("efficiency"), ".2f")] if name == "devices" else []))
    return out


def nnx_notes(doc: dict) -> list[str]:
    """Each Flax NNX row's overhead (a base row that measured it): what ``nnx.jit``'s graph traversal costs a training
    step, from the host times of one call under ``nnx.jit`` and through ``nnx.cached_partial``."""
    out = []
    for r in (r for r in doc["results"] if r["sweep"] is None and r.get("nnx_overhead_ms") is not None):
        calls = r["nnx_dispatch_ms"]
        out.append(f"{label(r)}: nnx.jit's graph traversal costs {r['nnx_overhead_ms']:.2f} ms a call on the model "
                   f"and its optimizer, the training step's included: a call of a function of them that computes "
                   f"nothing takes {calls['nnx.jit']:.2f} ms under nnx.jit, {calls['nnx.cached_partial']:.2f} ms "
                   f"through nnx.cached_partial (median of {DISPATCH_CALLS} alternated calls each)")
    return out


def bfloat16_speedups(doc: dict) -> dict[tuple[str, str], tuple[float, float, float]]:
    """A sweep of dtype: per (variant, step kind), its float32 time over its bfloat16 time (above 1: bfloat16 is
    faster) with its 95% interval. The two points are sessions of their own, so the ratio is unpaired: its median over
    each side's rounds (each the mean of its replicates), the interval a bootstrap of the two sides' rounds apart, one
    stream from seed 0 in the rows' order."""
    at = {(label(r), r["step"], r["sweep"]["value"]): r for r in doc["results"]
          if r["sweep"] and r["sweep"]["field"] == "dtype" and r["step_s"]}
    rng, out = np.random.default_rng(0), {}
    for (name, kind, value), r in at.items():
        other = at.get((name, kind, "float32"))
        if value != "bfloat16" or other is None:
            continue
        ratio, (low, high) = unpaired_ratio(*(round_means(y["round_s"]) for y in (other, r)), rng)
        out[name, kind] = (ratio, low, high)
    return out


def dtype_costs(doc: dict) -> list[str]:
    """:func:`bfloat16_speedups` as the report's sentences."""
    return [f"{name} {kind}: float32 ms / bfloat16 ms = {x:.2f}× [{lo:.2f}–{hi:.2f}] (unpaired: two sessions)"
            for (name, kind), (x, lo, hi) in bfloat16_speedups(doc).items()]


def render(doc: dict, charts: Sequence[str] = (), markdown: bool = False) -> str:
    """The whole report: stdout (``markdown=False``) or results.md."""
    s, e, p, q = doc["settings"], doc["environment"], doc["gemm_peak"], doc["parity"]
    notes = sorted({f"{label(r)}: {r['status']}: {r['error']}" for r in doc["results"]
                    if r["sweep"] is None and not r["step_s"] and r["status"] != "n/a"})  # n/a: in the headline
    notes += nnx_notes(doc)
    if p["gflop_s"]:
        notes.append(f"float32 GEMM peak (best of 8 n×n products per library): {p['gflop_s']:.1f} GFLOP/s by "
                     f"{p['backend']} [" + ", ".join(f"{k} {v['gflop_s']:.1f} ({v['device']}, n={v['n']}, "
                                                    f"{v['precision']})"
                                                    for k, v in p["measurements"].items()) + "]")
    base = q["losses"].get(q["baseline"])
    in_dtype = f", lr {LM_PARITY_LR:g}" if is_lm(doc) else ""  # the LM's: float32 rounding grows chaotically at lr 20
    parity = [f"parity over {q['steps']} training steps (same weights and batches, dropout 0{in_dtype}), max |Δloss| "
              "against "
              f"{q['baseline']} (step 1: {base[0]:.6f}, step {q['steps']}: {base[-1]:.6f}): "
              + ", ".join(f"{k} {v:.3g}" for k, v in q["max_abs_dloss"].items())
              if q["status"] == "ok" else f"parity: {q['status']}",
              f"ratios: {METHOD}; busy rounds (other processes > half the cores): "
              + ", ".join(f"{k} {sum(r['busy'] for r in v)}/{len(v)}" for k, v in doc["rounds"].items())
              + "; exec GFLOP: what the variant computes (benchmarks/flops.py); util = exec GFLOP/s ÷ the GEMM peak; "
              "model GFLOP/s: the model's FLOPs a second (MFU's count, above exec GFLOP/s where the fold saves work)"]
    for r in (r for r in doc["results"] if r["sweep"] is None and r["step"] == "train" and r["provenance"]
              and "dynamo" in r["provenance"]):
        info = r["provenance"]["dynamo"]
        parity.append(f"{label(r)}: Dynamo traced {info['frames_ok']} of {info['frames_total']} frames into "
                      f"{info['unique_graphs']} graph(s), {info['graph_breaks']} graph break(s); could not trace: "
                      f"{pairs(info['unimplemented']) or 'nothing'}")
    parity.append("kernel: torch, the LSTM op torch.profiler saw in a training step; JAX, the implementation and the "
                  "while loops over float arrays its compiled training step holds. A row whose kernel is not the "
                  "one its label promises is a fallback, kept out of the comparisons. parity: max |Δloss| against "
                  f"{BASELINE} over the parity steps (a bfloat16 row: against {REFERENCE}); (!) beyond its band "
                  + (f"(float32 {PARITY_TOL:g}, the language model's at lr {LM_PARITY_LR:g}: at the example's lr 20 "
                     "SGD amplifies float32 rounding ~10^4-fold within 20 steps)" if is_lm(doc) else
                     f"(float32 {PARITY_TOL:g}, bfloat16 {BFLOAT16_BAND:g})") + ", kept out of the tier sentences")
    # Everything the environment records: CPU, versions, threads, precision, XLA's setup, load.
    env = [f"{k}: {pairs(v) if isinstance(v, dict) else fmt(v, '.3g' if isinstance(v, float) else '')}"
           for k, v in e.items()]
    section = lambda title: ["", f"## {title}", ""] if markdown else ["", f"{title}:"]  # noqa: E731
    items = lambda lines: [("- " if markdown else "") + x for x in lines]  # noqa: E731
    title = "# LSTM twins benchmark: the word-level language model" if is_lm(doc) else "# LSTM twins benchmark"
    out = ([title, ""] if markdown else []) + [
        f"config: {config_line(doc)}; {s['replicates']} worker processes per variant, "
        f"{s['rounds']} paired rounds per step kind of {s['steps']} training, {s['eval_steps']} evaluation"
        + (f" and {s['parts_steps']} part-timed training steps (the first process)" if s["parts_steps"] else
           " steps (the training step's parts not timed: --parts-steps 1, or --full)")
        + f" per process, after the first step (reported apart) and {s['warmup']} warm-up steps"
        + "".join(f"; {k}: 1 training step per round" for k in doc["variants"] if k.endswith("-defaults"))]
    out += [("> **Warning:** " if markdown else "WARNING: ") + w for w in doc["warnings"]]
    columns = [("tokens/s" if is_lm(doc) and x == "samples/s" else x) for x in MAIN_COLUMNS]  # the LM's samples
    out += ["", table(columns, main_rows(doc), markdown), "", *items(doc["headline"]), "", *items(notes)]
    if parts_rows(doc):
        lm = is_lm(doc)
        out += [*section("Where the training step's time goes"), PARTS_METHOD + (" " + DECODER_METHOD if lm else ""),
                "", table(PARTS_COLUMNS + (DECODER_COLUMNS if lm else ()), parts_rows(doc), markdown)]
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


def twin_name(framework: str, dtype: str) -> str:
    """A twin in the report: its framework, and its dtype unless float32 (``torch``, ``torch bfloat16``)."""
    return framework if dtype == "float32" else f"{framework} {dtype}"


def convergence_tables(doc: dict) -> str:
    """Convergence mode's report: the per-epoch and per-run tables, the per-twin summary over seeds, each twin's
    bfloat16 beside its float32, and the baselines, in Markdown."""
    runs, target, summary = doc["runs"], doc["target"], doc["summary"]
    out = [f"Target validation accuracy: {target:.2f}; seeds {', '.join(map(str, doc['seeds']))}; "
           f"{doc['steps_per_epoch']} steps per epoch; times are training seconds (evaluation excluded), compilation "
           "apart. Test accuracy: the best-validation weights (--save-dir), as the trainers score it.", "",
           table(("twin", "seed", "epoch", "train loss", "val loss", "val acc", "train s"), [
               [r["twin"], r["seed"], e["epoch"], fmt(e["train_loss"], ".4f"), f"{e['val_loss']:.4f}",
                f"{e['val_accuracy']:.4f}", f"{e['train_s']:.1f}"] for r in runs for e in r["epochs"]], True), "",
           table(("twin", "seed", "test loss", "test acc", "compile s", "median step s", "train s",
                  f"time to val acc {target:.2f}"), [
               [r["twin"], r["seed"], f"{r['test_loss']:.4f}", f"{r['test_accuracy']:.4f}",
                f"{r['compile_s']:.2f}", f"{r['median_step_s']:.3f}", f"{r['train_s']:.1f}",
                fmt(r["time_to_target_s"], ".1f") + " s"] for r in runs], True), "",
           table(("twin", "test acc (mean ± std over seeds)", "train s (mean)", "time to target (mean)", "reached"), [
               [fw, f"{summary[fw]['test_accuracy_mean']:.4f} ± {summary[fw]['test_accuracy_std']:.4f}",
                f"{summary[fw]['train_s_mean']:.1f}", fmt(summary[fw]["time_to_target_s_mean"], ".1f") + " s",
                summary[fw]["reached_target"]] for fw in doc["twins"]], True)]
    verdict = {True: "yes", False: "no", None: "n/a (one seed: no spread to compare with)"}
    for key in (k for k in summary if k.startswith("agreement")):
        out += ["", f"Test-accuracy gap between the twins{key.removeprefix('agreement')}: "
                f"{summary[key]['test_accuracy_gap']:.4f}; within one standard deviation: "
                f"{verdict[summary[key]['within_one_std']]}."]
    low = [d for d in doc["dtypes"] if d != "float32"]
    if low:  # each twin's lower precision beside its float32, means over seeds
        beside = [(fw, summary[fw], summary[twin_name(fw, d)], d) for fw in doc["frameworks"] for d in low]
        out += ["", "Each twin in bfloat16 beside its float32 (means over seeds; the same seed's weights, batches and "
                "dropout draws in both; val acc: the last evaluation's):", "", table(
                    ("twin", "dtype", "val acc float32", "val acc", "Δ val acc", "test acc float32", "test acc",
                     "Δ test acc", "train s float32", "train s"), [
                        [fw, d, fmt(a["val_accuracy_mean"], ".4f"), fmt(b["val_accuracy_mean"], ".4f"),
                         fmt(b["val_accuracy_mean"] - a["val_accuracy_mean"], "+.4f"), f"{a['test_accuracy_mean']:.4f}",
                         f"{b['test_accuracy_mean']:.4f}", f"{b['test_accuracy_mean'] - a['test_accuracy_mean']:+.4f}",
                         f"{a['train_s_mean']:.1f}", f"{b['train_s_mean']:.1f}"] for fw, a, b, d in beside], True)]
    if doc["baselines"]:
        out += ["", "Classical baselines on the same split (context, not twins):", "", table(
            ("model", "val acc", "test acc"), [[b["model"], f"{b['val_accuracy']:.4f}", f"{b['test_accuracy']:.4f}"]
                                               for b in doc["baselines"]], True)]
    return "\n".join(out)

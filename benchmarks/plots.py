"""PNG charts of a results document (matplotlib's Agg backend: no display needed)."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.plan import BASELINE  # noqa: E402
from benchmarks.results import PARTS  # noqa: E402
from benchmarks.tables import label  # noqa: E402

COLORS = {"torch": "#ee4c2c", "jax": "#3d7ebf", "torch:eager-defaults": "#f4a582", "jax:nofold": "#1b9e77",
          "jax:cudnn": "#7570b3", "jax:scan": "#66a61e", "jax:flax": "#e7298a"}


def _color(name: str) -> str:
    return COLORS.get(name, COLORS.get(name.split(":")[0], "gray"))


def _save(fig, path: Path, title: str) -> Path:
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _spread(rows: list[dict]) -> tuple[list[float], list[list[float]]]:
    """Rows' median ms and their p25–p75 as error-bar lengths."""
    ms = [r["step_s"]["median"] * 1e3 for r in rows]
    return ms, [[m - r["step_s"]["p25"] * 1e3 for m, r in zip(ms, rows)],
                [r["step_s"]["p75"] * 1e3 - m for m, r in zip(ms, rows)]]


def time_per_step(doc: dict, path: Path) -> Path | None:
    """Median time per step by variant (bars: p25–p75 over rounds), training and inference side by side."""
    rows = [r for r in doc["results"] if r["sweep"] is None and r["step_s"]]
    if not rows:
        return None
    labels = list(dict.fromkeys(label(r) for r in rows))
    c = doc["base_config"]
    lm = c.get("workload", "classifier") == "lm"  # a run from before the workloads is the classifier's
    optimizer = {"sgd": "SGD", "adam": "Adam"}[c.get("optimizer", "adam")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.6 * len(labels) + 2))
    for ax, kind in zip(axes, ("train", "eval")):
        own = [r for r in rows if r["step"] == kind]
        at, (ms, err) = [labels.index(label(r)) for r in own], _spread(own)
        ax.barh(at, ms, xerr=err, color=[_color(labels[i]) for i in at], capsize=4)
        for i, m, e in zip(at, ms, err[1]):
            ax.text(m + e, i - 0.3, f" {m:.1f}", va="center", fontsize=8)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set(xlabel="ms per step (median over rounds, bars p25–p75)",
               title={"train": f"training step (fwd + bwd + clip + {optimizer})", "eval": "inference step"}[kind])
    length = f"bptt {c['bptt']}" if lm else f"T {c['seq_len']}"
    return _save(fig, path, f"B {c['batch_size']}  {length}  E {c['embed_dim']}  H {c['hidden_dim']}  "
                 f"L {c['layers']}  on {doc['environment']['cpu_model']}")


def time_parts(doc: dict, path: Path) -> Path | None:
    """Each variant's training step as stacked bars of its parts (forward, backward, optimizer; medians), beside the
    whole step's median."""
    rows = [r for r in doc["results"] if r["sweep"] is None and r["step"] == "train" and r["parts"] and r["step_s"]]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.8))
    left = [0.0] * len(rows)
    for part, color in zip(PARTS, ("#8da0cb", "#fc8d62", "#66c2a5")):
        ms = [(r["parts"][part] or {}).get("median", 0.0) * 1e3 for r in rows]
        ax.barh(range(len(rows)), ms, left=left, color=color, label=part)
        left = [a + b for a, b in zip(left, ms)]
    decoder = [(r["parts"].get("decoder") or {}).get("median", 0.0) * 1e3 for r in rows]  # the LM's
    if any(decoder):  # a thin bar under each: the decoder and its loss, timed alone, inside forward + backward
        ax.barh([i + 0.32 for i in range(len(rows))], decoder, height=0.15, color="#555555",
                label="decoder + loss, fwd + bwd (inside those)")
    ax.scatter([r["step_s"]["median"] * 1e3 for r in rows], range(len(rows)), marker="|", s=300, color="black",
               label="whole step", zorder=3)
    ax.set_yticks(range(len(rows)), [label(r) for r in rows])
    ax.invert_yaxis()
    ax.set(xlabel="ms (medians over rounds)", title="where the training step's time goes")
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path, "")


def parity_curves(doc: dict, path: Path) -> Path | None:
    """Every variant's training losses from the same weights on the same batches, and its |Δloss| against the
    baseline per step below."""
    p = doc["parity"]
    if p["status"] != "ok":
        return None
    fig, (top, low) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    reference = p["baseline"]  # the baseline's losses, in float32 for a bfloat16 run
    steps, base = range(1, p["steps"] + 1), p["losses"][reference]
    lm = doc["base_config"].get("workload", "classifier") == "lm"  # its parity steps run in float64
    # Exact agreement (0) cannot sit on a log axis: shown at a floor below the rounding of a loss of ~1 (float32's;
    # the language model's float64).
    floor = 1e-16 if lm else 1e-9
    top.plot(steps, base, lw=3, alpha=0.5, color=_color(BASELINE), label=reference)
    for name, losses in ((k, v) for k, v in p["losses"].items() if k != reference):
        top.plot(steps, losses, lw=1.2, ls="--", marker=".", color=_color(name), label=name)
        low.semilogy(steps, [max(abs(a - b), floor) for a, b in zip(base, losses)], marker=".", color=_color(name))
    top.set(ylabel="cross-entropy per token" if lm else "BCE loss", title="training loss, same weights and batches, "
            f"dropout 0{', float64' if lm else ''}\nmax |Δloss| vs "
            f"{reference}: " + ", ".join(f"{k} {v:.3g}" for k, v in p["max_abs_dloss"].items()))
    top.legend(fontsize=8)
    worst = max(p["max_abs_dloss"].values())  # status ok: at least one variant beside the reference
    low.set(ylabel="|Δloss|", ylim=(floor / 2, max(1e-5, worst * 3)), xlabel="training step")
    return _save(fig, path, "")


def sweep_chart(doc: dict, field: str, path: Path) -> Path | None:
    """Time per training step against the swept value per variant (bars: p25–p75 over rounds), and each variant's
    paired speed-up over the baseline with its 95% interval (training: dots, inference: squares)."""
    rows = [r for r in doc["results"] if r["sweep"] and r["sweep"]["field"] == field and r["step_s"]]
    if not rows or not all(isinstance(r["sweep"]["value"], (int, float)) for r in rows):
        return None
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(label(r) for r in rows):
        own = sorted((r for r in rows if label(r) == name and r["step"] == "train"), key=lambda r: r["sweep"]["value"])
        (ms, err), at = _spread(own), [r["sweep"]["value"] for r in own]
        ax_t.errorbar(at, ms, yerr=err, marker="o", capsize=3, label=name, color=_color(name))
        if field == "devices" and own:  # linear scaling from the smallest count: time × smallest / N
            ax_t.plot(at, [ms[0] * at[0] / n for n in at], ":", color=_color(name))
    for c in (c for c in doc["comparisons"] if c["sweep"] and c["sweep"]["field"] == field):
        train = c["step"] == "train"
        ax_r.errorbar([c["sweep"]["value"] * (1 if train else 1.05)], [c["ratio"]], capsize=3,
                      yerr=[[c["ratio"] - c["ci95"][0]], [c["ci95"][1] - c["ratio"]]], color=_color(c["variant"]),
                      marker="o" if train else "s", mfc=None if train else "none",
                      label=c["variant"] if train and c["sweep"]["value"] == rows[0]["sweep"]["value"] else None)
    ax_r.axhline(1.0, color="gray", ls=":")
    values = sorted({r["sweep"]["value"] for r in rows})
    for ax in (ax_t, ax_r):
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
        ax.minorticks_off()
        ax.set_xlabel(field)
        ax.legend(fontsize=8)
    ax_t.set(ylabel="ms per training step (median over rounds)", yscale="log")
    ax_r.set(ylabel=f"speed-up over {BASELINE}, 95% CI (o train, □ eval)")
    linear = ", dotted: linear scaling" if field == "devices" else ""
    return _save(fig, path, f"sweep of {field} (others at the base configuration{linear}), "
                 f"{doc['environment']['cpu_model']}")


def convergence_curves(doc: dict, path: Path) -> Path:
    """Validation accuracy against epoch and against training time, one line per (twin, seed)."""
    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for run in doc["runs"]:
        low = run.get("dtype", "float32") != "float32"  # a lower precision: dashed, beside its float32
        kw = dict(color=COLORS.get(run["framework"]), alpha=0.8, label=f"{run.get('twin', run['framework'])} seed "
                  f"{run['seed']}", linestyle="--" if low else "-")
        by_epoch.plot([e["epoch"] for e in run["epochs"]], [e["val_accuracy"] for e in run["epochs"]],
                      "s" if low else "o", **kw)
        by_time.plot([c["train_s"] for c in run["val_curve"]], [c["val_accuracy"] for c in run["val_curve"]], ".", **kw)
    for ax, xlabel in ((by_epoch, "epoch"), (by_time, "training seconds (compilation excluded)")):
        ax.axhline(doc["target"], color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel=xlabel, ylabel="validation accuracy")
    by_epoch.legend(fontsize=8)
    return _save(fig, path, "Convergence: same recipe, initial weights and batch order; each framework's own dropout")


def write_charts(doc: dict, out: Path) -> list[str]:
    """Every chart that has data; the file names written."""
    made = [time_per_step(doc, out / "time_per_step.png"), time_parts(doc, out / "time_parts.png"),
            parity_curves(doc, out / "parity_loss.png")]
    made += [sweep_chart(doc, s["field"], out / f"sweep_{s['field']}.png") for s in doc["settings"]["sweeps"]]
    return [p.name for p in made if p]

"""PNG charts of a results document (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"torch": "#ee4c2c", "jax": "#3d7ebf"}


def _ok(rows):
    return [r for r in rows if r["status"] == "ok"]


def time_per_step(doc: dict, path: Path) -> Path | None:
    """Median time per step by variant, training and inference side by side, p25–p75 as error bars."""
    rows = _ok([r for r in doc["results"] if r["sweep"] is None])
    if not rows:
        return None
    labels = list(dict.fromkeys(f"{r['framework']}:{r['variant']}" for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.6 * len(labels) + 2), squeeze=False)
    for ax, step in zip(axes[0], ("train", "eval")):
        for i, label in enumerate(labels):
            r = next((r for r in rows if f"{r['framework']}:{r['variant']}" == label and r["step"] == step), None)
            if r is None:
                continue
            s = r["step_s"]
            ms = [s["median"] * 1e3]
            err = [[(s["median"] - s["p25"]) * 1e3], [(s["p75"] - s["median"]) * 1e3]]
            ax.barh([i], ms, xerr=err, color=COLORS.get(r["framework"], "gray"), capsize=4)
            ax.text(s["p75"] * 1e3, i - 0.3, f" {ms[0]:.1f}", va="center", fontsize=8)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("ms per step (median, bars p25–p75)")
        ax.set_title({"train": "training step (fwd + bwd + clip + Adam)", "eval": "inference step"}[step])
    c = doc["base_config"]
    fig.suptitle(f"B {c['batch_size']}  T {c['seq_len']}  E {c['embed_dim']}  H {c['hidden_dim']}  "
                 f"L {c['layers']}  on {doc['environment'].get('cpu_model', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parity_curves(doc: dict, path: Path) -> Path | None:
    """Both twins' training losses from the same weights on the same batches, overlaid."""
    p = doc["parity"]
    if not p["losses"]:
        return None
    both = p["max_abs_dloss"] is not None
    fig, axes = plt.subplots(2 if both else 1, 1, figsize=(7, 5.5 if both else 4), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3]} if both else None)
    ax = axes[0][0]
    styles = {"torch": dict(lw=3, alpha=0.5), "jax": dict(lw=1.2, ls="--", marker=".")}
    for framework, losses in p["losses"].items():
        ax.plot(range(1, len(losses) + 1), losses, label=framework, color=COLORS.get(framework),
                **styles.get(framework, {}))
    title = "training loss, same weights and batches, dropout 0"
    if both:
        title += f"\nmax |Δloss| = {p['max_abs_dloss']:.3g}"
    ax.set(ylabel="BCE loss", title=title)
    ax.legend()
    if both:
        diff = [abs(a - b) for a, b in zip(p["losses"]["torch"], p["losses"]["jax"])]
        low = axes[1][0]
        # Exact agreement (0) cannot sit on a log axis: show it at a floor below float32 rounding of ~1.
        low.semilogy(range(1, len(diff) + 1), [max(d, 1e-9) for d in diff], marker=".", color="gray")
        low.set(ylabel="|Δloss|", ylim=(5e-10, max(1e-5, max(diff) * 3)))
    axes[-1][0].set_xlabel("training step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_chart(doc: dict, field: str, path: Path) -> Path | None:
    """Training step time and achieved GFLOP/s against the swept value, one line per twin."""
    base = doc["base_config"]
    main = {k for k in doc["variants"] if k in ("torch:eager", "jax:jit")}
    fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(11, 4))
    drew = False
    for label in sorted(main):
        framework, variant = label.split(":")
        points = []
        for r in _ok(doc["results"]):
            if r["step"] != "train" or r["framework"] != framework or r["variant"] != variant:
                continue
            if r["sweep"] is not None and r["sweep"]["field"] == field:
                points.append((r["sweep"]["value"], r))
            elif r["sweep"] is None:
                points.append((base[field], r))
        if not points or not all(isinstance(v, (int, float)) for v, _ in points):
            continue
        points.sort(key=lambda p: p[0])
        xs = [v for v, _ in points]
        med = [r["step_s"]["median"] * 1e3 for _, r in points]
        lo = [(r["step_s"]["median"] - r["step_s"]["p25"]) * 1e3 for _, r in points]
        hi = [(r["step_s"]["p75"] - r["step_s"]["median"]) * 1e3 for _, r in points]
        ax_t.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=label, color=COLORS.get(framework))
        ax_f.plot(xs, [r["achieved_gflop_s"] for _, r in points], marker="o", label=label,
                  color=COLORS.get(framework))
        drew = True
    if not drew:
        plt.close(fig)
        return None
    values = sorted({v for v in [base[field], *next(s["values"] for s in doc["settings"]["sweeps"]
                                                   if s["field"] == field)] if isinstance(v, (int, float))})
    for ax in (ax_t, ax_f):
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
        ax.minorticks_off()
        ax.set_xlabel(field)
        ax.legend()
    ax_t.set_ylabel("ms per training step (median, p25–p75)")
    ax_t.set_yscale("log")
    ax_f.set_ylabel("achieved model GFLOP/s")
    if doc["gemm_peak_gflop_s"]:
        ax_f.axhline(doc["gemm_peak_gflop_s"], color="gray", ls=":", label="GEMM peak")
        ax_f.legend()
    fig.suptitle(f"sweep of {field} (other settings at the base configuration)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_charts(doc: dict, out: Path) -> list[str]:
    """Every chart that has data; returns the file names written."""
    made = [time_per_step(doc, out / "time_per_step.png"), parity_curves(doc, out / "parity_loss.png")]
    for sweep in doc["settings"]["sweeps"]:
        made.append(sweep_chart(doc, sweep["field"], out / f"sweep_{sweep['field']}.png"))
    return [p.name for p in made if p is not None]

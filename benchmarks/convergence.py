"""Convergence mode: does the same recipe reach the same quality in the same wall time in both twins?

    python benchmarks/bench.py --mode convergence [--seeds 0,1] [--target 0.85] [--quick]

Each (seed, twin) pair is one real training run of the twin's own command line (``python -m
<twin>.train``), with the seed's recipe, dropout on (each framework with its own RNG), the same initial
weights and the same batch order for a given seed. The runs' metrics JSONL (one record per step and per
validation, each with the cumulative training seconds, evaluation excluded) gives the learning curves:
per-epoch train loss, validation loss and accuracy, wall time with the first step (compilation) apart,
time-to-accuracy, and the final test loss and accuracy. Classical baselines on the same split put the
numbers in context.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from common.config import Config, field_names, to_argv
from common.data import prepare_data
from common.errors import ConfigError
from common.metrics import evaluations, read_metrics, training_steps

TWIN_MODULES = {"torch": "torch_impl.train", "jax": "jax_impl.train"}
QUICK_CONFIG = dict(embed_dim=16, hidden_dim=16, seq_len=40, epochs=2, max_steps=0)
QUICK_MAX_TEXTS = 2000  # --quick trains on a slice of the corpus (see quick_corpus)
# Flags the convergence runner sets itself on every run (the files group: it writes only the metrics log).
RUNNER_FIELDS = (*field_names("files"), "seed", "log_every", "progress", "max_steps")


@dataclass(frozen=True)
class RunResult:
    framework: str
    seed: int
    records: list[dict[str, Any]]
    wall_s: float  # the whole subprocess, data loading and evaluation included

    def of(self, split: str) -> list[dict[str, Any]]:
        return evaluations(self.records, split)

    @property
    def steps(self) -> list[dict[str, Any]]:
        return training_steps(self.records)


def parse_seeds(spec: str) -> list[int]:
    try:
        seeds = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds takes a comma list of integers, got {spec!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds takes distinct non-negative integers, got {spec!r}")
    return seeds


def run_twin(framework: str, cfg: Config, seed: int, out: Path, eval_every: int, timeout_s: float) -> RunResult:
    """Train one twin for one seed in a subprocess; its metrics JSONL is the result."""
    metrics = out / "runs" / f"{framework}-seed{seed}.jsonl"
    metrics.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", TWIN_MODULES[framework], *to_argv(cfg, exclude=RUNNER_FIELDS),
            "--seed", str(seed), "--metrics-out", str(metrics), "--log-every", str(eval_every), "--no-progress"]
    tic = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              cwd=Path(__file__).resolve().parents[1], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        raise ConfigError(f"the {framework} run (seed {seed}) took longer than --timeout {timeout_s:.0f}s") from None
    wall = time.perf_counter() - tic
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(f"the {framework} run (seed {seed}) failed: {last}")
    return RunResult(framework, seed, read_metrics(metrics), wall)


def summarise_run(run: RunResult, steps_per_epoch: int, target: float) -> dict[str, Any]:
    """Per-epoch curves and the run's headline numbers."""
    steps = run.steps
    first_step_s = steps[0]["train_seconds"] if steps else 0.0
    later = [b["train_seconds"] - a["train_seconds"] for a, b in zip(steps, steps[1:])]
    median_step_s = statistics.median(later) if later else 0.0
    compile_s = max(first_step_s - median_step_s, 0.0)  # what the first step cost beyond an ordinary one
    epochs = []
    for val in run.of("val"):
        if val["step"] % steps_per_epoch and val["step"] != steps[-1]["step"]:
            continue  # a mid-epoch validation: on the time curve, not an epoch row
        epoch_steps = [s["loss"] for s in steps
                       if val["step"] - steps_per_epoch < s["step"] <= val["step"] and s["loss"] is not None]
        epochs.append({"epoch": len(epochs) + 1, "step": val["step"],
                       "train_loss": statistics.fmean(epoch_steps) if epoch_steps else None,
                       "val_loss": val["loss"], "val_accuracy": val["accuracy"],
                       "train_s": val["train_seconds"] - compile_s})
    curve = [{"step": v["step"], "train_s": v["train_seconds"] - compile_s, "val_accuracy": v["accuracy"],
              "val_loss": v["loss"]} for v in run.of("val")]
    reached = next((c for c in curve if c["val_accuracy"] >= target), None)
    test = run.of("test")[-1]
    return {"framework": run.framework, "seed": run.seed, "compile_s": compile_s, "median_step_s": median_step_s,
            "train_s": (steps[-1]["train_seconds"] - compile_s) if steps else 0.0, "wall_s": run.wall_s,
            "epochs": epochs, "val_curve": curve, "test_loss": test["loss"], "test_accuracy": test["accuracy"],
            "time_to_target_s": reached["train_s"] if reached else None,
            "steps_to_target": reached["step"] if reached else None}


def aggregate(runs: Sequence[dict[str, Any]], frameworks: Sequence[str]) -> dict[str, Any]:
    """Mean and spread of each twin's headline numbers over seeds, and whether the twins agree within one
    standard deviation (the seeds' spread is the noise one run's accuracy carries)."""
    out: dict[str, Any] = {}
    for fw in frameworks:
        mine = [r for r in runs if r["framework"] == fw]
        acc = [r["test_accuracy"] for r in mine]
        ttt = [r["time_to_target_s"] for r in mine if r["time_to_target_s"] is not None]
        out[fw] = {"seeds": [r["seed"] for r in mine], "test_accuracy_mean": statistics.fmean(acc),
                   "test_accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                   "test_loss_mean": statistics.fmean(r["test_loss"] for r in mine),
                   "train_s_mean": statistics.fmean(r["train_s"] for r in mine),
                   "compile_s_mean": statistics.fmean(r["compile_s"] for r in mine),
                   "time_to_target_s_mean": statistics.fmean(ttt) if ttt else None,
                   "reached_target": f"{len(ttt)}/{len(mine)}"}
    if len(frameworks) == 2:
        a, b = (out[fw] for fw in frameworks)
        spread = max(a["test_accuracy_std"], b["test_accuracy_std"])
        gap = abs(a["test_accuracy_mean"] - b["test_accuracy_mean"])
        out["agreement"] = {"test_accuracy_gap": gap, "larger_std": spread,
                            "within_one_std": bool(gap <= spread) if spread > 0 else None}
    return out


def classical_baselines(cfg: Config) -> list[dict[str, Any]]:
    """TF-IDF character 1–2-gram logistic regression and multinomial naive Bayes on the same split (needs the
    optional scikit-learn; an empty list without it)."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.naive_bayes import MultinomialNB
    except ImportError:
        print("note: scikit-learn not installed: classical baselines skipped (pip install '.[baselines]')",
              file=sys.stderr)
        return []
    data = prepare_data(cfg)
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    x_train = vectorizer.fit_transform(data.train.texts)
    x_val, x_test = vectorizer.transform(data.val.texts), vectorizer.transform(data.test.texts)
    rows = []
    for name, model in (("tfidf-char12 + logistic regression", LogisticRegression(C=4.0, max_iter=2000)),
                        ("tfidf-char12 + multinomial naive Bayes", MultinomialNB(alpha=0.1))):
        tic = time.perf_counter()
        model.fit(x_train, data.train.labels)
        rows.append({"model": name, "val_accuracy": float(model.score(x_val, data.val.labels)),
                     "test_accuracy": float(model.score(x_test, data.test.labels)), "fit_s": time.perf_counter() - tic})
    return rows


def quick_corpus(cfg: Config, out: Path) -> Config:
    """--quick: a seeded slice of the corpus, written as a TSV the twins read like any user's file."""
    import numpy as np

    from common.corpus import load_corpus

    texts, labels = load_corpus(cfg.data, cfg.pos, cfg.neg, cfg.text_column, cfg.label_column)
    keep = np.random.default_rng(0).permutation(len(texts))[:QUICK_MAX_TEXTS]
    path = out / "quick-corpus.tsv"
    with open(path, "w", encoding="utf-8") as f:
        f.write("text\tlabel\n")
        for i in sorted(keep):
            f.write(" ".join(texts[i].split()) + f"\t{labels[i]}\n")  # one line per text, no tabs inside
    return cfg.replace(data=str(path), pos=None, neg=None, text_column="text", label_column="label")


def run_convergence(cfg: Config, frameworks: Sequence[str], seeds: Sequence[int], target: float, out: Path,
                    eval_every: int, timeout_s: float, progress: bool = True) -> dict[str, Any]:
    """Train every (seed, twin) pair and build the results document (see the README's schema)."""
    from tqdm import tqdm

    from common.batches import num_train_batches

    if not 0.0 < target <= 1.0:
        raise ConfigError(f"--target is a validation accuracy in (0, 1], got {target}")
    data = prepare_data(cfg)
    steps_per_epoch = num_train_batches(len(data.train), cfg.batch_size)
    summaries = []
    pairs = [(seed, fw) for seed in seeds for fw in frameworks]
    for seed, fw in tqdm(pairs, desc="convergence runs", unit="run", disable=not progress, file=sys.stderr):
        summaries.append(summarise_run(run_twin(fw, cfg, seed, out, eval_every, timeout_s), steps_per_epoch, target))
    return {"mode": "convergence", "config": cfg.to_dict(), "seeds": list(seeds), "frameworks": list(frameworks),
            "target": target, "steps_per_epoch": steps_per_epoch, "eval_every": eval_every,
            "split_sizes": {"train": len(data.train), "val": len(data.val), "test": len(data.test)},
            "runs": summaries, "summary": aggregate(summaries, frameworks), "baselines": classical_baselines(cfg)}


def _fmt(value: float | None, pattern: str) -> str:
    return "—" if value is None else format(value, pattern)


def markdown_tables(doc: dict[str, Any]) -> str:
    """The per-run table, the per-twin summary over seeds, and the baselines, in Markdown."""
    lines = [f"Target validation accuracy: {doc['target']:.2f}; seeds {', '.join(map(str, doc['seeds']))}; "
             f"{doc['steps_per_epoch']} steps per epoch; times are training seconds (evaluation excluded), "
             "compilation apart.", "",
             "| twin | seed | epoch | train loss | val loss | val acc | train s |", "|---|---|---|---|---|---|---|"]
    for run in doc["runs"]:
        for e in run["epochs"]:
            lines.append(f"| {run['framework']} | {run['seed']} | {e['epoch']} | {_fmt(e['train_loss'], '.4f')} | "
                         f"{e['val_loss']:.4f} | {e['val_accuracy']:.4f} | {e['train_s']:.1f} |")
    lines += ["", "| twin | seed | test loss | test acc | compile s | median step s | train s | "
                  f"time to val acc {doc['target']:.2f} |", "|---|---|---|---|---|---|---|---|"]
    for run in doc["runs"]:
        lines.append(f"| {run['framework']} | {run['seed']} | {run['test_loss']:.4f} | {run['test_accuracy']:.4f} | "
                     f"{run['compile_s']:.2f} | {run['median_step_s']:.3f} | {run['train_s']:.1f} | "
                     f"{_fmt(run['time_to_target_s'], '.1f')} s |")
    lines += ["", "| twin | test acc (mean ± std over seeds) | train s (mean) | time to target (mean) | reached |",
              "|---|---|---|---|---|"]
    for fw in doc["frameworks"]:
        s = doc["summary"][fw]
        lines.append(f"| {fw} | {s['test_accuracy_mean']:.4f} ± {s['test_accuracy_std']:.4f} | "
                     f"{s['train_s_mean']:.1f} | {_fmt(s['time_to_target_s_mean'], '.1f')} s | {s['reached_target']} |")
    agreement = doc["summary"].get("agreement")
    if agreement:
        verdict = {True: "yes", False: "no", None: "n/a (one seed: no spread to compare with)"}[
            agreement["within_one_std"]]
        lines += ["", f"Test-accuracy gap between the twins: {agreement['test_accuracy_gap']:.4f}; "
                      f"within one standard deviation: {verdict}."]
    if doc["baselines"]:
        lines += ["", "Classical baselines on the same split (context, not twins):", "",
                  "| model | val acc | test acc |", "|---|---|---|"]
        lines += [f"| {b['model']} | {_fmt(b.get('val_accuracy'), '.4f')} | {b['test_accuracy']:.4f} |"
                  for b in doc["baselines"]]
    return "\n".join(lines)


def write_curves(doc: dict[str, Any], out: Path) -> list[str]:
    """Validation accuracy against epoch and against training time, both twins overlaid (one line per run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"torch": "tab:red", "jax": "tab:blue"}
    for run in doc["runs"]:
        label = f"{run['framework']} seed {run['seed']}"
        colour = colours.get(run["framework"])
        by_epoch.plot([e["epoch"] for e in run["epochs"]], [e["val_accuracy"] for e in run["epochs"]], "o-",
                      color=colour, alpha=0.8, label=label)
        by_time.plot([c["train_s"] for c in run["val_curve"]], [c["val_accuracy"] for c in run["val_curve"]], ".-",
                     color=colour, alpha=0.8, label=label)
    for ax, xlabel in ((by_epoch, "epoch"), (by_time, "training seconds (compilation excluded)")):
        ax.axhline(doc["target"], color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
    by_epoch.legend(fontsize=8)
    fig.suptitle("Convergence: same recipe, same initial weights and batch order, each framework's own dropout")
    fig.tight_layout()
    name = "convergence.png"
    fig.savefig(out / name, dpi=120)
    plt.close(fig)
    return [name]

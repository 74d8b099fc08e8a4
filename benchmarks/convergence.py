"""Convergence mode: does the same recipe reach the same quality in the same wall time in both twins? Each (seed,
twin) pair is one real run of the twin's trainer, from the same initial weights and batch order per seed, dropout
on; its metrics give the learning curves, time-to-accuracy, and the test scores of the best-validation weights.
Under ``--dtype bfloat16`` each twin also trains in float32 from the same weights, batches and dropout draws, and the
report sets each twin's bfloat16 accuracy beside its float32 one."""
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks import plots, processes, schema
from benchmarks.harness import outcome
from benchmarks.render import convergence_tables, twin_name
from common.batches import num_train_batches
from common.config import Config
from common.data import SPLITS, Dataset, prepare_data
from common.errors import ConfigError
from common.metrics import evaluations, read_metrics, training_steps

QUICK_CONFIG = dict(embed_dim=16, hidden_dim=16, seq_len=40, epochs=2)
QUICK_MAX_TEXTS = 2000  # --quick trains on a seeded slice of the corpus


@dataclass(frozen=True)
class RunResult:
    framework: str
    seed: int
    records: list[dict[str, Any]]  # the run's metrics JSONL
    wall_s: float  # the whole run in its worker, data loading and evaluation included
    dtype: str = "float32"


def run_twin(framework: str, cfg: Config, seed: int, out: Path, timeout_s: float) -> RunResult:
    """Train one twin for one seed with its trainer, in a worker of its own; ``save_dir`` makes the trainer score
    the test split with the best-validation weights."""
    metrics = out / "runs" / f"{twin_name(framework, cfg.dtype).replace(' ', '-')}-seed{seed}.jsonl"
    metrics.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="best-") as best:
        # overwrite: the bench has already refused an --out holding results unless it was told to replace them
        run = cfg.replace(seed=seed, progress=False, metrics_out=str(metrics), save_dir=best, overwrite=True)
        worker = processes.Worker(framework, processes.worker_environ(processes.usable_cpus(), cfg.device, best),
                                  metrics.parent)
        tic = time.perf_counter()
        try:
            worker.send({"op": "train", "config": run.to_dict(), "threads": processes.usable_cpus()})
            reply, wall_s = worker.receive(timeout_s), time.perf_counter() - tic
        finally:
            worker.close()
    status, message = outcome(reply)
    if status != "ok":
        raise ConfigError(f"the {framework} run (seed {seed}) failed: {message}")
    return RunResult(framework, seed, read_metrics(metrics), wall_s, cfg.dtype)


def summarise_run(run: RunResult, steps_per_epoch: int, target: float) -> dict[str, Any]:
    """Per-epoch curves and the run's headline numbers."""
    steps, vals = training_steps(run.records), evaluations(run.records, "val")
    first_step_s = steps[0]["train_seconds"] if steps else 0.0
    later = [b["train_seconds"] - a["train_seconds"] for a, b in zip(steps, steps[1:])]
    median_step_s = statistics.median(later) if later else 0.0
    compile_s = max(first_step_s - median_step_s, 0.0)  # what the first step cost beyond an ordinary one
    epochs = []
    for val in vals:
        if val["step"] % steps_per_epoch and val["step"] != steps[-1]["step"]:
            continue  # a mid-epoch validation: on the time curve, not an epoch row
        epoch_steps = [s["loss"] for s in steps
                       if val["step"] - steps_per_epoch < s["step"] <= val["step"] and s["loss"] is not None]
        epochs.append({"epoch": len(epochs) + 1, "step": val["step"],
                       "train_loss": statistics.fmean(epoch_steps) if epoch_steps else None,
                       "val_loss": val["loss"], "val_accuracy": val["accuracy"],
                       "train_s": val["train_seconds"] - compile_s})
    curve = [{"step": v["step"], "train_s": v["train_seconds"] - compile_s, "val_accuracy": v["accuracy"],
              "val_loss": v["loss"]} for v in vals]
    reached = next((c for c in curve if c["val_accuracy"] >= target), None)
    test = evaluations(run.records, "test")[-1]
    return {"framework": run.framework, "dtype": run.dtype, "twin": twin_name(run.framework, run.dtype),
            "seed": run.seed, "compile_s": compile_s, "median_step_s": median_step_s,
            "train_s": (steps[-1]["train_seconds"] - compile_s) if steps else 0.0, "wall_s": run.wall_s,
            "epochs": epochs, "val_curve": curve, "test_loss": test["loss"], "test_accuracy": test["accuracy"],
            "time_to_target_s": reached["train_s"] if reached else None,
            "steps_to_target": reached["step"] if reached else None}


def aggregate(runs: Sequence[dict[str, Any]], twins: Sequence[str]) -> dict[str, Any]:
    """Mean and spread of each twin's (:func:`twin_name`) headline numbers over seeds, and whether the two frameworks
    agree within one standard deviation (the seeds' spread is the noise one run's accuracy carries): ``agreement``
    in float32, ``agreement bfloat16`` between the bfloat16 twins."""
    out: dict[str, Any] = {}
    for fw in twins:
        mine = [r for r in runs if r.get("twin", r["framework"]) == fw]
        acc = [r["test_accuracy"] for r in mine]
        ttt = [r["time_to_target_s"] for r in mine if r["time_to_target_s"] is not None]
        out[fw] = {"seeds": [r["seed"] for r in mine], "test_accuracy_mean": statistics.fmean(acc),
                   "test_accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                   **{f"{k}_mean": statistics.fmean(r[k] for r in mine) for k in ("test_loss", "train_s", "compile_s")},
                   "time_to_target_s_mean": statistics.fmean(ttt) if ttt else None,
                   "val_accuracy_mean": statistics.fmean(r["epochs"][-1]["val_accuracy"] for r in mine)
                   if all(r.get("epochs") for r in mine) else None, "reached_target": f"{len(ttt)}/{len(mine)}"}
    for suffix in dict.fromkeys(name.partition(" ")[2] for name in twins):
        pair = [out[name] for name in twins if name.partition(" ")[2] == suffix]
        if len(pair) == 2:
            spread = max(pair[0]["test_accuracy_std"], pair[1]["test_accuracy_std"])
            gap = abs(pair[0]["test_accuracy_mean"] - pair[1]["test_accuracy_mean"])
            out[f"agreement {suffix}".strip()] = {"test_accuracy_gap": gap, "larger_std": spread,
                                                  "within_one_std": bool(gap <= spread) if spread > 0 else None}
    return out


def classical_baselines(data: Dataset) -> list[dict[str, Any]]:
    """TF-IDF character 1–2-gram logistic regression and multinomial naive Bayes on ``data``, the twins' split (needs
    the optional scikit-learn; an empty list without it)."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.naive_bayes import MultinomialNB
    except ImportError:
        print("note: scikit-learn not installed: no classical baselines (pip install '.[baselines]')", file=sys.stderr)
        return []
    rows = []
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    x = {"train": vectorizer.fit_transform(data.train.texts), "val": vectorizer.transform(data.val.texts),
         "test": vectorizer.transform(data.test.texts)}
    for name, model in (("tfidf-char12 + logistic regression", LogisticRegression(C=4.0, max_iter=2000)),
                        ("tfidf-char12 + multinomial naive Bayes", MultinomialNB(alpha=0.1))):
        tic = time.perf_counter()
        model.fit(x["train"], data.train.labels)
        rows.append({"model": name, "fit_s": time.perf_counter() - tic,
                     **{f"{k}_accuracy": float(model.score(x[k], getattr(data, k).labels)) for k in ("val", "test")}})
    return rows


def quick_corpus(cfg: Config, out: Path) -> Config:
    """--quick: a seeded slice of the corpus, written as a TSV the twins read like any user's file."""
    import numpy as np
    from common.corpus import load_corpus
    texts, labels = load_corpus(cfg.data, cfg.pos, cfg.neg, cfg.text_column, cfg.label_column)
    keep = np.random.default_rng(0).permutation(len(texts))[:QUICK_MAX_TEXTS]
    lines = [" ".join(texts[i].split()) + f"\t{labels[i]}\n" for i in sorted(keep)]  # one per text, no tabs inside
    path = out / "quick-corpus.tsv"
    path.write_text("text\tlabel\n" + "".join(lines), encoding="utf-8")
    return cfg.replace(data=str(path), pos=None, neg=None, text_column="text", label_column="label")


def main(cfg: Config, frameworks: Sequence[str], seeds: Sequence[int], target: float, out: Path, timeout_s: float,
         quick: bool, command: list[str]) -> int:
    """Train every (seed, twin) pair, then write results.json, results.md and convergence.png to ``out``."""
    from tqdm import tqdm
    cfg = quick_corpus(cfg.replace(**QUICK_CONFIG), out) if quick else cfg
    start, data = time.perf_counter(), prepare_data(cfg)
    steps_per_epoch = num_train_batches(len(data.train), cfg.batch_size)
    dtypes = ["float32", cfg.dtype] if cfg.dtype == "bfloat16" else [cfg.dtype]  # bfloat16 beside its float32
    twins = [twin_name(fw, d) for d in dtypes for fw in frameworks]
    pairs = tqdm([(seed, fw, d) for seed in seeds for fw in frameworks for d in dtypes], desc="convergence runs",
                 unit="run", disable=not cfg.progress, file=sys.stderr)
    runs = [summarise_run(run_twin(fw, cfg.replace(dtype=d), seed, out, timeout_s), steps_per_epoch, target)
            for seed, fw, d in pairs]
    doc = {"mode": "convergence", "config": cfg.to_dict(), "seeds": list(seeds), "frameworks": list(frameworks),
           "dtypes": dtypes, "twins": twins, "target": target, "steps_per_epoch": steps_per_epoch,
           "eval_every": cfg.log_every, "split_sizes": {split: len(getattr(data, split)) for split in SPLITS},
           "runs": runs, "summary": aggregate(runs, twins), "baselines": classical_baselines(data),
           "environment": processes.environment(), "command": command, "run_wall_s": time.perf_counter() - start}
    schema.write_json(doc, out / "results.json")
    plots.convergence_curves(doc, out / "convergence.png")
    tables = convergence_tables(doc)
    (out / "results.md").write_text(f"# Convergence\n\n{tables}\n\n![convergence.png](convergence.png)\n",
                                    encoding="utf-8")
    print(tables)
    print(f"\nwrote results.json, results.md, convergence.png in {out} ({doc['run_wall_s'] / 60:.1f} min)")
    return 0

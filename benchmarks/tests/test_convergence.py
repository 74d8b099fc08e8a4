"""Convergence mode: curves and headline numbers from the twins' metrics, and the --quick run end to end."""
import json

import pytest

from benchmarks import bench, convergence
from benchmarks.convergence import RunResult, aggregate, summarise_run
from benchmarks.tests.command import BOTH, run_bench
from common.config import Config
from common.data import prepare_data


def _records(step_seconds, val_every, accuracies, test_accuracy=0.9):
    """A synthetic metrics file: steps taking ``step_seconds`` each, a validation every ``val_every`` steps."""
    records, t = [], 0.0
    for step, seconds in enumerate(step_seconds, start=1):
        t += seconds
        records.append({"step": step, "epoch": 1 + (step - 1) // 4, "loss": 1.0 / step, "train_seconds": t})
        if step % val_every == 0:
            records.append({"step": step, "split": "val", "loss": 0.5, "accuracy": accuracies[step // val_every - 1],
                            "train_seconds": t})
    records.append({"step": len(step_seconds), "split": "test", "loss": 0.3, "accuracy": test_accuracy,
                    "train_seconds": t})
    return records


def test_first_step_beyond_an_ordinary_one_is_reported_as_compilation_and_excluded():
    # 8 steps of 4 per epoch: the first takes 5 s (compilation), the others 1 s.
    run = RunResult("jax", 0, _records([5.0] + [1.0] * 7, val_every=4, accuracies=[0.80, 0.86]), wall_s=20.0)
    s = summarise_run(run, steps_per_epoch=4, target=0.85)
    assert s["compile_s"] == pytest.approx(4.0) and s["median_step_s"] == pytest.approx(1.0)
    assert [e["train_s"] for e in s["epochs"]] == pytest.approx([4.0, 8.0])  # 4 and 8 ordinary steps
    assert [e["train_loss"] for e in s["epochs"]] == pytest.approx([(1 + 1 / 2 + 1 / 3 + 1 / 4) / 4,
                                                                   (1 / 5 + 1 / 6 + 1 / 7 + 1 / 8) / 4])
    assert (s["time_to_target_s"], s["steps_to_target"]) == (pytest.approx(8.0), 8)
    assert s["test_accuracy"] == 0.9


def test_a_target_never_reached_has_no_time_to_target():
    run = RunResult("torch", 0, _records([1.0] * 8, val_every=4, accuracies=[0.5, 0.6]), wall_s=9.0)
    assert summarise_run(run, steps_per_epoch=4, target=0.85)["time_to_target_s"] is None


def test_twins_agree_when_their_accuracy_gap_is_within_one_standard_deviation():
    runs = [{"framework": fw, "seed": seed, "test_accuracy": acc, "test_loss": 0.3, "train_s": 10.0,
             "compile_s": 1.0, "time_to_target_s": 5.0}
            for fw, seed, acc in (("torch", 0, 0.88), ("torch", 1, 0.86), ("jax", 0, 0.87), ("jax", 1, 0.885))]
    summary = aggregate(runs, ["torch", "jax"])
    assert summary["torch"]["test_accuracy_mean"] == pytest.approx(0.87)
    assert summary["torch"]["test_accuracy_std"] == pytest.approx(0.0141421, rel=1e-4)  # sample std of 2 seeds
    assert summary["agreement"]["test_accuracy_gap"] == pytest.approx(0.0075)
    assert summary["agreement"]["within_one_std"] is True


@pytest.mark.parametrize("argv, message", [
    (["--mode", "convergence", "--seeds", "a,b"], "--seeds takes a comma list of integers"),
    (["--mode", "convergence", "--seeds", "1,1"], "--seeds takes distinct values, got 1 twice in '1,1'"),
    (["--mode", "convergence", "--seeds", "0,-1"], "--seeds: each value must be between 0 and 9223372036854775807, "
     "got -1"),
    (["--mode", "convergence", "--seeds", str(2**63)], "--seeds: each value must be between 0 and "
     "9223372036854775807, got 9223372036854775808"),
    (["--mode", "convergence", "--seeds", ""], "--seeds: empty; give a comma list of values"),
    (["--mode", "fast"], "invalid choice: 'fast'"),
    (["--mode", "convergence", "--target", "1.5"], "--target is a validation accuracy in (0, 1]"),
    (["--device-counts", "0,2"], "--device-counts: each value must be > 0, got 0"),
    (["--device-counts", "2,4,2"], "--device-counts takes distinct values, got 2 twice in '2,4,2'"),
])
def test_bad_convergence_and_scaling_flags_print_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert bench.main([*argv, "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.skipif(not BOTH, reason="needs both twins installed")
def test_quick_convergence_run_writes_curves_tables_and_results_with_bfloat16_beside_float32(tmp_path):
    out = tmp_path / "conv"
    proc = run_bench("--mode", "convergence", "--quick", "--no-progress", "--seeds", "0", "--log-every", "16",
                     "--dtype", "bfloat16", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| twin | seed | test loss | test acc |" in proc.stdout
    assert "| twin | dtype | val acc float32 | val acc | Δ val acc |" in proc.stdout
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["mode"] == "convergence" and doc["frameworks"] == ["torch", "jax"]
    assert doc["twins"] == ["torch", "jax", "torch bfloat16", "jax bfloat16"]
    assert [r["twin"] for r in doc["runs"]] == ["torch", "torch bfloat16", "jax", "jax bfloat16"]
    assert {"agreement", "agreement bfloat16"} <= doc["summary"].keys()
    # --quick trains on a seeded sample of QUICK_MAX_TEXTS raw texts, cleaned and split 80/10/10 as usual.
    kept = prepare_data(Config(data=str(out / "quick-corpus.tsv"), batch_size=1)).stats.kept
    assert 0 < kept <= convergence.QUICK_MAX_TEXTS
    assert doc["split_sizes"] == {"train": int(kept * 0.8), "val": int(kept * 0.1),
                                  "test": kept - int(kept * 0.8) - int(kept * 0.1)}
    for run in doc["runs"]:
        assert len(run["epochs"]) == convergence.QUICK_CONFIG["epochs"]
        assert 0.0 <= run["test_accuracy"] <= 1.0 and run["compile_s"] >= 0.0
        assert len(run["val_curve"]) > len(run["epochs"])  # mid-epoch validations (--log-every) are on the curve
    assert {"test_accuracy_mean", "test_accuracy_std"} <= doc["summary"]["jax"].keys()
    assert [b["model"] for b in doc["baselines"]] == ["tfidf-char12 + logistic regression",
                                                      "tfidf-char12 + multinomial naive Bayes"]
    assert all(0.5 < b["val_accuracy"] <= 1.0 and 0.5 < b["test_accuracy"] <= 1.0 for b in doc["baselines"])
    assert (out / "results.md").read_text(encoding="utf-8").startswith("# Convergence")
    assert (out / "convergence.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.skipif(not BOTH, reason="needs both twins installed")
def test_quick_run_with_device_counts_adds_a_scaling_sweep_with_efficiency(tmp_path):
    out = tmp_path / "scale"
    # jax:fused: one implementation at every count (jax:jit runs our kernel on one CPU device, fused over a mesh)
    proc = run_bench("--quick", "--no-progress", "--device-counts", "1,2", "--variants", "torch:eager,jax:fused",
                     "--parity-steps", "0", "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Sweep of devices (data-parallel scaling):" in proc.stdout and "measures the overhead" in proc.stdout
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    rows = {(r["framework"], r["sweep"]["value"], r["step"]): r for r in doc["results"]
            if r["sweep"] and r["sweep"]["field"] == "devices"}
    assert set(rows) == {(f, n, k) for f in ("torch", "jax") for n in (1, 2) for k in ("train", "eval")}
    assert all(r["status"] == "ok" and r["samples_per_s"] > 0 for r in rows.values()), rows
    assert rows[("jax", 1, "train")]["efficiency"] == pytest.approx(1.0)
    two = rows[("torch", 2, "train")]
    assert two["efficiency"] == pytest.approx(two["samples_per_s"] / (2 * rows[("torch", 1, "train")]["samples_per_s"]))
    assert two["threads"]["torch_intra_op"] == max(1, doc["settings"]["threads"] // 2)  # the ranks split the threads
    assert {(c["variant"], c["sweep"]["value"]) for c in doc["comparisons"] if c["sweep"]} == {("jax:fused", 1),
                                                                                              ("jax:fused", 2)}
    assert (out / "sweep_devices.png").exists()
    assert "## Sweep of devices (data-parallel scaling)" in (out / "results.md").read_text(encoding="utf-8")

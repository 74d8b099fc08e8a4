"""The language model's convergence summary: curves, per-twin means over seeds, the n-gram beside them."""
import json
import math

from benchmarks import lm_convergence


def write_run(folder, framework, seed, perplexities, step_s):
    lines = [{"step": 0, "run": {"framework": framework, "lstm_impl": "scan" if framework == "jax" else "nn.LSTM"}}]
    for step in range(1, 7):
        lines.append({"step": step, "epoch": 1, "loss": 6.0, "train_seconds": step * step_s})
        if step % 3 == 0:
            ppl = perplexities[step // 3 - 1]
            lines.append({"step": step, "split": "val", "loss": math.log(ppl), "perplexity": ppl,
                          "train_seconds": step * step_s})
    lines.append({"step": 6, "split": "test", "loss": 5.0, "perplexity": perplexities[-1] - 10, "train_seconds": 1})
    path = folder / f"{framework}-seed{seed}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_each_run_gives_its_validation_curve_on_the_training_seconds(tmp_path):
    run = lm_convergence.summarise_run(write_run(tmp_path, "jax", 2, [400.0, 300.0], 0.5))
    assert run["seed"] == 2 and run["twin"] == "jax" and run["lstm_impl"] == "scan"
    assert run["val_curve"] == [{"step": 3, "train_s": 1.5, "val_perplexity": 400.0},
                                {"step": 6, "train_s": 3.0, "val_perplexity": 300.0}]
    assert (run["val_perplexity"], run["test_perplexity"], run["median_step_s"]) == (300.0, 290.0, 0.5)


def test_the_summary_averages_each_twin_over_its_seeds(tmp_path):
    runs = [lm_convergence.summarise_run(write_run(tmp_path, fw, seed, [500.0, ppl], 0.25))
            for fw, seed, ppl in (("torch", 0, 300.0), ("torch", 1, 310.0), ("jax", 0, 305.0), ("jax", 1, 315.0))]
    summary = lm_convergence.aggregate(runs)
    assert summary["torch"]["val_perplexity_mean"] == 305.0 and summary["jax"]["val_perplexity_mean"] == 310.0
    assert math.isclose(summary["torch"]["val_perplexity_std"], math.sqrt(50.0))
    assert summary["jax"]["seeds"] == [0, 1] and summary["jax"]["median_step_s_mean"] == 0.25

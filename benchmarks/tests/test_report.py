"""Rows, paired comparisons, the GEMM peak, parity, tables, compare and the results schema, from synthetic sessions
(no worker runs)."""
import json
from dataclasses import asdict, replace

import numpy as np
import pytest

from benchmarks import report, schema
from benchmarks.schema import EntryResult, Round, Session, Setup
from common.config import Config
from common.errors import ConfigError

CFG = Config(batch_size=4, seq_len=10, embed_dim=8, hidden_dim=16, layers=2).to_dict()


KERNELS = {"nn.LSTM": ["aten::lstm", "aten::mkldnn_rnn_layer"], "fused": ["impl:fused"], "scan": ["impl:scan"],
           "flax": ["impl:flax"]}


def _entry(label, train_s, eval_s, lstm_impl="nn.LSTM", flush=True, replicate=1, device="cpu",
           kernels=None) -> EntryResult:
    setup = Setup(vocab_size=30, record={"lstm_impl": lstm_impl, "flush_denormal": flush, "allow_tf32": False},
                  info={"device": device, "device_name": device},
                  phases={k: {"first_step_s": 0.5, "peak_rss_mb": 300.0} for k in ("train", "eval")},
                  provenance={"kernels": KERNELS[lstm_impl] if kernels is None else kernels, "float_while_loops": 2,
                              "custom_calls": []})
    return EntryResult(label, replicate, "ok", None, setup, {"train": train_s, "eval": eval_s},
                       {"train": 3, "eval": 5})


def _session(n=5, **entries: EntryResult) -> Session:
    rounds = [Round([], 0.1 * i, i == 4) for i in range(n)]
    base = [_entry("torch:eager", [0.2] * n, [0.10] * n),
            _entry("jax:jit", [0.1] * n, [0.05, 0.10, 0.05, 0.10, 0.05][:n], "fused"),
            EntryResult("jax:cudnn", 1, "skipped", "cudnn LSTM needs a CUDA GPU; this backend is cpu")]
    entries = {f"{e.label}#{e.replicate}": e for e in [*base, *entries.values()]}
    return Session(entries, {"eval": rounds, "train": rounds})


def _configs(session: Session) -> dict:
    return {e.label: CFG for e in session.entries.values()}


def test_row_takes_the_median_over_rounds_and_derives_throughput_flops_and_utilisation():
    rows = report.rows_for(_session(), _configs(_session()), None, peak=10.0)
    jit = next(r for r in rows if r.variant == "jit" and r.step == "train")
    model = 3 * (2 * 40 * 64 * (8 + 16) + 2 * 40 * 64 * (16 + 16) + 2 * 4 * 16) / 1e9
    assert asdict(jit.step_s) == {"median": pytest.approx(0.1), "p25": pytest.approx(0.1), "p75": pytest.approx(0.1)}
    assert jit.model_gflop_per_step == pytest.approx(model, rel=1e-12)
    assert jit.samples_per_s == pytest.approx(4 / 0.1)
    assert jit.utilisation == pytest.approx(model / 0.1 / 10.0)
    assert (jit.flush_denormal, jit.rounds, jit.steps_per_round) == (True, 5, 3)


def test_executed_flops_credit_the_fold_only_to_the_fused_stack():
    rows = report.rows_for(_session(), _configs(_session()), None, peak=None)
    by = {(r.variant, r.step): r for r in rows}
    saved = 2 * 4 * 16 * 8 * (40 - 30) / 1e9  # layer 0's projection over 30 table rows instead of 40 tokens
    assert by["jit", "eval"].executed_gflop_per_step == pytest.approx(by["jit", "eval"].model_gflop_per_step
                                                                      - saved, rel=1e-12)
    assert by["eager", "eval"].executed_gflop_per_step == by["eager", "eval"].model_gflop_per_step


def test_a_skipped_variant_becomes_rows_with_its_reason_and_no_numbers():
    rows = report.rows_for(_session(), {k: {**CFG, "lstm_impl": "cudnn"} for k in _configs(_session())}, None, 1.0)
    cudnn = [r for r in rows if r.variant == "cudnn"]
    assert [(r.step, r.status, r.step_s) for r in cudnn] == [("train", "skipped", None), ("eval", "skipped", None)]
    assert cudnn[0].error == "cudnn LSTM needs a CUDA GPU; this backend is cpu"


def test_paired_ratio_is_the_median_per_round_ratio_with_a_bootstrap_interval():
    ratio, (low, high) = report.paired_ratio([[2.0, 2.0, 2.0, 2.0, 2.0]], [[1.0, 1.0, 1.0, 1.0, 1.0]])
    assert (ratio, low, high) == (2.0, 2.0, 2.0)  # no spread, no width
    base = np.array([1.0, 1.1, 0.9, 1.2, 1.0, 0.95, 1.05])
    ratio, (low, high) = report.paired_ratio([base], [base / np.array([1.5, 1.4, 1.6, 1.5, 1.3, 1.7, 1.5])])
    assert ratio == pytest.approx(1.5) and low < 1.5 < high + 1e-12 and 1.3 <= low and high <= 1.7


def test_the_interval_widens_when_replicates_disagree_though_every_round_agrees_within_each():
    # Two workers of the variant: one twice as fast as the other in every round. Resampling rounds alone sees
    # no spread; resampling the replicates too spans from both slow (ratio 1) to both fast (ratio 2).
    base = [[1.0] * 8, [1.0] * 8]
    ratio, (low, high) = report.paired_ratio(base, [[1.0] * 8, [0.5] * 8])
    assert ratio == pytest.approx(1 / 0.75) and (low, high) == pytest.approx((1.0, 2.0))
    assert report.paired_ratio(base, [[0.75] * 8, [0.75] * 8])[1] == pytest.approx([1 / 0.75, 1 / 0.75])


def test_comparisons_pair_every_variant_with_the_baseline_per_step_kind():
    out = report.comparisons_for(_session(), None)
    assert [(c.variant, c.step) for c in out] == [("jax:jit", "train"), ("jax:jit", "eval")]
    train = out[0]
    assert (train.baseline, train.ratio, train.ci95, train.rounds) == ("torch:eager", 2.0, [2.0, 2.0], 5)
    assert train.busy_rounds == 1 and "bootstrap" in train.method
    assert out[1].ratio == pytest.approx(2.0)  # per-round ratios 2, 1, 2, 1, 2


def test_gemm_peak_is_the_best_measurement_on_the_benchmark_device():
    measured = {"torch": {"gflop_s": 90.0, "n": 8, "device": "cuda"},
                "numpy": {"gflop_s": 120.0, "n": 8, "device": "cpu"},  # the host: not the GPU's peak
                "jax": {"gflop_s": 95.0, "n": 8, "device": "cuda"}}
    on_gpu = report.gemm_peak(measured, "cuda")
    assert (on_gpu["gflop_s"], on_gpu["backend"]) == (95.0, "jax")
    assert report.gemm_peak(measured, "cpu")["backend"] == "numpy"


def test_parity_reports_each_variants_largest_loss_difference_from_the_baseline():
    out = report.parity({"torch:eager": [0.7, 0.6, 0.5], "jax:jit": [0.7, 0.6000004, 0.4999999],
                         "jax:cudnn": [0.7, 0.6, 0.5002]}, 3)
    assert out["status"] == "ok" and out["baseline"] == "torch:eager"
    assert out["max_abs_dloss"] == {"jax:jit": pytest.approx(4e-7, rel=1e-3), "jax:cudnn": pytest.approx(2e-4)}
    assert report.parity({"torch:eager": [0.7]}, 3)["status"].startswith("skipped")
    assert report.parity({"jax:jit": [0.7]}, 3)["status"].startswith("skipped: needs torch:eager")
    assert report.parity({}, 0)["status"] == "skipped (--parity-steps 0)"


def test_warnings_flag_busy_rounds_mixed_devices_and_utilisation_above_the_peak():
    torch, jit = (r for r in report.rows_for(_session(), _configs(_session()), None, peak=None)
                  if r.step == "train" and r.status == "ok")
    rows = [replace(torch, utilisation=1.2), replace(jit, device_name="NVIDIA H200", utilisation=0.3)]
    out = report.warnings(rows, [Round([], 2.0, True), Round([], 0.0, False)])
    assert len(out) == 3
    assert "different devices" in out[0] and "exceeds the measured GEMM peak" in out[1]
    assert out[2].startswith("1 of 2 rounds ran while other processes used more than half the cores")
    assert report.warnings([replace(torch, utilisation=0.4)], [Round([], 0.0, False)]) == []


def _doc(session, sweep=None):
    rows = report.rows_for(session, _configs(session), sweep, None)
    return {"results": [asdict(r) for r in rows], "comparisons": [asdict(c) for c in
                                                                 report.comparisons_for(session, sweep)],
            "environment": {"date": "d", "cpu_model": "AMD EPYC", "devices": {"torch": "cpu"}}}


def test_sweep_rows_give_each_value_its_times_and_paired_ratios(tmp_path):
    doc = _doc(_session(), {"field": "hidden_dim", "value": 16})
    doc.update(sweep_rounds={"hidden_dim=16": [{"busy": True}]}, settings={"sweeps": []})
    rows = report.sweep_rows(doc, "hidden_dim")
    assert [r[:2] + r[4:6] for r in rows] == [["16", "torch:eager", "200.0", "baseline"],
                                              ["16", "jax:jit", "100.0", "2.00× [2.00–2.00]"],
                                              ["16", "jax:cudnn", "skipped", "–"]]
    assert [r[2:4] for r in rows] == [["mkldnn_rnn_layer", "–"], ["fused, 2 loops", "–"], ["–", "–"]]
    assert rows[1][-1] == "5 (1 busy)"


def test_compare_sets_matching_rows_side_by_side():
    slow = _session()
    slow.entries["jax:jit#1"].round_s["train"] = [0.4] * 5
    text = report.compare(_doc(_session()), _doc(slow), ["a", "b"], markdown=False)
    line = next(x for x in text.splitlines() if x.startswith("jax:jit") and " train " in x)
    assert line.split()[-3:] == ["100.0", "400.0", "0.25×"]
    assert report.compare(_doc(_session()), _doc(slow), ["a", "b"], markdown=True).startswith("# Two benchmark runs")


@pytest.mark.parametrize("content, message", [
    (None, "no such results directory"), ("{not json", "not a bench"),
    ('{"results": "x"}', "no results list"),
    ('{"schema_version": 4, "results": []}', "schema_version 4; this bench reads version 5 only"),
    ('{"schema_version": 5, "results": [{"variant": 1}]}', r"results\[0\]\.framework is missing"),
    ('{"schema_version": 5, "results": [{"framework": "jax", "variant": "jit", "step": "train", "sweep": null, '
     '"step_s": 0.1}]}', r"results\[0\]\.step_s is missing or of the wrong type"),
    ('{"schema_version": 5, "results": [{"framework": "jax", "variant": "jit", "step": "train", "sweep": null, '
     '"step_s": {"median": "fast"}}]}', r"results\[0\]\.step_s\.median is not a positive number"),
    ('{"schema_version": 5, "results": [], "comparisons": [{"variant": "jax:jit", "step": "train", "sweep": null, '
     '"ratio": 1.2}]}', r"comparisons\[0\]\.ci95 is missing or of the wrong type"),
    ('{"schema_version": 5, "results": [], "comparisons": [{"variant": "jax:jit", "step": "train", "sweep": null, '
     '"ratio": 1.2, "ci95": [1.1, "1.3"]}]}', r"comparisons\[0\]\.ci95 is not \[low, high\]")])
def test_reading_a_run_refuses_a_missing_malformed_or_other_version_file_naming_it(tmp_path, content, message):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    for spec in (str(path), str(tmp_path)):  # the file, or the directory that holds it
        with pytest.raises(ConfigError, match=message) as err:
            schema.read_run(spec)
        assert str(err.value).count("\n") == 0 and (content is None or str(path) in str(err.value))


def test_a_written_run_reads_back_with_every_row_field(tmp_path):
    session = _session()
    rows = report.rows_for(session, _configs(session), None, peak=10.0)
    comparisons = report.comparisons_for(session, None)
    run = schema.Run(schema.SCHEMA_VERSION, ["bench.py"], {}, {}, CFG, 30, {}, {"gflop_s": 10.0}, rows,
                     comparisons, report.tier_sentences(rows, comparisons), session.rounds, {}, report.parity({}, 0),
                     [])
    schema.write_json(run, tmp_path / "results.json")
    doc = schema.read_run(str(tmp_path))
    assert doc == json.loads(json.dumps(asdict(run)))
    assert set(doc["results"][0]) == {f for f in schema.Row.__dataclass_fields__}  # no key beside the schema's


def test_efficiency_is_throughput_per_device_relative_to_the_smallest_count():
    torch, jit = (r for r in report.rows_for(_session(), _configs(_session()), None, peak=None)
                  if r.step == "train" and r.status == "ok")

    def row(like, devices, samples_per_s):
        return replace(like, sweep={"field": "devices", "value": devices}, samples_per_s=samples_per_s)
    rows = [row(torch, 1, 100.0), row(torch, 2, 150.0), row(torch, 4, 200.0), row(jit, 2, 80.0)]
    report.add_efficiency(rows)
    assert [r.efficiency for r in rows] == pytest.approx([1.0, 0.75, 0.5, 1.0])  # 150 / (2 × 100), 200 / (4 × 100)


def test_a_row_whose_kernel_is_not_the_one_its_label_promises_is_a_fallback_kept_out_of_the_comparisons():
    # jax:jit promises the fused recurrence; this worker's compiled step ran the reference scan instead.
    session = _session(**{"slow": _entry("jax:nofold", [0.1] * 5, [0.1] * 5, "fused"),
                          "fake": _entry("jax:jit", [0.05] * 5, [0.05] * 5, "scan", replicate=2)})
    session.entries["jax:jit#1"].setup.provenance = {"kernels": ["impl:scan"]}
    rows = report.rows_for(session, _configs(session), None, peak=None)
    jit = next(r for r in rows if r.variant == "jit" and r.step == "train")
    assert jit.fallback == "jax:jit promises impl:fused on the cpu, but its training step ran impl:scan"
    assert {c.variant for c in report.comparisons_for(session, None)} == {"jax:nofold"}
    assert "fallback, kept out of the comparisons: jax:jit promises impl:fused" in report.warnings(rows, [])[0]
    assert not any("jax:jit" in x for x in report.tier_sentences(rows, report.comparisons_for(session, None)))


def test_torch_eager_on_a_gpu_without_cudnn_is_a_fallback_and_takes_every_comparison_with_it():
    session = _session()
    session.entries["torch:eager#1"].setup.info["device"] = "cuda"
    assert report.fallback("torch:eager", session.entries["torch:eager#1"].setup).startswith(
        "torch:eager promises _cudnn_rnn on the gpu")
    assert report.comparisons_for(session, None) == []  # no baseline: no ratio means anything


def test_tier_sentences_give_each_tier_comparison_its_ratio_and_interval():
    session = _session(**{"scan": _entry("jax:scan", [0.4] * 5, [0.2] * 5, "scan"),
                          "flax": _entry("jax:flax", [0.5] * 5, [0.1] * 5, "flax"),
                          "nofold": _entry("jax:nofold", [0.25] * 5, [0.2] * 5, "fused")})
    rows = report.rows_for(session, _configs(session), None, None, report.parity({}, 0))
    sentences = report.tier_sentences(rows, report.comparisons_for(session, None))
    assert sentences == [
        "Stock against stock, torch:eager being PyTorch's nn.LSTM: Flax nn.RNN over Flax's nn.OptimizedLSTMCell "
        "(jax:flax) trains at 0.40× [0.40–0.40] and infers at 1.00× [1.00–1.00] the speed of torch:eager; Flax nn.RNN "
        "over PyTorch's cell (jax:scan) trains at 0.50× [0.50–0.50] and infers at 0.50× [0.50–0.50] the speed of "
        "torch:eager.",
        "Best tuned JAX against stock PyTorch: jax:jit trains at 2.00× [2.00–2.00] and infers at 2.00× [1.00–2.00] "
        "the speed of torch:eager.",
        "The same algorithm as nn.LSTM, hand-tuned (jax:nofold), trains at 0.80× [0.80–0.80] and infers at 0.50× "
        "[0.50–0.50] the speed of torch:eager.",
        "jax:cudnn (vendor): not timed, skipped: cudnn LSTM needs a CUDA GPU; this backend is cpu"]


def test_a_float32_row_beyond_the_parity_band_is_flagged_and_left_out_of_the_sentences():
    session = _session()
    parity = report.parity({"torch:eager": [0.7, 0.6], "jax:jit": [0.7, 0.6001]}, 2)
    rows = report.rows_for(session, _configs(session), None, None, parity)
    jit = next(r for r in rows if r.variant == "jit" and r.step == "train")
    assert jit.parity == pytest.approx(1e-4) and jit.parity_ok is False
    assert any("jax:jit: max |Δloss| 0.0001 against torch:eager is beyond 1e-05" in w
               for w in report.warnings(rows, []))
    assert not any(x.startswith("Best tuned") for x in report.tier_sentences(rows,
                                                                             report.comparisons_for(session, None)))


def test_bfloat16_rows_are_judged_against_the_baselines_float32_losses_within_the_bfloat16_band():
    session = _session()
    configs = {k: {**v, "dtype": "bfloat16"} for k, v in _configs(session).items()}
    parity = report.parity({"torch:eager": [0.7, 0.6008], "torch:eager float32": [0.7, 0.6],
                            "jax:jit": [0.7, 0.605]}, 2)
    assert parity["baseline"] == "torch:eager float32"
    rows = {r.variant: r for r in report.rows_for(session, configs, None, None, parity) if r.step == "train"}
    # torch:eager's own bfloat16 drift (8e-4) is within the band (3e-3); jax:jit's 5e-3 is not.
    assert (rows["eager"].parity, rows["eager"].parity_ok) == (pytest.approx(8e-4), True)
    assert (rows["jit"].parity, rows["jit"].parity_ok) == (pytest.approx(5e-3), False)
    assert report._parity_cell(asdict(rows["eager"])) == "8.0e-04"
    assert any("jax:jit: max |Δloss| 0.005 against torch:eager is beyond 0.003 (bfloat16)" in w
               for w in report.warnings(list(rows.values()), []))


def test_jax_jit_under_bfloat16_runs_the_scan_stack_as_promised_and_counts_as_stock():
    session = _session()
    setup = session.entries["jax:jit#1"].setup
    setup.record.update(lstm_impl="scan", dtype="bfloat16")
    setup.provenance["kernels"] = ["impl:scan"]
    assert report.fallback("jax:jit", setup) is None  # float32's promise (impl:fused) would make it one
    rows = report.rows_for(session, _configs(session), None, None)
    assert {r.tier for r in rows if r.variant == "jit"} == {"stock"}
    assert not any(x.startswith("Best tuned") for x in report.tier_sentences(rows, report.comparisons_for(session,
                                                                                                         None)))


def test_a_dtype_sweep_states_each_variants_float32_time_over_its_bfloat16_time():
    def point(dtype, seconds):
        doc = _doc(_session(), {"field": "dtype", "value": dtype})
        for r in doc["results"]:
            if r["variant"] == "eager" and r["step"] == "train":
                r["round_s"], r["step_s"] = [seconds], {"median": float(np.median(seconds))}
        return [r for r in doc["results"] if r["variant"] == "eager" and r["step"] == "train"]

    doc = {"results": point("float32", [0.2, 0.21, 0.19, 0.2, 0.2]) + point("bfloat16", [0.1, 0.1, 0.11, 0.09, 0.1])}
    (line,) = report.dtype_costs(doc)
    assert line.startswith("torch:eager train: float32 ms / bfloat16 ms = 2.00× [") and line.endswith("(unpaired: "
                                                                                                      "two sessions)")
    low, high = (float(x) for x in line.split("[")[1].split("]")[0].split("–"))
    assert 1.7 <= low <= 2.0 <= high <= 2.4  # resampled medians: 0.19–0.21 over 0.09–0.11


def _run_with(ratios: dict[tuple[str, str], tuple[float, float, float]]) -> dict:
    """A results document holding only comparisons: (variant, step) -> (ratio, low, high)."""
    return {"environment": {"date": "d", "cpu_model": "cpu"}, "settings": {"replicates": 2, "rounds": 8},
            "comparisons": [{"variant": v, "step": k, "sweep": None, "ratio": r, "ci95": [lo, hi]}
                            for (v, k), (r, lo, hi) in ratios.items()]}


def test_coverage_counts_the_intervals_that_hold_the_median_ratio_of_the_other_runs():
    # Train: other runs' medians 1.20, 1.20, 1.15, 1.20 → runs 1, 3, 4 hold theirs; run 2's interval [1.0, 1.1]
    # misses 1.20. Eval: every interval is wide, so all four hold.
    runs = [_run_with({("jax:jit", "train"): t, ("jax:jit", "eval"): (1.0, 0.5, 1.5)})
            for t in ((1.20, 1.1, 1.3), (1.05, 1.0, 1.1), (1.25, 1.15, 1.35), (1.15, 1.1, 1.3))]
    text = report.coverage(runs, ["a", "b", "c", "d"], markdown=False)
    train = next(x for x in text.splitlines() if x.startswith("jax:jit") and " train " in x)
    assert train.split()[-1] == "3/4" and "1.05 [1.00–1.10] ✗" in train
    assert "train: 3 of 4 intervals (75%) hold the other runs' median ratio" in text
    assert "eval: 4 of 4 intervals (100%)" in text and "all: 7 of 8 (88%)" in text


def test_coverage_refuses_runs_with_no_comparison_in_common():
    with pytest.raises(ConfigError, match="no comparison in common"):
        report.coverage([_run_with({("jax:jit", "train"): (1, 1, 1)}), _run_with({("jax:scan", "eval"): (1, 1, 1)}),
                         _run_with({("jax:jit", "train"): (1, 1, 1)})], ["a", "b", "c"], markdown=False)


def test_rounds_only_intervals_hold_the_replicates_fixed_and_so_miss_their_spread():
    # jax:jit's two workers: one twice as fast as the other in every round. Resampled, the replicates span ratios
    # 1 to 2; held fixed (averaged per round), every round gives 0.2 / 0.15, an interval of no width.
    session = _session(**{"slow": _entry("jax:jit", [0.2] * 5, [0.1] * 5, "fused", replicate=2)})
    session.entries["jax:jit#1"].round_s = {"train": [0.1] * 5, "eval": [0.05] * 5}
    doc = _doc(session)
    train = next(c for c in doc["comparisons"] if (c["variant"], c["step"]) == ("jax:jit", "train"))
    assert train["ci95"] == pytest.approx([1.0, 2.0])
    fixed = next(c for c in report.rounds_only(doc)["comparisons"]
                 if c["variant"] == "jax:jit" and c["step"] == "train")
    assert fixed["ci95"] == pytest.approx([0.2 / 0.15, 0.2 / 0.15]) and fixed["ratio"] == train["ratio"]


def test_a_bfloat16_row_has_no_utilisation_against_the_float32_gemm_peak():
    session = _session()
    configs = {**_configs(session), "jax:jit": {**CFG, "dtype": "bfloat16"}}
    rows = report.rows_for(session, configs, None, peak=1.0)
    by = {(r.variant, r.step): r for r in rows}
    assert by["jit", "train"].utilisation is None and by["eager", "train"].utilisation > 0

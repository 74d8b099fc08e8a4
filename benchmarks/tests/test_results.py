"""Rows, paired comparisons, fallbacks, parity and its bands, the GEMM peak, warnings, scaling efficiency and the
headline sentences, from synthetic sessions (no worker runs) and from the runs checked in under docs/bench."""
import json
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import flops, plan, results
from benchmarks.plan import Headline, Variant
from benchmarks.schema import Comparison, Round, Row, Session
from benchmarks.tests.sessions import CFG, configs, entry, nnx_entry, session
from common.config import Config

SAVED_RUNS = sorted((Path(__file__).resolve().parents[2] / "docs" / "bench").rglob("results.json"))


def test_row_takes_the_median_over_rounds_and_derives_throughput_flops_and_utilisation():
    rows = results.rows_for(session(), configs(session()), None, peak=10.0)
    jit = next(r for r in rows if r.variant == "jit" and r.step == "train")
    model = 3 * (2 * 40 * 64 * (8 + 16) + 2 * 40 * 64 * (16 + 16) + 2 * 4 * 16) / 1e9
    executed = model - 3 * 2 * 4 * 16 * 8 * (40 - 30) / 1e9  # the fold projects 30 table rows instead of 40 tokens
    assert asdict(jit.step_s) == {"median": pytest.approx(0.1), "p25": pytest.approx(0.1), "p75": pytest.approx(0.1)}
    assert jit.model_gflop_per_step == pytest.approx(model, rel=1e-12)
    assert jit.samples_per_s == pytest.approx(4 / 0.1)
    assert jit.model_gflop_s == pytest.approx(model / 0.1)
    assert jit.achieved_gflop_s == pytest.approx(executed / 0.1)
    assert jit.utilisation == pytest.approx(executed / 0.1 / 10.0)  # what it executes, never the model's count
    assert (jit.flush_denormal, jit.rounds, jit.steps_per_round) == (True, 5, 3)


def test_executed_flops_credit_the_fold_only_to_the_fused_stack():
    rows = results.rows_for(session(), configs(session()), None, peak=None)
    by = {(r.variant, r.step): r for r in rows}
    saved = 2 * 4 * 16 * 8 * (40 - 30) / 1e9  # layer 0's projection over 30 table rows instead of 40 tokens
    assert by["jit", "eval"].executed_gflop_per_step == pytest.approx(by["jit", "eval"].model_gflop_per_step
                                                                      - saved, rel=1e-12)
    assert by["eager", "eval"].executed_gflop_per_step == by["eager", "eval"].model_gflop_per_step


def test_a_skipped_variant_becomes_rows_with_its_reason_and_no_numbers():
    rows = results.rows_for(session(), {k: {**CFG, "lstm_impl": "cudnn"} for k in configs(session())}, None, 1.0)
    cudnn = [r for r in rows if r.variant == "cudnn"]
    assert [(r.step, r.status, r.step_s) for r in cudnn] == [("train", "skipped", None), ("eval", "skipped", None)]
    assert cudnn[0].error == "cudnn LSTM needs a CUDA GPU; this backend is cpu"


def test_a_bfloat16_row_has_no_utilisation_against_the_float32_gemm_peak():
    s = session()
    cfgs = {**configs(s), "jax:jit": {**CFG, "dtype": "bfloat16"}}
    rows = results.rows_for(s, cfgs, None, peak=1.0)
    by = {(r.variant, r.step): r for r in rows}
    assert by["jit", "train"].utilisation is None and by["eager", "train"].utilisation > 0


def test_comparisons_pair_every_variant_with_the_baseline_per_step_kind():
    out = results.comparisons_for(session(), None)
    assert [(c.variant, c.step) for c in out] == [("jax:jit", "train"), ("jax:jit", "eval")]
    train = out[0]
    assert (train.baseline, train.ratio, train.ci95, train.rounds) == ("torch:eager", 2.0, [2.0, 2.0], 5)
    assert train.busy_rounds == 1 and "bootstrap" in train.method
    assert out[1].ratio == pytest.approx(2.0)  # per-round ratios 2, 1, 2, 1, 2


def test_a_row_whose_kernel_is_not_the_one_its_label_promises_is_a_fallback_kept_out_of_the_comparisons():
    # jax:fused promises the fused recurrence; this worker's compiled step ran the reference scan instead.
    s = session(**{"fake": entry("jax:fused", [0.05] * 5, [0.05] * 5, "scan")})
    rows = results.rows_for(s, configs(s), None, peak=None)
    fused = next(r for r in rows if r.variant == "fused" and r.step == "train")
    assert fused.fallback == "jax:fused promises impl:fused on the cpu, but its training step ran impl:scan"
    assert {c.variant for c in results.comparisons_for(s, None)} == {"jax:jit"}
    assert "fallback, kept out of the comparisons: jax:fused promises impl:fused" in results.warnings(rows, [])[0]
    assert not any("jax:fused" in x for x in results.tier_sentences(rows, results.comparisons_for(s, None)))


def test_jax_jit_promises_no_implementation_but_takes_the_tier_and_sentence_of_the_one_it_ran():
    # The trainers' default ran our kernel here: a kernel row, in the kernel's sentence and not the best tuned one.
    s = session()
    s.entries["jax:jit#1"].setup.record["lstm_impl"] = "kernel"
    s.entries["jax:jit#1"].setup.provenance["kernels"] = ["impl:kernel", "lstm_kernel_forward"]
    rows = results.rows_for(s, configs(s), None, peak=None)
    assert {(r.tier, r.fallback) for r in rows if r.variant == "jit"} == {("kernel", None)}
    assert results.tier_sentences(rows, results.comparisons_for(s, None))[0] == (
        "JAX with a custom kernel against stock PyTorch: our recurrence kernel as jax_impl.train's default (jax:jit) "
        "trains at 2.00× [2.00–2.00] and infers at 2.00× [1.00–2.00] the speed of torch:eager.")


def test_the_variants_section_says_what_the_trainers_default_ran_and_why():
    s = session()
    s.entries["jax:jit#1"].setup.record["lstm_impl_auto"] = "our kernel: float32 on one CPU device"
    said = results.descriptions(s, [plan.variant("jax:jit"), plan.variant("jax:nofold")])
    assert said["jax:jit"] == plan.variant("jax:jit").description + ". Here: our kernel: float32 on one CPU device"
    assert said["jax:nofold"] == plan.variant("jax:nofold").description


def test_the_variants_section_names_the_row_the_trainers_default_runs_from_the_workers_answer():
    why = "XLA's fused recurrence: the language model's fastest JAX recurrence"
    s = session(**{"fused": entry("jax:fused", [0.1] * 5, [0.05] * 5, "fused"),
                   "scan": entry("jax:scan", [0.1] * 5, [0.05] * 5, "scan")})
    for e in s.entries.values():
        if e.setup and e.label.startswith("jax:"):
            e.setup.record.update(lstm_impl_default="fused", lstm_impl_default_why=why)
    said = results.descriptions(s, [plan.variant("jax:fused"), plan.variant("jax:scan")], "lm")
    assert said["jax:fused"] == (plan.variant("jax:fused").lm_description + ". jax_impl.train's default here "
                                 f"(--lstm-impl auto: {why})")
    assert said["jax:scan"] == plan.variant("jax:scan").lm_description  # not the default: said of no other row
    assert "default" not in said["jax:scan"]


def test_torch_eager_on_a_gpu_without_cudnn_is_a_fallback_and_takes_every_comparison_with_it():
    s = session()
    s.entries["torch:eager#1"].setup.info["device"] = "cuda"
    assert results.fallback("torch:eager", s.entries["torch:eager#1"].setup).startswith(
        "torch:eager promises _cudnn_rnn on the gpu")
    assert results.comparisons_for(s, None) == []  # no baseline: no ratio means anything


def test_gemm_peak_is_the_best_measurement_on_the_benchmark_device():
    measured = {"torch": {"gflop_s": 90.0, "n": 8, "device": "cuda"},
                "numpy": {"gflop_s": 120.0, "n": 8, "device": "cpu"},  # the host: not the GPU's peak
                "jax": {"gflop_s": 95.0, "n": 8, "device": "cuda"}}
    on_gpu = results.gemm_peak(measured, "cuda")
    assert (on_gpu["gflop_s"], on_gpu["backend"]) == (95.0, "jax")
    assert results.gemm_peak(measured, "cpu")["backend"] == "numpy"


def test_parity_reports_each_variants_largest_loss_difference_from_the_baseline():
    out = results.parity({"torch:eager": [0.7, 0.6, 0.5], "jax:jit": [0.7, 0.6000004, 0.4999999],
                          "jax:cudnn": [0.7, 0.6, 0.5002]}, 3)
    assert out["status"] == "ok" and out["baseline"] == "torch:eager"
    assert out["max_abs_dloss"] == {"jax:jit": pytest.approx(4e-7, rel=1e-3), "jax:cudnn": pytest.approx(2e-4)}
    assert results.parity({"torch:eager": [0.7]}, 3)["status"].startswith("skipped")
    assert results.parity({"jax:jit": [0.7]}, 3)["status"].startswith("skipped: needs torch:eager")
    assert results.parity({}, 0)["status"] == "skipped (--parity-steps 0)"


def test_a_float32_row_beyond_the_parity_band_is_flagged_and_left_out_of_the_sentences():
    s = session()
    parity = results.parity({"torch:eager": [0.7, 0.6], "jax:jit": [0.7, 0.6001]}, 2)
    rows = results.rows_for(s, configs(s), None, None, parity)
    jit = next(r for r in rows if r.variant == "jit" and r.step == "train")
    assert jit.parity == pytest.approx(1e-4) and jit.parity_ok is False
    assert any("jax:jit: max |Δloss| 0.0001 against torch:eager is beyond 1e-05" in w
               for w in results.warnings(rows, []))
    sentences = results.tier_sentences(rows, results.comparisons_for(s, None))
    assert not any(x.startswith("Best tuned") for x in sentences)


def test_bfloat16_rows_are_judged_against_the_baselines_float32_losses_within_the_bfloat16_band():
    s = session()
    cfgs = {k: {**v, "dtype": "bfloat16"} for k, v in configs(s).items()}
    parity = results.parity({"torch:eager": [0.7, 0.6008], "torch:eager float32": [0.7, 0.6],
                             "jax:jit": [0.7, 0.605]}, 2)
    assert parity["baseline"] == "torch:eager float32"
    rows = {r.variant: r for r in results.rows_for(s, cfgs, None, None, parity) if r.step == "train"}
    # torch:eager's own bfloat16 drift (8e-4) is within the band (3e-3); jax:jit's 5e-3 is not.
    assert (rows["eager"].parity, rows["eager"].parity_ok) == (pytest.approx(8e-4), True)
    assert (rows["jit"].parity, rows["jit"].parity_ok) == (pytest.approx(5e-3), False)
    assert any("jax:jit: max |Δloss| 0.005 against torch:eager is beyond 0.003 (bfloat16)" in w
               for w in results.warnings(list(rows.values()), []))


def test_jax_jit_under_bfloat16_runs_the_scan_stack_as_promised_and_counts_as_stock():
    s = session()
    setup = s.entries["jax:jit#1"].setup
    setup.record.update(lstm_impl="scan", dtype="bfloat16")
    setup.provenance["kernels"] = ["impl:scan"]
    assert results.fallback("jax:jit", setup) is None  # float32's promise (impl:fused) would make it one
    rows = results.rows_for(s, configs(s), None, None)
    assert {r.tier for r in rows if r.variant == "jit"} == {"stock"}
    sentences = results.tier_sentences(rows, results.comparisons_for(s, None))
    assert not any(x.startswith("Best tuned") for x in sentences)


def test_warnings_flag_busy_rounds_mixed_devices_and_utilisation_above_the_peak():
    torch, jit = (r for r in results.rows_for(session(), configs(session()), None, peak=None)
                  if r.step == "train" and r.status == "ok")
    rows = [replace(torch, utilisation=1.2), replace(jit, device_name="NVIDIA H200", utilisation=0.3)]
    out = results.warnings(rows, [Round([], 2.0, True), Round([], 0.0, False)])
    assert len(out) == 3
    assert "different devices" in out[0] and "executes more FLOP/s than the measured GEMM peak" in out[1]
    assert out[2].startswith("1 of 2 rounds ran while other processes used more than half the cores")
    assert results.warnings([replace(torch, utilisation=0.4)], [Round([], 0.0, False)]) == []


def test_a_fold_above_the_peak_by_the_models_flops_only_stays_below_it_in_utilisation():
    # jit's fold executes less than the model's count: a peak between the two rates puts the model's above 100%.
    jit = next(r for r in results.rows_for(session(), configs(session()), None, peak=None)
               if r.variant == "jit" and r.step == "train")
    peak = (jit.achieved_gflop_s + jit.model_gflop_s) / 2
    row = next(r for r in results.rows_for(session(), configs(session()), None, peak=peak)
               if r.variant == "jit" and r.step == "train")
    assert jit.model_gflop_s / peak > 1 > row.utilisation == pytest.approx(jit.achieved_gflop_s / peak)
    assert results.warnings([row], [Round([], 0.0, False)]) == []


def test_efficiency_is_throughput_per_device_relative_to_the_smallest_count():
    torch, jit = (r for r in results.rows_for(session(), configs(session()), None, peak=None)
                  if r.step == "train" and r.status == "ok")

    def row(like, devices, samples_per_s):
        return replace(like, sweep={"field": "devices", "value": devices}, samples_per_s=samples_per_s)
    rows = [row(torch, 1, 100.0), row(torch, 2, 150.0), row(torch, 4, 200.0), row(jit, 2, 80.0)]
    results.add_efficiency(rows)
    assert [r.efficiency for r in rows] == pytest.approx([1.0, 0.75, 0.5, 1.0])  # 150 / (2 × 100), 200 / (4 × 100)


def test_no_efficiency_where_the_smallest_count_ran_another_implementation():
    # jax:jit on one CPU device runs our kernel, over a mesh the fused recurrence: not one function's scaling.
    jit = next(r for r in results.rows_for(session(), configs(session()), None, peak=None)
               if r.variant == "jit" and r.step == "train")
    rows = [replace(jit, sweep={"field": "devices", "value": n}, samples_per_s=s, lstm_impl=impl)
            for n, s, impl in ((1, 140.0, "kernel"), (2, 160.0, "fused"), (4, 200.0, "fused"))]
    results.add_efficiency(rows)
    assert [r.efficiency for r in rows] == [1.0, None, None]


def test_tier_sentences_give_each_tier_comparison_its_ratio_and_interval():
    s = session(**{"scan": entry("jax:scan", [0.4] * 5, [0.2] * 5, "scan"),
                   "flax": entry("jax:flax", [0.5] * 5, [0.1] * 5, "flax"),
                   "nofold": entry("jax:nofold", [0.25] * 5, [0.2] * 5, "fused")})
    rows = results.rows_for(s, configs(s), None, None, results.parity({}, 0))
    sentences = results.tier_sentences(rows, results.comparisons_for(s, None))
    assert sentences == [
        "Stock against stock, torch:eager being PyTorch's nn.LSTM: Flax nn.RNN over Flax's nn.OptimizedLSTMCell "
        "(jax:flax) trains at 0.40× [0.40–0.40] and infers at 1.00× [1.00–1.00] the speed of torch:eager; "
        "Flax nn.RNN "
        "over PyTorch's cell (jax:scan) trains at 0.50× [0.50–0.50] and infers at 0.50× [0.50–0.50] the speed of "
        "torch:eager.",
        "Best tuned JAX against stock PyTorch: jax:jit trains at 2.00× [2.00–2.00] and infers at "
        "2.00× [1.00–2.00] "
        "the speed of torch:eager.",
        "The same algorithm as nn.LSTM, hand-tuned (jax:nofold), trains at 0.80× [0.80–0.80] and infers at 0.50× "
        "[0.50–0.50] the speed of torch:eager.",
        "jax:cudnn (vendor): not timed, skipped: cudnn LSTM needs a CUDA GPU; this backend is cpu"]


def test_the_nnx_row_says_its_speed_against_linens_and_what_nnx_jit_costs_a_step():
    s = session(**{"flax": entry("jax:flax", [0.5] * 5, [0.1] * 5, "flax"),
                   "nnx": nnx_entry([0.625] * 5, [0.125] * 5)})
    rows = results.rows_for(s, configs(s), None, None, results.parity({}, 0))
    train = next(r for r in rows if r.variant == "nnx" and r.step == "train")
    assert (train.tier, train.fallback, train.nnx_overhead_ms) == ("stock", None, 0.75)
    assert train.nnx_dispatch_ms == {"nnx.jit": 1.5, "nnx.cached_partial": 0.75}
    assert results.tier_sentences(rows, results.comparisons_for(s, None))[0] == (
        "Stock against stock, torch:eager being PyTorch's nn.LSTM: Flax nn.RNN over Flax's nn.OptimizedLSTMCell "
        "(jax:flax) trains at 0.40× [0.40–0.40] and infers at 1.00× [1.00–1.00] the speed of torch:eager; Flax NNX "
        "nnx.RNN over nnx.OptimizedLSTMCell (jax:nnx) trains at 0.32× [0.32–0.32] and infers at 0.80× [0.80–0.80] "
        "the speed of torch:eager (0.80× [0.80–0.80] jax:flax's training speed), nnx.jit's graph traversal adding "
        "0.75 ms a step over nnx.cached_partial.")


def test_an_nnx_row_whose_step_ran_linens_model_is_a_fallback():
    s = session(**{"nnx": entry("jax:nnx", [0.5] * 5, [0.1] * 5, "flax")})  # its kernels: impl:flax
    assert results.fallback("jax:nnx", s.entries["jax:nnx#1"].setup) == (
        "jax:nnx promises impl:nnx.flax on the cpu, but its training step ran impl:flax")


def test_on_the_cpu_the_onednn_row_is_the_vendor_sentence():
    s = session(**{"onednn": entry("jax:onednn", [0.25] * 5, [0.125] * 5, "onednn",
                                   kernels=["impl:onednn", "onednn_lstm_backward", "onednn_lstm_forward"])})
    rows = results.rows_for(s, configs(s), None, None)
    assert "Vendor kernel against vendor kernel, torch:eager running nn.LSTM on the same library: oneDNN through " \
           "XLA's FFI (jax:onednn) trains at 0.80× [0.80–0.80] and infers at 0.80× [0.80–0.80] the speed of " \
           "torch:eager." in results.tier_sentences(rows, results.comparisons_for(s, None))


def test_a_onednn_row_whose_step_lacks_the_ffi_call_is_a_fallback():
    s = session(**{"onednn": entry("jax:onednn", [0.25] * 5, [0.125] * 5, "onednn", kernels=["impl:onednn"])})
    assert results.fallback("jax:onednn", s.entries["jax:onednn#1"].setup) == (
        "jax:onednn promises onednn_lstm_forward on the cpu, but its training step ran impl:onednn")


def test_on_a_gpu_the_vendor_kernel_and_the_compiler_have_their_sentences():
    # Every row on cuDNN as promised: nn.LSTM's _cudnn_rnn, jax:cudnn's custom call, torch:compile's Dynamo graph.
    s = session(**{"cudnn": entry("jax:cudnn", [0.1] * 5, [0.05] * 5, "cudnn", device="cuda",
                                  kernels=["impl:cudnn", "cudnn_rnn_ffi_dnn_rnn"]),
                   "compile": entry("torch:compile", [0.25] * 5, [0.125] * 5, device="cuda",
                                    kernels=["aten::_cudnn_rnn", "dynamo:lstm"])})
    for key in ("torch:eager#1", "jax:jit#1"):
        s.entries[key].setup.info["device"] = "cuda"
    s.entries["torch:eager#1"].setup.provenance["kernels"] = ["aten::lstm", "aten::_cudnn_rnn"]
    rows = results.rows_for(s, configs(s), None, None)
    assert results.tier_sentences(rows, results.comparisons_for(s, None))[1:] == [
        "Vendor kernel against vendor kernel, torch:eager running nn.LSTM on the same library: cuDNN through JAX "
        "(jax:cudnn) trains at 2.00× [2.00–2.00] and infers at 2.00× [2.00–2.00] the speed of torch:eager.",
        "Compiled: torch.compile (torch:compile) trains at 0.80× [0.80–0.80] and infers at 0.80× [0.80–0.80] the "
        "speed of torch:eager."]


def test_best_tuned_names_the_fastest_training_of_the_variants_that_declare_it():
    # jax:nofold trains at 4× here, jax:jit at 2×: nofold is the best tuned, and also the same-algorithm pair.
    s = session(**{"nofold": entry("jax:nofold", [0.05] * 5, [0.1] * 5, "fused")})
    rows = results.rows_for(s, configs(s), None, None)
    sentences = results.tier_sentences(rows, results.comparisons_for(s, None))
    assert sentences[:2] == [
        "Best tuned JAX against stock PyTorch: jax:nofold trains at 4.00× [4.00–4.00] and infers at 1.00× "
        "[1.00–1.00] the speed of torch:eager.",
        "The same algorithm as nn.LSTM, hand-tuned (jax:nofold), trains at 4.00× [4.00–4.00] and infers at 1.00× "
        "[1.00–1.00] the speed of torch:eager."]


def test_a_new_variant_joins_the_sentences_by_its_table_entries_alone(monkeypatch):
    # A new tier, "kernel", and its headline: entries in plan's tables, no code.
    monkeypatch.setattr(plan, "TIERS", {**plan.TIERS, "kernel": "JAX with a custom kernel"})
    monkeypatch.setattr(plan, "VARIANTS", (*plan.VARIANTS,
                        Variant("jax", "custom", "kernel", "a custom LSTM kernel", kernel={"cpu": "impl:custom"},
                                headline=("kernel",), wording="our custom kernel")))
    monkeypatch.setattr(plan, "HEADLINES", {**plan.HEADLINES,
                        "kernel": Headline("Custom kernel against stock PyTorch: {members}.",
                                           "{wording} ({label}) {speeds}", "kernel")})
    s = session(**{"custom": entry("jax:custom", [0.08] * 5, [0.04] * 5, "custom", kernels=["impl:custom"])})
    rows = results.rows_for(s, configs(s), None, None)
    assert {r.tier for r in rows if r.variant == "custom"} == {"kernel"}
    assert results.tier_sentences(rows, results.comparisons_for(s, None))[1] == (
        "Custom kernel against stock PyTorch: our custom kernel (jax:custom) trains at 2.50× [2.50–2.50] and "
        "infers at 2.50× [2.50–2.50] the speed of torch:eager.")


@pytest.mark.parametrize("path", SAVED_RUNS, ids=lambda p: str(p.parent.name))
def test_the_headline_sentences_of_a_saved_run_come_back_word_for_word_from_its_rows(path):
    doc = json.loads(path.read_text(encoding="utf-8"))
    rows, comparisons = [Row(**r) for r in doc["results"]], [Comparison(**c) for c in doc["comparisons"]]
    assert results.tier_sentences(rows, comparisons) == doc["headline"]


LM_CFG = Config.for_workload("lm", batch_size=4, bptt=5, embed_dim=8, hidden_dim=8, layers=2, cell="gru").to_dict()


def lm_session() -> Session:
    """torch:eager (nn.GRU) and jax:flax at twice its speed, over 5 rounds of every kind, with the LM's parts."""
    rounds = [Round([], 0.1, False) for _ in range(5)]
    eager = entry("torch:eager", [0.2] * 5, [0.1] * 5, kernels=["aten::gru"])
    flax = entry("jax:flax", [0.1] * 5, [0.05] * 5, "flax")
    for e, scale in ((eager, 2), (flax, 1)):
        e.round_s.update({p: [scale * x] * 5 for p, x in (("forward", 0.03), ("backward", 0.05),
                                                         ("optimizer", 0.01), ("decoder", 0.06))})
    return Session({"torch:eager#1": eager, "jax:flax#1": flax}, {"eval": rounds, "train": rounds, "parts": rounds})


def test_lm_rows_count_tokens_the_decoders_flops_and_the_decoder_part():
    s = lm_session()
    rows = results.rows_for(s, {k: LM_CFG for k in ("torch:eager", "jax:flax")}, None, peak=None)
    by = {(r.variant, r.step): r for r in rows}
    assert by["flax", "train"].samples_per_s == pytest.approx(4 * 5 / 0.1)  # tokens: bptt × batch size
    assert by["flax", "eval"].samples_per_s == pytest.approx(10 * 5 / 0.05)  # the example's 10 columns
    # The session's vocabulary (30) sizes the decoder: the same model FLOPs for every row of a kind.
    assert by["flax", "train"].model_gflop_per_step == pytest.approx(
        flops.step_flops(SimpleNamespace(**LM_CFG), "train", vocab_size=30) / 1e9, rel=1e-12)
    assert by["flax", "train"].executed_gflop_per_step == pytest.approx(by["flax", "train"].model_gflop_per_step)
    assert by["flax", "train"].parts["decoder"].median == pytest.approx(0.06)
    compared = {c.step: c.ratio for c in results.comparisons_for(s, None)}
    assert compared == {"train": 2.0, "eval": 2.0, "forward": 2.0, "backward": 2.0, "optimizer": 2.0,
                        "decoder": 2.0}


def test_lm_parity_is_judged_within_the_float32_band_at_its_small_learning_rate():
    s = lm_session()
    cfgs = {k: LM_CFG for k in ("torch:eager", "jax:flax")}
    assert results.LM_PARITY_LR == 0.1
    close = results.parity({"torch:eager": [9.2, 8.7], "jax:flax": [9.2, 8.7 + 3e-6]}, 2)  # 3 ulps near 9
    far = results.parity({"torch:eager": [9.2, 8.7], "jax:flax": [9.2, 8.7 + 1e-4]}, 2)
    flax = [next(r for r in results.rows_for(s, cfgs, None, None, p) if r.variant == "flax" and r.step == "train")
            for p in (close, far)]
    assert [r.parity_ok for r in flax] == [True, False]


def test_lm_stock_sentence_names_the_runs_cell_on_both_sides():
    s = lm_session()
    cfgs = {k: LM_CFG for k in ("torch:eager", "jax:flax")}
    sentences = results.tier_sentences(results.rows_for(s, cfgs, None, None), results.comparisons_for(s, None))
    assert sentences == ["Stock against stock, torch:eager being PyTorch's nn.GRU: Flax nn.RNN over Flax's nn.GRUCell "
                         "(jax:flax) trains at 2.00× [2.00–2.00] and infers at 2.00× [2.00–2.00] the speed of "
                         "torch:eager."]

"""The tools that read several saved runs: compare, coverage and the rounds-only intervals, from synthetic documents
and from the runs checked in under docs/bench."""
import json
from pathlib import Path

import pytest

from benchmarks import bench, crossrun, schema
from benchmarks.tests.sessions import entry, results_doc, session
from common.errors import ConfigError

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"
RUNS = BENCH / "intel-xeon-avx512-2cpu"  # the five coverage runs of 2026-12-05: 2026-12-05-coverage-N
ONE, TWO = RUNS / "2026-12-05-coverage-1", RUNS / "2026-12-05-coverage-2"


def test_compare_sets_matching_rows_side_by_side():
    slow = session()
    slow.entries["jax:jit#1"].round_s["train"] = [0.4] * 5
    text = crossrun.compare(results_doc(session()), results_doc(slow), ["a", "b"], markdown=False)
    line = next(x for x in text.splitlines() if x.startswith("jax:jit") and " train " in x)
    assert line.split()[-3:] == ["100.0", "400.0", "0.25×"]
    markdown = crossrun.compare(results_doc(session()), results_doc(slow), ["a", "b"], markdown=True)
    assert markdown.startswith("# Two benchmark runs")


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
    text = crossrun.coverage(runs, ["a", "b", "c", "d"], markdown=False)
    train = next(x for x in text.splitlines() if x.startswith("jax:jit") and " train " in x)
    assert train.split()[-1] == "3/4" and "1.05 [1.00–1.10] ✗" in train
    assert "train: 3 of 4 intervals (75%) hold the other runs' median ratio" in text
    assert "eval: 4 of 4 intervals (100%)" in text and "all: 7 of 8 (88%)" in text


def test_coverage_refuses_runs_with_no_comparison_in_common():
    with pytest.raises(ConfigError, match="no comparison in common"):
        crossrun.coverage([_run_with({("jax:jit", "train"): (1, 1, 1)}), _run_with({("jax:scan", "eval"): (1, 1, 1)}),
                           _run_with({("jax:jit", "train"): (1, 1, 1)})], ["a", "b", "c"], markdown=False)


def test_rounds_only_intervals_hold_the_replicates_fixed_and_so_miss_their_spread():
    # jax:jit's two workers: one twice as fast as the other in every round. Resampled, the replicates span ratios
    # 1 to 2; held fixed (averaged per round), every round gives 0.2 / 0.15, an interval of no width.
    s = session(**{"slow": entry("jax:jit", [0.2] * 5, [0.1] * 5, "fused", replicate=2)})
    s.entries["jax:jit#1"].round_s = {"train": [0.1] * 5, "eval": [0.05] * 5}
    doc = results_doc(s)
    train = next(c for c in doc["comparisons"] if (c["variant"], c["step"]) == ("jax:jit", "train"))
    assert train["ci95"] == pytest.approx([1.0, 2.0])
    fixed = next(c for c in crossrun.rounds_only(doc)["comparisons"]
                 if c["variant"] == "jax:jit" and c["step"] == "train")
    assert fixed["ci95"] == pytest.approx([0.2 / 0.15, 0.2 / 0.15]) and fixed["ratio"] == train["ratio"]


def test_the_checked_in_coverage_runs_hold_92_percent_and_62_percent_with_the_replicates_fixed():
    # docs/benchmarks.md quotes both figures: five runs of make bench back to back on the Intel host.
    names = [str(RUNS / f"2026-12-05-coverage-{i}") for i in range(1, 6)]
    docs = [schema.read_run(x, "coverage") for x in names]
    assert crossrun.coverage(docs, names, markdown=False).splitlines()[-1] == (
        "all: 92 of 100 (92%); ✗: the interval misses it")
    assert crossrun.coverage([crossrun.rounds_only(d) for d in docs], names, markdown=False).splitlines()[-1] == (
        "all: 25 of 40 (62%); ✗: the interval misses it")


@pytest.mark.parametrize("runs, same", [
    (["2026-12-05-coverage-1"] * 3, "the same results.json"),
    (["2026-12-05-coverage-1", "2026-12-05-coverage-2", "2026-12-05-coverage-1/results.json"],
     "the same results.json"),
])
def test_coverage_refuses_one_run_given_twice(runs, same, capsys):
    names = [str(RUNS / r) for r in runs]
    assert bench.main(["coverage", *names]) == 2
    duplicate = names[2] if runs[2] != "2026-12-05-coverage-2" else names[1]
    assert capsys.readouterr().err == (f"error: coverage: {names[0]} and {duplicate} are one run ({same}); coverage "
                                       f"needs distinct runs\n")


def test_coverage_refuses_a_copy_of_a_run(tmp_path, capsys):
    (tmp_path / "results.json").write_bytes((ONE / "results.json").read_bytes())
    names = [str(ONE), str(TWO), str(tmp_path)]
    assert bench.main(["coverage", *names]) == 2
    assert capsys.readouterr().err == (f"error: coverage: {names[0]} and {names[2]} are one run (identical results); "
                                       f"coverage needs distinct runs\n")


def test_a_run_with_no_rows_is_refused_in_one_line(tmp_path, capsys):
    doc = json.loads((ONE / "results.json").read_text(encoding="utf-8"))
    (tmp_path / "results.json").write_text(json.dumps({**doc, "results": []}), encoding="utf-8")
    assert bench.main(["coverage", str(ONE), str(TWO), str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: coverage: {tmp_path / 'results.json'}: holds no results (a run in "
                                       f"which nothing was measured)\n")


def test_comparing_a_run_with_itself_is_allowed_and_said(capsys):
    assert bench.main(["compare", str(ONE), str(ONE / "results.json")]) == 0
    out = capsys.readouterr()
    assert out.err == (f"note: compare: {ONE} and {ONE / 'results.json'} are one run (the same "
                       f"results.json): every ratio is 1.00× by construction\n")
    assert {line.split()[-1] for line in out.out.splitlines() if line.startswith("jax:")} == {"1.00×"}


@pytest.mark.parametrize("command", ["compare", "coverage"])
def test_an_existing_report_is_refused_before_reading_the_runs_unless_overwrite(command, tmp_path, capsys):
    report = tmp_path / "report.md"
    report.write_text("hand-edited\n", encoding="utf-8")
    runs = [str(RUNS / f"2026-12-05-coverage-{i}") for i in (1, 2, 3)][:2 if command == "compare" else 3]
    assert bench.main([command, *runs, "--out", str(report)]) == 2
    assert capsys.readouterr().err == f"error: --out {report}: exists; pass --overwrite to replace it\n"
    assert report.read_text(encoding="utf-8") == "hand-edited\n"
    assert bench.main([command, *runs, "--out", str(report), "--overwrite"]) == 0
    assert report.read_text(encoding="utf-8").startswith("# ")


def test_a_report_over_a_runs_results_is_refused_unless_overwrite(tmp_path, capsys):
    (tmp_path / "results.json").write_bytes((ONE / "results.json").read_bytes())
    run = str(tmp_path)
    assert bench.main(["compare", run, str(TWO), "--out", str(tmp_path / "results.json")]) == 2
    assert capsys.readouterr().err == (f"error: the run {tmp_path / 'results.json'} is the same path as --out "
                                       f"{tmp_path / 'results.json'}, which the report replaces: its results would be "
                                       f"lost; give each its own path, or pass --overwrite\n")
    assert (tmp_path / "results.json").read_bytes() == (ONE / "results.json").read_bytes()


AVX2 = BENCH / "amd-epyc-avx2-2cpu"


def test_compare_refuses_runs_of_different_workloads(capsys):
    lm, classifier = AVX2 / "2026-12-07-lm-small", AVX2 / "2026-12-07-default-2"
    assert bench.main(["compare", str(lm), str(classifier)]) == 2
    assert capsys.readouterr() == ("", f"error: compare: {lm} is a run of the language model and {classifier} one of "
                                       f"the classifier: their steps do different work; compare needs runs of one "
                                       f"workload\n")


def test_coverage_refuses_runs_of_different_workloads(capsys):
    runs = [str(AVX2 / r) for r in ("2026-12-07-default-2", "2026-12-07-default-1", "2026-12-07-lm-small")]
    assert bench.main(["coverage", *runs]) == 2
    assert capsys.readouterr().err == (f"error: coverage: {runs[0]} is a run of the classifier and {runs[2]} one of "
                                       f"the language model: their steps do different work; coverage needs runs of "
                                       f"one workload\n")


def test_coverage_refuses_runs_of_different_configurations(tmp_path, capsys):
    doc = json.loads((ONE / "results.json").read_text(encoding="utf-8"))
    doc["base_config"] = {**doc["base_config"], "hidden_dim": 512, "seed": 7}  # the seed alone would not count
    (tmp_path / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    assert bench.main(["coverage", str(ONE), str(TWO), str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: coverage: {ONE} and {tmp_path} are runs of different configurations "
                                       f"(hidden_dim 256 and 512); coverage needs runs of one configuration on one "
                                       f"machine\n")


def test_coverage_refuses_runs_of_different_machines(capsys):
    runs = [str(AVX2 / "2026-12-07-default-2"), str(AVX2 / "2026-12-07-default-1"),
            str(BENCH / "amd-epyc-avx512-2cpu" / "2026-12-06-default")]
    assert bench.main(["coverage", *runs]) == 2
    assert capsys.readouterr().err == (f"error: coverage: {runs[0]} and {runs[2]} ran on different machines or devices "
                                       f"(AMD EPYC, avx2, 2 CPUs, device auto; AMD EPYC, avx512, 2 CPUs, device auto); "
                                       f"coverage needs runs of one configuration on one machine\n")


def test_a_run_recorded_before_a_field_existed_reads_as_its_default():
    old = {"base_config": {"workload": "classifier", "hidden_dim": 256}}  # no cell, no flax_api: not there yet
    assert crossrun.configuration(old) == crossrun.configuration({"base_config": {"cell": "lstm", "hidden_dim": 256,
                                                                                  "flax_api": "linen"}})

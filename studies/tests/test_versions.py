"""The versions study: pyproject.toml's ranges are what its committed records ran, and how it reads a set's install,
its smoke subset and its rows."""
import json

import pytest
from packaging.specifiers import SpecifierSet

from benchmarks import hosts
from studies import version_ranges, version_report, versions

RECORDS = sorted(hosts.BENCH.glob("*/*/versions.json"))


def record(*sets: tuple[str, str, dict[str, str]]) -> dict:
    return {"sets": [{"name": name, "status": status, "reason": None if status == "ok" else "it broke",
                      "pins": pins} for name, status, pins in sets]}


def pins(jax: str, flax: str = "0.12.8", optax: str = "0.2.8", orbax: str = "0.12.8", torch: str = "2.13.0+cpu"):
    return {"jax": jax, "jaxlib": jax, "flax": flax, "optax": optax, "orbax-checkpoint": orbax, "torch": torch}


RANGES = {"jax": SpecifierSet(">=0.5.0,<0.11"), "flax": SpecifierSet(">=0.10.2,<0.13"),
          "optax": SpecifierSet(">=0.2.4,<0.3"), "orbax-checkpoint": SpecifierSet(">=0.11.5,<0.13"),
          "torch": SpecifierSet(">=2.2.2,<2.14")}


def test_pyproject_ranges_are_what_the_committed_study_ran():
    assert RECORDS, "no versions.json under docs/bench: run python -m studies.versions and publish its --out"
    specifiers = {name: r.specifier for name, r in version_ranges.requirements().items()}
    assert version_ranges.range_problems(specifiers, [json.loads(p.read_text(encoding="utf-8")) for p in RECORDS]) == []


def test_ranges_that_match_the_passing_and_exclude_the_failing_sets_have_no_problem():
    runs = record(("old", "smoke failed", pins("0.4.35", "0.10.2", "0.2.4", "0.10.3")),
                  ("floor", "ok", pins("0.5.0", "0.10.2", "0.2.4", "0.11.5", "2.2.2")),
                  ("newest", "ok", pins("0.10.2")))
    assert version_ranges.range_problems(RANGES, [runs]) == []


def test_a_range_older_than_the_oldest_pass_or_open_above_the_newest_is_named():
    runs = record(("floor", "ok", pins("0.5.0", "0.10.2", "0.2.4", "0.11.5", "2.2.2")),
                  ("newest", "ok", pins("0.10.2")))
    wide = {**RANGES, "jax": SpecifierSet(">=0.4.35"), "torch": SpecifierSet(">=2.2.2,<2.16")}
    assert version_ranges.range_problems(wide, [runs]) == [
        "jax>=0.4.35 should start at >=0.5.0, the oldest release that passed",
        "jax>=0.4.35 should stop at <0.11, after 0.10.2, the newest release that passed",
        "torch<2.16,>=2.2.2 should stop at <2.14, after 2.13.0+cpu, the newest release that passed"]


def test_a_failed_set_the_ranges_admit_and_a_pass_they_exclude_are_named():
    runs = record(("broken", "smoke failed", pins("0.6.2", "0.10.7", "0.2.5", "0.11.16")),
                  ("floor", "ok", pins("0.5.0", "0.10.2", "0.2.4", "0.11.5", "2.2.2")),
                  ("newest", "ok", pins("0.10.2", torch="2.14.1")))
    problems = version_ranges.range_problems(RANGES, [runs])
    assert problems == ["torch<2.14,>=2.2.2 excludes 2.14.1, which passed the smoke subset",
                        "torch<2.14,>=2.2.2 should stop at <2.15, after 2.14.1, the newest release that passed",
                        "set broken failed (smoke failed: it broke), yet pyproject.toml admits every pin of it"]


def test_the_pins_pyproject_excludes_are_named():
    reqs = {name: version_ranges.Requirement(spec) for name, spec in (("jax", "jax>=0.5.0,<0.11"),
                                                                      ("torch", "torch>=2.2.2,<2.14"))}
    assert version_ranges.outside_ranges(pins("0.4.35"), reqs) == ["jax 0.4.35"]


def test_a_module_that_fails_to_import_is_named_with_the_error_it_raised():
    output = ("E   AttributeError: module 'jax' has no attribute 'ffi'\n=== short test summary info ===\n"
              "ERROR ../../../v/lib/python3.11/site-packages/jax_impl/tests\n8 errors in 2.45s")
    assert versions.first_failure(output) == "jax_impl/tests - AttributeError: module 'jax' has no attribute 'ffi'"


def test_a_failed_assertion_about_a_run_is_named_with_the_error_the_run_raised():
    output = ("E   AssertionError: training checkpoints: checkpoints\nE     AttributeError: module "
              "'orbax.checkpoint.checkpoint_managers' has no attribute 'LatestN'\n=== short test summary info ===\n"
              "FAILED /v/lib/python3.11/site-packages/jax_impl/tests/test_resume.py::test_resume - AssertionError: "
              "training checkpoints: checkpoints\n1 failed in 5.40s")
    assert versions.first_failure(output) == ("jax_impl/tests/test_resume.py::test_resume - AttributeError: module "
                                              "'orbax.checkpoint.checkpoint_managers' has no attribute 'LatestN'")


def test_pytests_closing_line_is_read_as_counts_and_its_first_failure_shortened():
    output = ("....F\nFAILED /v/lib/python3.11/site-packages/jax_impl/tests/test_nnx.py::test_x - AttributeError: "
              "module 'flax.nnx' has no attribute 'List'\n1 failed, 204 passed, 13 skipped, 2 errors in 104.39s")
    assert versions.smoke_counts(output) == {"passed": 204, "failed": 1, "skipped": 13, "errors": 2}
    assert versions.first_failure(output) == ("jax_impl/tests/test_nnx.py::test_x - AttributeError: module "
                                              "'flax.nnx' has no attribute 'List'")


def test_a_row_two_sets_share_runs_once_in_the_later_sets_venv():
    chosen = [s for s in versions.SETS if s.name in ("jax-0.6.2-torch-2.2.2", "jax-0.6.2", "jax-0.10.2")]
    rows = versions.row_labels(chosen)
    assert rows["jax:fused", "jax-0.6.2-torch-2.2.2"][0] == "jax:fused@jax-0.6.2"
    assert rows["torch:eager", "jax-0.6.2-torch-2.2.2"][0] == "torch:eager@jax-0.6.2-torch-2.2.2"
    assert rows["torch:eager", "jax-0.6.2"][0] == "torch:eager@jax-0.10.2"
    entries = versions.entries(rows, {"jax-0.6.2": "/a/python", "jax-0.10.2": "/b/python"}, 60.0)
    assert [(e.label, e.python) for e in entries] == [
        ("jax:flax@jax-0.6.2", "/a/python"), ("jax:fused@jax-0.6.2", "/a/python"),
        ("jax:kernel@jax-0.6.2", "/a/python"), ("torch:eager@jax-0.10.2", "/b/python"),
        ("jax:flax@jax-0.10.2", "/b/python"), ("jax:fused@jax-0.10.2", "/b/python"),
        ("jax:kernel@jax-0.10.2", "/b/python")]


def test_a_venv_is_named_by_what_it_installs():
    reqs = version_ranges.requirements()
    one, other = versions.SETS[0], versions.SETS[1]
    assert versions.venv_dir(versions.Path("/c"), one, reqs).name.startswith("jax-0.4.35-")
    assert versions.venv_dir(versions.Path("/c"), one, reqs) != versions.venv_dir(versions.Path("/c"), other, reqs)


@pytest.mark.parametrize("argv, message", [
    (["--sets", "jax-9"], "--sets: unknown set 'jax-9' (known: jax-0.4.35, jax-0.5.0-orbax-0.11.13, jax-0.5.0, "
     "jax-0.6.2-torch-2.2.2, jax-0.6.2, jax-0.7.2, jax-0.10.2-torch-2.14.1, jax-0.10.2)"),
    (["--sets", ","], "--sets: name at least one set"),
    (["--rounds", "3"], "python -m studies.versions: argument --rounds: must be >= 5, got 3"),
    (["--timeout", "nan"], "--timeout must be a finite number of seconds > 0, got nan"),
])
def test_a_bad_flag_is_one_line_and_exit_2(argv, message, capsys):
    assert versions.main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_an_out_holding_a_record_is_refused_unless_overwrite(tmp_path, capsys):
    (tmp_path / "versions.json").write_text("{}", encoding="utf-8")
    assert versions.main(["--out", str(tmp_path), "--cache", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == (f"error: --out {tmp_path}: holds an earlier study's record; choose another "
                                       f"directory, or pass --overwrite to replace it\n")
    assert (tmp_path / "versions.json").read_text(encoding="utf-8") == "{}"


@pytest.mark.skipif(not RECORDS, reason="no committed versions.json")
def test_the_committed_record_renders_a_row_per_set_and_its_chart(tmp_path):
    doc = json.loads(RECORDS[-1].read_text(encoding="utf-8"))
    lines = version_report.tables(doc)
    for s in doc["sets"]:
        assert any(line.startswith(f"| `{s['name']}`") for line in lines)
    version_report.plot(doc, tmp_path / "versions.png")
    assert (tmp_path / "versions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_set_gets_its_tiers_ratio_against_its_own_torch_and_each_rows_time_against_the_newest():
    from benchmarks.schema import EntryResult, Session

    chosen = [s for s in versions.SETS if s.name in ("jax-0.6.2-torch-2.2.2", "jax-0.6.2", "jax-0.10.2")]
    rows = versions.row_labels(chosen)
    seconds = {"torch:eager@jax-0.6.2-torch-2.2.2": 0.8, "torch:eager@jax-0.10.2": 0.5,
               "jax:flax@jax-0.6.2": 1.0, "jax:fused@jax-0.6.2": 0.5, "jax:kernel@jax-0.6.2": 0.25,
               "jax:flax@jax-0.10.2": 0.5, "jax:fused@jax-0.10.2": 0.5, "jax:kernel@jax-0.10.2": 0.25}
    session = Session({f"{label}#1": EntryResult(label, 1, "ok", None, None, {"train": [s] * 5, "eval": [s / 4] * 5})
                       for label, s in seconds.items()}, {})
    sets = [versions.SetResult(s.name, s.pins, s.jax_date, s.torch_date) for s in chosen]
    by = {(r["set"], r["variant"]): r for r in versions.measured(session, rows, sets)}
    assert by["jax-0.6.2-torch-2.2.2", "jax:kernel"]["vs_torch"]["train"]["ratio"] == pytest.approx(3.2)
    assert by["jax-0.6.2", "jax:kernel"]["vs_torch"]["train"]["ratio"] == pytest.approx(2.0)
    assert by["jax-0.6.2", "jax:flax"]["time_vs_newest"]["train"]["ratio"] == pytest.approx(2.0)
    assert by["jax-0.6.2-torch-2.2.2", "torch:eager"]["time_vs_newest"]["train"]["ratio"] == pytest.approx(1.6)
    assert by["jax-0.10.2", "torch:eager"]["ms"] == {"train": pytest.approx(500.0), "eval": pytest.approx(125.0)}


def test_a_set_whose_rows_crash_fails_and_one_whose_tier_is_not_applicable_passes():
    sets = [versions.SetResult(name, {}, "", "") for name in ("segfaults", "no-kernel", "broken")]
    sets[2].status, sets[2].reason = "smoke failed", "test_x"
    rows = [{"set": "segfaults", "row": "jax:flax@segfaults", "status": "failed", "error": "worker exited with "
             "status -11"}, {"set": "no-kernel", "row": "jax:kernel@no-kernel", "status": "n/a", "error": "not built"},
            {"set": "broken", "row": "jax:flax@broken", "status": "failed", "error": "x"}]
    assert [(s.status, s.reason) for s in versions.bench_failures(sets, rows)] == [
        ("bench failed", "jax:flax@segfaults: worker exited with status -11"), ("ok", None),
        ("smoke failed", "test_x")]

"""The loop-cost decomposition: its differences are per-round arithmetic on the pieces, and every piece runs; sizes
beyond the memory are refused before any."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from studies import loop_cost

REPO = Path(__file__).resolve().parents[2]


def test_a_difference_is_the_first_piece_less_the_others_round_by_round():
    seconds = {"a": np.array([5.0, 7.0]), "b": np.array([1.0, 2.0]), "c": np.array([0.5, 0.5])}
    assert loop_cost.difference(seconds, ("a", "b", "c")).tolist() == [3.5, 4.5]
    assert loop_cost.difference(seconds, ("a", "-c", "b")).tolist() == [4.5, 5.5]  # a + c - b


def test_every_piece_and_difference_is_measured_with_an_interval_around_its_median():
    doc = loop_cost.measure(rounds=3, b=2, t=3, h=4, d=5)
    assert {"xla: dots", "xla: gate math", "xla: gate math at once", "xla: empty loop", "xla: fused recurrence",
            "xla: projection", "torch: dots", "torch: nn.LSTM", "torch: projection"} <= set(doc["pieces"])
    assert set(doc["differences"]) == set(loop_cost.DIFFERENCES)
    for p in doc["pieces"].values():
        assert 0 < p["ci95_ms"][0] <= p["ms"] <= p["ci95_ms"][1]
    assert doc["pieces"]["xla: dots"]["gflop_s"] == pytest.approx(2 * 2 * 4 * 16 * 3 / doc["pieces"]["xla: dots"]["ms"]
                                                                  / 1e6)
    assert "differences, paired by round:" in loop_cost.render(doc)


@pytest.mark.parametrize("argv,message", [(["--rounds", "0"], "must be positive"),
                                          (["--out", "/proc/self/x.json"], "--out /proc/self/x.json: cannot write "
                                                                           "there (")])
def test_a_bad_flag_is_one_line_and_exit_2(argv, message, capsys):
    assert loop_cost.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.fixture
def never_measured(monkeypatch):
    """A refusal must come before the minutes of measuring: measuring fails the test."""
    monkeypatch.setattr(loop_cost, "measure", lambda *args: pytest.fail("measured before refusing"))


def test_an_existing_out_file_is_refused_and_kept_unless_overwrite(tmp_path, capsys, never_measured, monkeypatch):
    (tmp_path / "x.json").write_text("hand-edited\n", encoding="utf-8")
    assert loop_cost.main(["--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err == f"error: --out {tmp_path / 'x.json'}: exists; pass --overwrite to replace it\n"
    assert (tmp_path / "x.json").read_text(encoding="utf-8") == "hand-edited\n"
    piece = {"ms": 1.0, "ci95_ms": [1.0, 1.0]}
    doc = {"shape": {"batch": 1, "steps": 1, "hidden": 1, "input": 1}, "rounds": 1, "pieces": {"xla: dots": piece},
           "differences": {"a difference": piece}}
    monkeypatch.setattr(loop_cost, "measure", lambda *args: doc)
    assert loop_cost.main(["--out", str(tmp_path / "x.json"), "--overwrite"]) == 0
    assert json.loads((tmp_path / "x.json").read_text(encoding="utf-8")) == doc


@pytest.mark.parametrize("make, message", [
    (lambda d: d, "is a directory"),
    (lambda d: (d / "f").write_text("mine", encoding="utf-8") and d / "f" / "x.json", "is a file)"),
])
def test_an_out_that_cannot_hold_the_file_is_refused_before_measuring(tmp_path, capsys, never_measured, make,
                                                                      message):
    out = make(tmp_path)
    assert loop_cost.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out}: ") and err.endswith(f"{message}\n") and err.count("\n") == 1


@pytest.mark.parametrize("argv, sizes", [
    (["--hidden", "1000000000"], "--batch 50, --steps 200, --hidden 1000000000 and --input 256"),
    (["--hidden", "100000"], "--batch 50, --steps 200, --hidden 100000 and --input 256"),
    (["--steps", str(10**12)], f"--batch 50, --steps {10**12}, --hidden 256 and --input 256"),
])
def test_sizes_beyond_the_memory_are_refused_in_one_line_before_measuring(argv, sizes, capsys, never_measured):
    assert loop_cost.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {sizes} need about ") and err.count("\n") == 1
    assert err.endswith(" this process can have; make the largest of them smaller\n")


def test_the_memory_estimate_counts_the_gates_inputs_and_weights():
    # B 2, T 3, H 4, D 5: 6 steps × (5 gate arrays × 16 + 2 inputs × 5) + 3 weight copies × 16 × 9, float32
    assert loop_cost.needed_bytes(2, 3, 4, 5) == 4 * (6 * (5 * 16 + 2 * 5) + 3 * 16 * 9)


def test_a_size_xla_cannot_even_describe_is_one_line_from_the_real_command_line():
    proc = subprocess.run([sys.executable, "-m", "studies.loop_cost", "--hidden", "1000000000"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""  # not SIGABRT (-6) from XLA's C++
    assert proc.stderr.startswith("error: --batch 50, --steps 200, --hidden 1000000000 and --input 256 need about ")
    assert proc.stderr.count("\n") == 1

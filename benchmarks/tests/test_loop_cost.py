"""The loop-cost decomposition: its differences are per-round arithmetic on the pieces, and every piece runs."""
import numpy as np
import pytest

from benchmarks import loop_cost


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
                                          (["--out", "/nonexistent/x.json"], "no folder /nonexistent")])
def test_a_bad_flag_is_one_line_and_exit_2(argv, message, capsys):
    assert loop_cost.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err

"""The shared CLI pieces: cli_main's one-line errors and the predict output format."""
from __future__ import annotations

import json

import numpy as np
import pytest

from common.errors import ConfigError, DataError, cli_main
from common.predict import format_predictions, is_positive, predict_parser


def test_cli_main_turns_a_user_error_into_one_line_and_status_2(capsys):
    @cli_main
    def main():
        raise DataError("corpus.csv: line 3: unknown label 'x'")

    assert main() == 2
    captured = capsys.readouterr()
    assert captured.err == "error: corpus.csv: line 3: unknown label 'x'\n" and captured.out == ""


def test_cli_main_returns_0_when_main_returns_nothing():
    assert cli_main(lambda: None)() == 0


def test_cli_main_lets_programming_errors_through():
    @cli_main
    def main():
        raise KeyError("a bug, not a user error")

    with pytest.raises(KeyError):
        main()


def test_predictions_are_positive_above_one_half_and_exactly_half_is_negative():
    out = format_predictions(["好", "bad", "meh"], [0.5000001, 0.25, 0.5], as_json=False)
    assert out == "0.5000\tpositive\t好\n0.2500\tnegative\tbad\n0.5000\tnegative\tmeh"


def test_the_decision_rule_is_the_seeds_round():
    probs = np.array([0.0, 0.25, 0.5, 0.5000001, 0.75, 1.0], np.float32)
    assert is_positive(probs).tolist() == (np.round(probs) == 1).tolist() == [False, False, False, True, True, True]


def test_predictions_as_json_keep_non_ascii_text():
    out = format_predictions(["好"], [0.9], as_json=True)
    assert "好" in out and json.loads(out) == [{"text": "好", "prob": 0.9, "label": "positive"}]


def test_predict_parser_errors_are_config_errors():
    with pytest.raises(ConfigError):
        predict_parser("predict").parse_args(["ckpt"])  # no texts

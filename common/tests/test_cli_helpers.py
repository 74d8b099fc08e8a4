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


def test_no_command_line_parses_with_plain_argparse():
    # argparse's own error is two lines (usage, then the message) and exits by itself; the project's Parser raises
    # ConfigError instead, which cli_main prints as one line.
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sources = [p for package in ("common", "torch_impl", "jax_impl", "benchmarks", "parity_tests", "scripts")
               for p in (root / package).rglob("*.py") if "tests" not in p.relative_to(root).parts]
    plain = [f"{p.relative_to(root)}: {m.group()}" for p in sources
             for m in re.finditer(r"\bArgumentParser\(|parse_known_args", p.read_text(encoding="utf-8"))]
    assert len(sources) > 40 and plain == []


def test_a_count_option_below_its_minimum_is_one_line_naming_the_option():
    from common.config import Parser, int_at_least

    parser = Parser(prog="python -m tool")
    parser.add_argument("--steps", type=int_at_least(1))
    assert parser.parse_args(["--steps", "1"]).steps == 1
    with pytest.raises(ConfigError) as refused:
        parser.parse_args(["--steps", "0"])
    assert str(refused.value) == "python -m tool: argument --steps: must be > 0, got 0"
    with pytest.raises(ConfigError, match="argument --steps: invalid int value: '1.5'"):
        parser.parse_args(["--steps", "1.5"])


def test_a_count_option_above_its_maximum_is_one_line_naming_the_range():
    from common.config import Parser, int_at_least

    parser = Parser(prog="python -m tool")
    parser.add_argument("--steps", type=int_at_least(1, 10))
    assert parser.parse_args(["--steps", "10"]).steps == 10
    with pytest.raises(ConfigError) as refused:
        parser.parse_args(["--steps", "11"])
    assert str(refused.value) == "python -m tool: argument --steps: must be between 1 and 10, got 11"


@pytest.mark.parametrize("twin", ["torch_impl", "jax_impl"])
def test_predict_refuses_more_words_than_its_bound_before_reading_the_checkpoint(tmp_path, twin):
    from common.predict import MAX_WORDS
    from common.tests.conftest import run_python

    proc = run_python(["-m", f"{twin}.predict", str(tmp_path / "absent"), "中国", "--words", "1000000000"])
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: python -m {twin}.predict: argument --words: must be between 1 and {MAX_WORDS}, "
                           f"got 1000000000\n")


@pytest.mark.slow
@pytest.mark.parametrize("argv, status", [(["--steps", "x"], 2), (["--help"], 0)])
def test_the_float64_runner_errs_in_one_line_and_helps_with_status_0(argv, status):
    # A process of its own: importing the runner switches on JAX's process-wide x64 mode.
    from common.tests.conftest import run_python

    proc = run_python(["-m", "parity_tests.float64_run", *argv])
    assert proc.returncode == status
    if status:
        assert proc.stderr == "error: python -m parity_tests.float64_run: argument --steps: invalid int value: 'x'\n"
    else:
        assert proc.stdout.startswith("usage: python -m parity_tests.float64_run [-h] [--steps STEPS]")

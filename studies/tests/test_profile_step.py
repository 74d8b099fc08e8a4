"""The op-by-op profile's command line: --steps is its own documented option, counts below 1 and the Config flags it
does not act on are refused in one line, before any data is read or anything compiled."""
from __future__ import annotations

import pytest

from studies import profile_step

PROG = "python -m studies.profile_step"


@pytest.mark.parametrize("steps, why", [("0", "must be > 0, got 0"), ("-5", "must be > 0, got -5"),
                                        ("x", "invalid int value: 'x'")])
def test_a_step_count_below_one_or_not_a_number_is_one_line_and_exit_2(capsys, steps, why):
    assert profile_step.main(["--steps", steps]) == 2
    assert capsys.readouterr().err == f"error: {PROG}: argument --steps: {why}\n"


@pytest.mark.parametrize("argv", [["--metrics-out", "m.jsonl"], ["--save-dir", "best"], ["--resume", "runs/x"],
                                  ["--checkpoint-every", "10"], ["--keep-checkpoints", "2"], ["--overwrite"],
                                  ["--epochs", "2"], ["--max-steps", "5"], ["--log-every", "1"], ["--no-progress"]])
def test_a_config_flag_it_does_not_act_on_is_an_unknown_argument(capsys, argv):
    assert profile_step.main(argv) == 2
    assert capsys.readouterr().err == f"error: {PROG}: unrecognized arguments: {' '.join(argv)}\n"


def test_the_model_and_init_from_flags_are_accepted():
    ns = profile_step.build_parser().parse_args(["--steps", "7", "--hidden-dim", "8", "--init-from", "ckpt"])
    assert (ns.steps, ns.hidden_dim, ns.init_from) == (7, 8, "ckpt")


def test_help_lists_steps_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        profile_step.main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and out.startswith(f"usage: {PROG} ")
    assert "--steps STEPS" in out and "--metrics-out" not in out

"""studies.ctrl_c_window sorts each try's outcome and finds the delay from which Ctrl-C is always one line."""
import sys

from studies import ctrl_c_window
from studies.ctrl_c_window import OUTCOMES, window


def _row(**counts: int) -> dict[str, int]:
    return {**dict.fromkeys(OUTCOMES, 0), **counts}


def test_the_window_is_the_smallest_delay_from_which_every_later_try_gave_one_line():
    counts = {0: _row(killed=3), 10: _row(line=3), 20: _row(line=2, python=1), 30: _row(line=3), 40: _row(line=3)}
    assert window(counts) == 30


def test_no_window_where_the_largest_delay_still_failed():
    assert window({0: _row(line=3), 10: _row(line=2, traceback=1)}) is None


def test_a_traceback_outside_the_projects_code_is_pythons_own():
    program = [sys.executable, "-c", "import time; time.sleep(60)"]  # interrupted in its sleep: Python's traceback
    assert ctrl_c_window.outcome(program, delay_s=1.0) == "python"

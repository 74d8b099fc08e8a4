"""Ctrl-C reaches a benchmark worker only from a parent that stops a whole process tree (``scripts/gpu_check.py``):
the worker says one line, in its log, and exits 130, never a traceback."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_worker_interrupted_in_its_main_says_one_line_and_exits_130():
    # Bench() enters its ExitStack first thing in the worker's main, before the first request is read.
    proc = subprocess.run([sys.executable, "-m", "common.tests.interrupt_program", "call:contextlib:ExitStack",
                           "benchmarks.worker", "torch"], cwd=REPO, input='{"op": "quit"}\n', capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "interrupted\n")

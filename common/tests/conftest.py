"""Shared helpers for the tests of ``common``: small corpora written in code, and the data CLI in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_python(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository root with this interpreter (a fresh process: clean sys.modules)."""
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


# Runs ``python ARGS`` without the two Linux capabilities by which root reads and lists what file modes forbid
# (CAP_DAC_OVERRIDE 1 and CAP_DAC_READ_SEARCH 2, capabilities(7)): dropped from its bounding set (prctl
# PR_CAPBSET_DROP, 24), then the program exec'd, which keeps root's others. A process of its own, not a preexec_fn: the
# test process may run threads (JAX's), which a fork before exec would copy in whatever state they are in.
_WITHOUT_READ_OVERRIDE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in (1, 2):
    if libc.prctl(24, cap, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(ctypes.get_errno())}")
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def run_python_bound_by_modes(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """:func:`run_python`, the program bound by file modes even where the tests run as root (who reads any file):
    its capabilities to ignore them dropped (a user who is not root has none to drop). Skips the test where they
    cannot be dropped (a container without CAP_SETPCAP)."""
    if os.geteuid() != 0:
        return run_python(args, timeout)
    probe = run_python(["-c", _WITHOUT_READ_OVERRIDE, "-c", "pass"])
    if probe.returncode != 0:
        pytest.skip(f"root here cannot drop its capability to read any file ({probe.stderr.strip()}), so no file is "
                    f"unreadable to it")
    return run_python(["-c", _WITHOUT_READ_OVERRIDE, *args], timeout)


@pytest.fixture
def data_cli() -> Callable[..., subprocess.CompletedProcess]:
    """``python -m common.data ARGS`` in a subprocess."""
    return lambda *args: run_python(["-m", "common.data", *map(str, args)])


@pytest.fixture
def python_code() -> Callable[[str], subprocess.CompletedProcess]:
    """Run a snippet of Python in a fresh interpreter."""
    return lambda code: run_python(["-c", code])


def write_table(path: Path, rows: list[tuple[str, str]], header: tuple[str, str] = ("text", "label")) -> Path:
    """A CSV (or TSV, by the suffix) with a header row, quoted the way the csv module quotes."""
    import csv

    delimiter = "\t" if path.suffix == ".tsv" else ","
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture
def table_file() -> Callable[..., Path]:
    return write_table


def numbered_corpus(n: int) -> tuple[list[str], list[int]]:
    """``n`` distinct English texts, each with one token of its own (``wI``), alternating labels."""
    return [f"w{i} shared words here" for i in range(n)], [i % 2 for i in range(n)]


@pytest.fixture
def corpus_csv(tmp_path: Path) -> Callable[[int], Path]:
    """A CSV of :func:`numbered_corpus` ``(n)``."""

    def make(n: int) -> Path:
        texts, labels = numbered_corpus(n)
        return write_table(tmp_path / f"corpus{n}.csv", [(t, str(y)) for t, y in zip(texts, labels)])

    return make

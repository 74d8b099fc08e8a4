"""The GEMM microbenchmark: one table row per candidate, each a positive GFLOP/s; a bad flag, a missing cmake or a
damaged library is one line and exit 2."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jax_impl.recurrences import kernel, native
from studies import gemm_choice


@pytest.mark.skipif(native.unavailable("lstm_kernel") is not None, reason=str(native.unavailable("lstm_kernel")))
def test_every_candidate_gets_a_row_with_a_positive_rate(capsys):
    assert gemm_choice.main(["--reps", "3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "GEMM |" not in line]
    names = [row.split(" | ")[0].removeprefix("| ") for row in rows]
    assert names == [*gemm_choice.BACKENDS.values(), *gemm_choice.TILES.values(),
                     "XLA's dot in a fori_loop (its own threads)"]
    rates = [[float(x) for x in re.findall(r"\| (\d+)(?= \|)", row)] for row in rows]
    runs = [int(kernel.library().lstm_kernel_supported(kernel.ISAS.index(isa))) for isa in gemm_choice.TILES]
    assert [len(r) for r in rates] == [2, 2, 2, *runs, 1] and all(x > 0 for r in rates for x in r), rows


@pytest.mark.parametrize("reps, why", [("0", "must be > 0, got 0"), ("x", "invalid int value: 'x'")])
def test_a_bad_repetition_count_is_one_line_and_exit_2(capsys, reps, why):
    assert gemm_choice.main(["--reps", reps]) == 2
    assert capsys.readouterr().err == f"error: python -m studies.gemm_choice: argument --reps: {why}\n"


def test_help_names_the_module_invocation_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        gemm_choice.main(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m studies.gemm_choice [-h] [--reps REPS]")


def test_without_cmake_the_study_says_so_in_one_line_and_exits_2(capsys, monkeypatch):
    monkeypatch.setattr(gemm_choice.shutil, "which", lambda name, path=None: None)
    assert gemm_choice.main(["--reps", "3"]) == 2
    assert capsys.readouterr().err == ("error: cmake not found: this study builds its C++ with it; install it (pip "
                                       "install cmake, which make setup does)\n")


def test_a_damaged_library_is_refused_in_one_line_naming_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(gemm_choice, "BUILD", tmp_path)
    monkeypatch.setattr(gemm_choice.subprocess, "run", lambda step, **_: subprocess.CompletedProcess(step, 0))
    (tmp_path / "libgemm_choice.so").write_bytes(b"not a library")
    assert gemm_choice.main(["--reps", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'libgemm_choice.so'} cannot be loaded (") and err.count("\n") == 1


@pytest.mark.skipif(shutil.which("cmake", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
                    is None, reason="no cmake beside the interpreter or on PATH")
def test_the_library_builds_with_cmake_into_build_studies():
    lib = gemm_choice.library()
    assert lib._name == str(gemm_choice.ROOT / "build" / "studies" / "libgemm_choice.so")

"""The GEMM microbenchmark: one table row per candidate, each a positive GFLOP/s; a bad flag is one line and exit 2."""
import re

import pytest

from benchmarks import gemm_choice
from jax_impl.recurrences import kernel, native


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
    assert capsys.readouterr().err == f"error: python -m benchmarks.gemm_choice: argument --reps: {why}\n"


def test_help_names_the_module_invocation_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        gemm_choice.main(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m benchmarks.gemm_choice [-h] [--reps REPS]")

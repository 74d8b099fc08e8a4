"""The timing statistics and block helpers, on synthetic numbers."""
import pytest

from benchmarks.timing import choose_block, run_blocks, summarise


def test_summarise_gives_median_and_quartiles_per_step():
    stats = summarise([0.3, 0.1, 0.5, 0.2, 0.4], block=1)
    # numpy's linear percentiles of 0.1..0.5: p25 0.2, median 0.3, p75 0.4 (exact up to float rounding).
    assert stats.median == pytest.approx(0.3, abs=1e-12)
    assert stats.p25 == pytest.approx(0.2, abs=1e-12)
    assert stats.p75 == pytest.approx(0.4, abs=1e-12)
    assert (stats.steps, stats.block) == (5, 1)


def test_summarise_divides_block_times_by_the_block_size():
    stats = summarise([2.0, 4.0, 6.0, 8.0], block=2)  # per step 1, 2, 3, 4
    assert (stats.p25, stats.median, stats.p75) == pytest.approx((1.75, 2.5, 3.25), abs=1e-12)
    assert stats.steps == 8


def test_summarise_refuses_no_blocks():
    with pytest.raises(ValueError):
        summarise([], block=1)


def test_choose_block_keeps_slow_steps_single_and_groups_fast_ones():
    assert choose_block(1.0, steps=20) == 1  # a 1 s step: one step per block
    assert choose_block(0.001, steps=1000) == 50  # 1 ms steps: 50 per block reach 0.05 s
    assert choose_block(0.001, steps=20) == 2  # but never fewer than 10 blocks


def test_run_blocks_synchronises_once_per_block_and_counts_steps():
    calls, syncs = [], []
    times = run_blocks(lambda i: calls.append(i) or i, syncs.append, steps=7, block=3)
    assert calls == list(range(9))  # 7 steps round up to 3 whole blocks of 3
    assert syncs == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert len(times) == 3 and all(t >= 0 for t in times)

"""The statistics: spreads, round means, and the paired and unpaired ratios with their bootstrap intervals."""
import numpy as np
import pytest

from benchmarks import stats
from benchmarks.schema import Spread


def test_a_spread_is_the_median_and_the_quartiles_and_nothing_without_times():
    assert stats.spread([1.0, 2.0, 3.0, 4.0]) == Spread(2.5, 1.75, 3.25)  # numpy's linear percentiles
    assert stats.spread([]) is None


def test_round_means_average_the_replicates_over_the_rounds_all_of_them_have():
    assert stats.round_means([[1.0, 2.0, 3.0], [3.0, 4.0]]).tolist() == [2.0, 3.0]


def test_paired_ratio_is_the_median_per_round_ratio_with_a_bootstrap_interval():
    ratio, (low, high) = stats.paired_ratio([[2.0, 2.0, 2.0, 2.0, 2.0]], [[1.0, 1.0, 1.0, 1.0, 1.0]])
    assert (ratio, low, high) == (2.0, 2.0, 2.0)  # no spread, no width
    base = np.array([1.0, 1.1, 0.9, 1.2, 1.0, 0.95, 1.05])
    ratio, (low, high) = stats.paired_ratio([base], [base / np.array([1.5, 1.4, 1.6, 1.5, 1.3, 1.7, 1.5])])
    assert ratio == pytest.approx(1.5) and low < 1.5 < high + 1e-12 and 1.3 <= low and high <= 1.7


def test_the_interval_widens_when_replicates_disagree_though_every_round_agrees_within_each():
    # Two workers of the variant: one twice as fast as the other in every round. Resampling rounds alone sees
    # no spread; resampling the replicates too spans from both slow (ratio 1) to both fast (ratio 2).
    base = [[1.0] * 8, [1.0] * 8]
    ratio, (low, high) = stats.paired_ratio(base, [[1.0] * 8, [0.5] * 8])
    assert ratio == pytest.approx(1 / 0.75) and (low, high) == pytest.approx((1.0, 2.0))
    assert stats.paired_ratio(base, [[0.75] * 8, [0.75] * 8])[1] == pytest.approx([1 / 0.75, 1 / 0.75])


def test_an_unpaired_ratio_is_the_ratio_of_medians_with_each_sides_rounds_resampled_apart():
    slow, fast = [0.2, 0.21, 0.19, 0.2, 0.2], [0.1, 0.1, 0.11, 0.09, 0.1]
    ratio, (low, high) = stats.unpaired_ratio(slow, fast, np.random.default_rng(0))
    assert ratio == pytest.approx(2.0)
    # Resampled medians lie within 0.19–0.21 over 0.09–0.11: the interval within 1.73–2.33, around 2.
    assert 0.19 / 0.11 <= low <= 2.0 <= high <= 0.21 / 0.09
    assert stats.unpaired_ratio([0.2] * 5, [0.1] * 5, np.random.default_rng(0)) == (2.0, [2.0, 2.0])

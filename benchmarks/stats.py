"""The bench's statistics: a time's spread over rounds, each round's mean over the replicates, and the ratios with
their 95% percentile-bootstrap intervals, paired (one session's rounds) or unpaired (two sessions').

A variant runs in several worker processes (replicates) whose rounds interleave with the baseline's. A paired ratio is
the median over rounds of baseline / variant, each side the mean of its replicates in that round (above 1: the
variant is faster); its interval comes from a two-level bootstrap: each side's replicates resampled, then the rounds,
so that it covers the spread between worker processes as well as the spread between rounds."""
from typing import Sequence

import numpy as np

from benchmarks.schema import Spread

RESAMPLES = 10_000
METHOD = (f"median over paired, interleaved rounds of baseline s / variant s, each the mean of its replicates; 95% "
          f"interval: two-level percentile bootstrap, replicates then rounds ({RESAMPLES} resamples, seed 0)")


def median_ci(samples: np.ndarray, rng: np.random.Generator) -> dict:
    """Median of ``samples`` (seconds, one per round) in ms and its 95% percentile-bootstrap interval over the rounds
    (the benchmarks' one-process measurements: loop_cost, rng_cost)."""
    draws = np.median(rng.choice(samples, (RESAMPLES, len(samples))), axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"ms": float(np.median(samples)) * 1e3, "ci95_ms": [float(low) * 1e3, float(high) * 1e3]}


def spread(times: Sequence[float]) -> Spread | None:
    """Median, p25 and p75 of ``times`` (seconds), or None without any."""
    return Spread(*(float(x) for x in np.percentile(times, [50, 25, 75]))) if len(times) else None


def round_means(replicates: Sequence[Sequence[float]]) -> np.ndarray:
    """Seconds per [replicate][round] → each round's mean over the replicates, over the rounds all of them have."""
    n = min(map(len, replicates))
    return np.mean([r[:n] for r in replicates], axis=0)


def paired_ratio(base_s: Sequence[Sequence[float]], variant_s: Sequence[Sequence[float]],
                 seed: int = 0) -> tuple[float, list[float]]:
    """``(ratio, [low, high])`` from seconds per [replicate][round] of each side, rounds paired by index: the median
    over rounds of mean(base) / mean(variant), and its 95% two-level bootstrap interval."""
    n = min(len(r) for r in (*base_s, *variant_s))
    b, v = (np.asarray([r[:n] for r in x], dtype=np.float64) for x in (base_s, variant_s))  # (replicates, n)
    rng = np.random.default_rng(seed)
    reps_b, reps_v = (rng.integers(0, len(x), size=(RESAMPLES, len(x))) for x in (b, v))
    per_round = b[reps_b].mean(axis=1) / v[reps_v].mean(axis=1)  # (RESAMPLES, n)
    picked = np.take_along_axis(per_round, rng.integers(0, n, size=(RESAMPLES, n)), axis=1)
    low, high = np.percentile(np.median(picked, axis=1), [2.5, 97.5])
    return float(np.median(b.mean(axis=0) / v.mean(axis=0))), [float(low), float(high)]


def unpaired_ratio(a_s: Sequence[float], b_s: Sequence[float], rng: np.random.Generator) -> tuple[float, list[float]]:
    """``(ratio, [low, high])`` of two sessions' seconds per round, which no round pairs: median(a) / median(b), and
    its 95% percentile bootstrap interval, each side's rounds resampled apart. ``rng`` is the caller's, so that the
    lines of one report draw one stream from one seed."""
    a, b = np.asarray(a_s, dtype=np.float64), np.asarray(b_s, dtype=np.float64)
    draws = [np.median(rng.choice(x, (RESAMPLES, len(x))), axis=1) for x in (a, b)]
    low, high = np.percentile(draws[0] / draws[1], [2.5, 97.5])
    return float(np.median(a) / np.median(b)), [float(low), float(high)]

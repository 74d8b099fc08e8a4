"""The parity report: every comparison adds one row (what was compared, the measured difference, the
tolerance, pass/fail), and ``conftest.py`` prints the rows as a table at the end of the pytest session.

A test records a row *and* asserts with the same call, so the table and the verdicts cannot disagree::

    report.within("forward probs (left)", max_abs_diff, 1e-5)   # diff <= tolerance
    report.at_least("truncation changes grads", diff, 1e-4)     # a difference that must be there
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Row:
    check: str
    value: float
    bound: float
    kind: str  # "<=": a difference within a tolerance; ">=": an effect that must be at least this big
    passed: bool


ROWS: list[Row] = []


def _record(check: str, value: float, bound: float, kind: str) -> Row:
    value = float(value)
    passed = value <= bound if kind == "<=" else value >= bound  # NaN compares False: a NaN fails
    row = Row(check, value, float(bound), kind, bool(passed))
    ROWS.append(row)
    return row


def within(check: str, diff: float, tol: float) -> None:
    """Record ``diff`` against ``tol`` and assert ``diff <= tol`` (NaN fails)."""
    row = _record(check, diff, tol, "<=")
    assert row.passed, f"{check}: difference {row.value:.3g} exceeds the tolerance {tol:.3g}"


def at_least(check: str, value: float, bound: float) -> None:
    """Record an effect that must be present (e.g. truncation changes the gradient) and assert it."""
    row = _record(check, value, bound, ">=")
    assert row.passed, f"{check}: {row.value:.3g} is below the required {bound:.3g}"


def max_abs_diff(a, b) -> float:
    """max |a - b| over all elements, in float64 (NaN if either side has a NaN, so a NaN fails)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size == 0:
        return 0.0
    d = np.abs(a - b)
    return math.nan if np.isnan(d).any() else float(d.max())


def _number(x: float) -> str:
    if math.isnan(x):
        return "nan"
    return "0" if x == 0 else f"{x:.2e}"


def format_table(rows: list[Row]) -> list[str]:
    """The rows as fixed-width text lines: check | measured | tolerance | result."""
    header = ("check", "max diff", "tolerance", "result")
    body = [(r.check, _number(r.value), ("" if r.kind == "<=" else ">= ") + _number(r.bound),
             "pass" if r.passed else "FAIL") for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(4)]

    def fmt(line) -> str:
        return (f"{line[0]:<{widths[0]}}  {line[1]:>{widths[1]}}  {line[2]:>{widths[2]}}  "
                f"{line[3]:<{widths[3]}}").rstrip()

    rule = "-" * len(fmt(header))
    return [fmt(header), rule, *map(fmt, body), rule,
            f"{sum(r.passed for r in rows)} of {len(rows)} checks pass"]

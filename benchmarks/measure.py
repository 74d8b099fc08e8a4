"""One timed phase (training or inference steps): first step apart, warm-up untimed, then timed blocks.

Also the memory readings a phase reports: process peak RSS (``ru_maxrss``) on the CPU, the framework's
peak device allocation on a GPU.
"""
from __future__ import annotations

import resource
import sys
from typing import Any, Callable

from benchmarks.timing import choose_block, run_blocks, summarise, timed

PROGRESS_TAG = "@@progress"


def report_progress(n: int = 1) -> None:
    """Tell the parent process (which draws the progress bar) that ``n`` more steps are done."""
    print(f"{PROGRESS_TAG} {n}", file=sys.stdout, flush=True)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def current_rss_mb() -> float:
    """Resident set size now, in MiB (from /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def measure_phase(first: Callable[[], Any], step: Callable[[int], Any], sync: Callable[[list], None], *,
                  warmup: int, steps: int, block: int = 0) -> dict:
    """Time ``first()`` on its own (compilation, allocator and kernel set-up land here), run ``warmup``
    untimed calls ``step(i)``, then time ``steps`` calls in synchronised blocks.

    ``block=0`` chooses the block size from the last warm-up step (see :func:`timing.choose_block`).
    Returns ``first_step_s``, ``step_s`` (median/p25/p75 per step), ``steps`` and ``block``.
    """
    _, first_s = timed(first, sync)
    report_progress()
    estimate = first_s
    for i in range(warmup):
        _, estimate = timed(lambda: step(i), sync)
        report_progress()
    if block <= 0:
        block = choose_block(estimate, steps)
    seconds = run_blocks(lambda i: step(warmup + i), sync, steps, block, on_step=report_progress)
    stats = summarise(seconds, block)
    return {"first_step_s": first_s, "step_s": {"median": stats.median, "p25": stats.p25, "p75": stats.p75},
            "steps": stats.steps, "block": stats.block}

"""Timing in synchronised blocks, and the statistics reported per step.

A block runs ``block`` steps back to back and synchronises once at its end (``jax.block_until_ready`` /
``torch.cuda.synchronize``), so asynchronous dispatch can overlap steps inside a block as it does in a
training loop, and the clock never stops before the device has finished. Per-step times are block
times divided by the block size; with blocks of one step they are single-step times.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class StepStats:
    """Seconds per step over the timed blocks: median and the 25th/75th percentiles (linear interpolation)."""

    median: float
    p25: float
    p75: float
    steps: int  # steps timed (blocks × block)
    block: int  # steps per synchronised block


def summarise(block_seconds: Sequence[float], block: int) -> StepStats:
    """Per-step statistics from the wall time of each block of ``block`` steps."""
    if not block_seconds:
        raise ValueError("no timed blocks")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    per_step = np.asarray(block_seconds, dtype=np.float64) / block
    p25, median, p75 = np.percentile(per_step, [25, 50, 75])
    return StepStats(float(median), float(p25), float(p75), steps=len(block_seconds) * block, block=block)


def choose_block(step_estimate_s: float, steps: int, target_block_s: float = 0.05, min_blocks: int = 10) -> int:
    """Steps per block: enough that a block lasts ``target_block_s`` (so a synchronisation is a small
    share of it), but never so many that fewer than ``min_blocks`` blocks fit in ``steps``."""
    if step_estimate_s <= 0:
        wanted = steps
    else:
        wanted = math.ceil(target_block_s / step_estimate_s)
    return max(1, min(wanted, steps // min_blocks))


def run_blocks(step: Callable[[int], Any], sync: Callable[[list], None], steps: int, block: int,
               on_step: Callable[[], None] | None = None) -> list[float]:
    """Run ``ceil(steps / block)`` blocks of ``block`` calls ``step(i)`` (``i`` counts from 0 over all blocks);
    ``sync(outputs_of_the_block)`` ends each block. Returns each block's wall time in seconds."""
    blocks = math.ceil(steps / block)
    times = []
    i = 0
    for _ in range(blocks):
        outputs = []
        start = time.perf_counter()
        for _ in range(block):
            outputs.append(step(i))
            i += 1
        sync(outputs)
        times.append(time.perf_counter() - start)
        if on_step is not None:
            for _ in range(block):
                on_step()
    return times


def timed(fn: Callable[[], Any], sync: Callable[[list], None]) -> tuple[Any, float]:
    """``(fn(), seconds)`` with the output synchronised before the clock stops."""
    start = time.perf_counter()
    out = fn()
    sync([out])
    return out, time.perf_counter() - start

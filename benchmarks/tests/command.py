"""Running ``benchmarks/bench.py`` as users do: a subprocess from the repository root."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import bench

REPO = Path(__file__).resolve().parents[2]
BOTH = not bench.missing_modules("torch") and not bench.missing_modules("jax")  # both twins installed


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python benchmarks/bench.py ARGS`` from the repository root; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "benchmarks/bench.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)

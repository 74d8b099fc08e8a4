"""This machine's float32 matrix-product peak, measured in the same run as the benchmark.

Every worker, after its timings, times a large square float32 product with its framework's library
(``torch.matmul``, a jitted ``jnp.matmul``) and with numpy, best of ``GEMM_REPEATS``; the report keeps the
best of each library over the run and uses the highest on the benchmark device as the peak, so
utilisation = achieved model FLOP/s / measured peak.
"""
from __future__ import annotations

import time

import numpy as np

# Side of the square matrices: large enough to reach the library's best rate, small enough to be quick.
GEMM_N = {"cpu": 2048, "cuda": 8192}
GEMM_N_QUICK = 512
GEMM_REPEATS = 8


def gemm_size(device: str, quick: bool) -> int:
    """The side of the product for the resolved device ('cpu' or 'cuda')."""
    return GEMM_N_QUICK if quick else GEMM_N.get(device, GEMM_N["cpu"])


def numpy_gemm_gflop_s(n: int, repeats: int = GEMM_REPEATS) -> float:
    """Best float32 ``(n, n) @ (n, n)`` rate of numpy's BLAS, GFLOP/s."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def combine(measurements: dict[str, dict], device: str) -> dict:
    """The peak from per-backend measurements ``{backend: {"gflop_s", "n", "device"}}``: the highest
    among those on the benchmark ``device`` (numpy counts on the CPU only)."""
    on_device = {k: v for k, v in measurements.items() if v.get("device") == device}
    if not on_device:
        return {"gflop_s": None, "backend": None, "measurements": measurements}
    best = max(on_device, key=lambda k: on_device[k]["gflop_s"])
    return {"gflop_s": on_device[best]["gflop_s"], "backend": best, "measurements": measurements}

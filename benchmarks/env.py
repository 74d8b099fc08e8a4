"""The environment block of a report, and the process environment each benchmark worker starts with.

Nothing here imports a framework: versions come from the installed packages' metadata, so the parent
process stays light and a missing framework is reported instead of failing the import.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from datetime import datetime, timezone

PACKAGES = ("jax", "jaxlib", "flax", "optax", "torch", "numpy")
# What each twin needs importable, besides numpy.
FRAMEWORK_MODULES = {"torch": ("torch",), "jax": ("jax", "flax", "optax")}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity), which is what the thread pools size themselves to."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_modules(framework: str) -> list[str]:
    """The modules ``framework`` ('torch' or 'jax') needs that are not installed."""
    return [m for m in FRAMEWORK_MODULES[framework] if importlib.util.find_spec(m) is None]


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none): other work competing for the CPUs."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def environment() -> dict:
    """Machine, software versions and date; devices are added from the workers' reports."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {name: package_version(name) for name in PACKAGES},
        "load_average_start": load_average(),
    }


def worker_environ(threads: int, device: str, cache_dir: str) -> dict[str, str]:
    """The environment of a worker process, fixed before any framework is imported.

    Thread pools: OpenMP/MKL/OpenBLAS (PyTorch's CPU kernels, numpy) read ``*_NUM_THREADS``; XLA's CPU
    client sizes its intra-op pool from the CPUs the process may use, which the worker pins to ``threads``
    CPUs. ``device='cpu'`` keeps JAX on the CPU even where a GPU is visible. Compilation caches point to
    an empty directory, so every compile time is a cold compile.
    """
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    if device == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif device == "gpu":
        env.setdefault("JAX_PLATFORMS", "cuda")
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env

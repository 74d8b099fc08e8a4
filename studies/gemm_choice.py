"""Which GEMM the recurrence kernel runs: ``python -m studies.gemm_choice [--reps N]``.

Times one recurrence step's product, (B, H)·(H, 4H) at the seed's (50, 256)·(256, 1024), the way
``jax_impl/recurrences/native/lstm_kernel.cc`` runs it (a team of threads, each computing its own columns, meeting at a
barrier after every product), for each candidate library in this environment: OpenBLAS's sgemm (scipy-openblas32, the
kernel's BLAS) and, where torch is installed, MKL's packed GEMM and plain sgemm (from libtorch_cpu, which exports
them), on one thread and on the team; then the kernel's own register tiles on each vector width the CPU runs (AVX-512,
AVX2), on the team, as its forward runs them; for reference, XLA's own dot on the same shapes, chained as in a loop.
Prints one Markdown table (docs/performance.md records the figures): the kernel runs its tiles where the CPU
has AVX2 or AVX-512, and OpenBLAS elsewhere.
"""
import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import interrupts
from common.config import Parser, int_at_least
from common.errors import ConfigError, cli_main

PROG = "python -m studies.gemm_choice"
ROOT = Path(__file__).resolve().parents[1]
SOURCE, BUILD = ROOT / "studies" / "native", ROOT / "build" / "studies"  # the library's CMake project, its build
SHAPE = (50, 256, 1024)  # M, K, N: B, H and 4H at the seed's sizes
BACKENDS = {"openblas_sgemm": "OpenBLAS sgemm (scipy-openblas32, the kernel's)",
            "mkl_packed": "MKL cblas_sgemm_pack + cblas_sgemm_compute (torch's)", "mkl_sgemm": "MKL sgemm (torch's)"}
TILES = {"avx512": "lstm_kernel's AVX-512 register tiles", "avx2": "lstm_kernel's AVX2 register tiles"}


def backend_library(backend: str) -> str:
    """The library a backend is loaded from: scipy-openblas32's OpenBLAS, or the installed torch's libtorch_cpu
    (which exports MKL); '' where it is not installed."""
    if backend == "openblas_sgemm":
        try:
            import scipy_openblas32
        except ImportError:
            return ""
        return str(Path(scipy_openblas32.get_lib_dir()) / scipy_openblas32.get_library(fullname=True))
    try:
        import torch.utils.cpp_extension as ext
    except ImportError:
        return ""
    return str(Path(ext.library_paths()[0]) / "libtorch_cpu.so")


def library() -> ctypes.CDLL:
    """The study's library, built first with CMake from ``studies/native/`` into :data:`BUILD` (an up-to-date build
    does nothing); :class:`ConfigError` where cmake is missing, the build fails or the library does not load."""
    cmake = shutil.which("cmake", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if cmake is None:
        raise ConfigError("cmake not found: this study builds its C++ with it; install it (pip install cmake, which "
                          "make setup does)")
    for step in ([cmake, "-S", str(SOURCE), "-B", str(BUILD)], [cmake, "--build", str(BUILD)]):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ConfigError(f"building {SOURCE} failed ({' '.join(step[1:])}): {last[0]}")
    try:
        lib = ctypes.CDLL(str(BUILD / "libgemm_choice.so"))
        lib.gemm_choice_gflops.restype = ctypes.c_double
    except (OSError, AttributeError) as err:  # a damaged library, or one without the study's function
        raise ConfigError(f"{BUILD / 'libgemm_choice.so'} cannot be loaded ({err}); remove {BUILD} and run "
                          "again") from None
    lib.gemm_choice_gflops.argtypes = [ctypes.c_char_p, *[ctypes.c_int] * 5, ctypes.c_char_p]
    return lib


def xla_gflops(reps: int) -> float:
    """XLA's dot chained ``reps`` times in a fori_loop (each product's input the sum of the previous one's four column
    blocks, so that no column can be skipped), best of 5, in GFLOP/s."""
    import jax
    import jax.numpy as jnp
    m, k, n = SHAPE
    a, b = jnp.full((m, k), 0.01, jnp.float32), jnp.full((k, n), 0.02, jnp.float32)
    chain = jax.jit(lambda a, b: jax.lax.fori_loop(
        0, reps, lambda _, x: jnp.dot(x, b, precision=jax.lax.Precision.HIGHEST).reshape(m, n // k, k).sum(1) * 1e-3,
        a))
    jax.block_until_ready(chain(a, b))
    best = min(_timed(lambda: jax.block_until_ready(chain(a, b))) for _ in range(5))
    return 2.0 * m * k * n * reps / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@cli_main
def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int_at_least(1), default=2000, help="products per timed run (default 2000)")
    args = parser.parse_args(argv)
    team = os.cpu_count() or 1
    lib, m, k, n = library(), *SHAPE
    print(f"(B, H)·(H, 4H) = ({m}, {k})·({k}, {n}), {args.reps} products per run, best of 5, GFLOP/s\n")
    print(f"| GEMM | 1 thread | team of {team} |")
    print("|---|---|---|")
    for name, what in BACKENDS.items():
        path = backend_library(name).encode()
        one, all_ = (lib.gemm_choice_gflops(name.encode(), m, k, n, t, args.reps, path) for t in (1, team))
        print(f"| {what} | " + " | ".join(f"{g:.0f}" if g > 0 else "n/a" for g in (one, all_)) + " |")
    from jax_impl.recurrences import kernel, native
    for isa, what in TILES.items():
        tiles = -1 if native.unavailable(kernel.NAME) else kernel.library().lstm_kernel_tile_gflops(
            kernel.ISAS.index(isa), m, k, args.reps)
        print(f"| {what} | | {f'{tiles:.0f}' if tiles > 0 else 'n/a'} |")
    print(f"| XLA's dot in a fori_loop (its own threads) | | {xla_gflops(max(1, args.reps // 4)):.0f} |")
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())

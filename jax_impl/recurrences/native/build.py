"""Build the JAX twin's native LSTM kernels: ``python -m jax_impl.recurrences.native.build [NAME ...]`` (``make setup``
runs it).

Each extension is one shared library of XLA FFI handlers, compiled by g++ against the FFI headers jaxlib ships
(``jax.ffi.include_dir()``) and whatever its library needs. A build that cannot run (no compiler, a library
missing) or fails is not an error of the set-up: it writes the reason next to where the library would be, and the
implementation that needs it is then ``n/a`` with that reason (:func:`jax_impl.recurrences.native.unavailable`). A
library that was built has its size in bytes and its SHA-256 on record, which
:func:`jax_impl.recurrences.native.validated` checks before the library is ever loaded. Every outcome is one line on
stdout, with the seconds it took.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from common import interrupts

interrupts.exit_on_ctrl_c(__name__)  # first: Ctrl-C while the imports below load is one line and exit 130

from common.errors import cli_main  # noqa: E402
from jax_impl.recurrences.native import library_path, sha256, status_path  # noqa: E402

HERE = Path(__file__).resolve().parent
COMPILE_TIMEOUT_S = 600  # a stuck compiler must not hang set-up


@dataclass(frozen=True)
class Extension:
    """``lib{name}.so`` from ``sources`` (in this folder); ``flags()`` → the extra compiler and linker arguments, or
    raises :class:`Missing` saying what is absent."""

    name: str
    sources: tuple[str, ...]
    flags: Callable[[], list[str]]
    what: str  # one line: what it is, for the build's report
    optimise: tuple[str, ...] = field(default=("-O2",))


class Missing(Exception):
    """Something an extension needs is not installed; the message says what."""


def ffi_include() -> str:
    import jax
    return jax.ffi.include_dir()


def torch_flags() -> list[str]:
    """ATen's headers and libraries from the installed torch, with an rpath to them: the library then loads without
    Python importing torch."""
    try:
        import torch
        import torch.utils.cpp_extension as ext
    except ImportError:
        raise Missing("torch is not installed (ATen's oneDNN LSTM comes from it)") from None
    lib = Path(ext.library_paths()[0])
    return [*(f"-I{d}" for d in ext.include_paths()), f"-L{lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"]


def onednn_flags() -> list[str]:
    """ATen's, and OpenMP's: the float rules are set on the OpenMP team oneDNN and MKL compute on, which is torch's
    (its ``libgomp.so.1``, found first through the rpath, is the one copy of that soname the process loads)."""
    return ["-fopenmp", *torch_flags()]


def openblas_flags() -> list[str]:
    """OpenBLAS from the scipy-openblas32 package the project installs (its symbols prefixed ``scipy_``, so it never
    meets numpy's or torch's BLAS), with an rpath to it."""
    try:
        import scipy_openblas32
    except ImportError:
        raise Missing("scipy-openblas32 is not installed (the kernel's BLAS); make setup installs it") from None
    lib = scipy_openblas32.get_lib_dir()
    return [f"-I{scipy_openblas32.get_include_dir()}", f"-L{lib}", f"-l{scipy_openblas32.get_library()}",
            f"-Wl,-rpath,{lib}"]


def libmvec_flags() -> list[str]:
    """glibc's vector math library: expf and tanhf on 8 and 16 lanes (tanhf from glibc 2.35)."""
    found = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    version = tuple(int(p) for p in found.split()[-1].split(".")[:2]) if found and found.startswith("glibc") else None
    if version is None or version < (2, 35):
        raise Missing(f"the kernel needs glibc 2.35 or later for its vector tanhf (libmvec), found {found or 'none'}")
    return ["-lmvec"]


def kernel_flags() -> list[str]:
    """OpenBLAS and libmvec, OpenMP for the team, and no contraction of a * b + c into one fused multiply-add, which
    would round differently from XLA (the tiles' FMAs are written out). Nothing from torch."""
    return ["-fopenmp", "-ffp-contract=off", *openblas_flags(), *libmvec_flags()]


EXTENSIONS = {e.name: e for e in (
    Extension("onednn_lstm", ("onednn_lstm.cc",), onednn_flags,
              "oneDNN's LSTM primitive through ATen's mkldnn_rnn_layer (the kernel torch:eager runs)"),
    Extension("lstm_kernel", ("lstm_kernel.cc", "lstm_step_avx512.cc", "lstm_step_avx2.cc", "lstm_step_portable.cc"),
              kernel_flags, "our LSTM recurrence: its own AVX-512 and AVX2 GEMM tiles (OpenBLAS elsewhere) with the "
              "gate math in the same pass, one team of threads", optimise=("-O3",)),
    Extension("gemm_choice", ("gemm_choice.cc",), lambda: ["-fopenmp", "-ldl"],
              "the microbenchmark that chose lstm_kernel's GEMM (python -m benchmarks.gemm_choice)"),
)}


def compile_command(ext: Extension, out: Path) -> list[str]:
    compiler = shutil.which("g++")
    if compiler is None:
        raise Missing("no g++ on PATH")
    return [compiler, "-std=c++17", *ext.optimise, "-shared", "-fPIC", "-Wno-attributes", f"-I{ffi_include()}",
            *(str(HERE / s) for s in ext.sources), *ext.flags(), "-o", str(out)]


def build(ext: Extension) -> dict:
    """Compile ``ext`` into the build folder (atomically: a failed build leaves no library); its status record."""
    library_path(ext.name).parent.mkdir(exist_ok=True)
    out, start = library_path(ext.name), time.perf_counter()
    record = {"name": ext.name, "what": ext.what, "built": False, "library": str(out)}
    try:
        command = compile_command(ext, out.with_suffix(".so.tmp"))
        record["command"] = " ".join(command)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if proc.returncode:
            lines = [x for x in proc.stderr.splitlines() if "error" in x] or proc.stderr.strip().splitlines() or ["?"]
            raise Missing(f"g++ failed: {lines[0].strip()[:300]}")
        built = out.with_suffix(".so.tmp")
        # What validated() compares the library with before it loads it.
        record["size"], record["sha256"] = built.stat().st_size, sha256(built)
        built.replace(out)
        record["built"] = True
    except Missing as err:
        record["reason"] = str(err)
    except subprocess.TimeoutExpired:
        record["reason"] = f"g++ took more than {COMPILE_TIMEOUT_S} s"
    finally:
        if not record["built"]:
            out.unlink(missing_ok=True)  # a library left from older sources would run against the new Python side
        out.with_suffix(".so.tmp").unlink(missing_ok=True)
    record["seconds"] = round(time.perf_counter() - start, 1)
    status_path(ext.name).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def main(names: Sequence[str]) -> int:
    unknown = [n for n in names if n not in EXTENSIONS]
    if unknown:
        print(f"error: no native extension {unknown[0]!r} (known: {', '.join(EXTENSIONS)})", file=sys.stderr)
        return 2
    for name in names or EXTENSIONS:
        r = build(EXTENSIONS[name])
        outcome = f"built {r['library']}" if r["built"] else f"not built ({r['reason']}); its --lstm-impl is n/a"
        print(f"native {name}: {outcome} in {r['seconds']} s")
    return 0  # a failed build leaves set-up working


if __name__ == "__main__":
    interrupts.exit_process(cli_main(main)(sys.argv[1:]))

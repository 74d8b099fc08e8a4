"""The JAX twin's native LSTM kernels: shared libraries of XLA FFI handlers that ``make setup`` builds
(:mod:`jax_impl.native.build`), loaded here on first use.

:func:`unavailable` says, without loading anything, why an extension cannot run here (``None`` when it can);
:func:`load` loads it and registers its FFI targets with XLA. Registration is process-wide state by nature (XLA keeps
one table of custom-call targets per process), so it happens once per process and extension.
"""
from __future__ import annotations

import ctypes
import functools
import json
import platform
from pathlib import Path

from common.errors import UnsupportedError

BUILD_DIR = Path(__file__).resolve().parent / "build"


def library_path(name: str) -> Path:
    return BUILD_DIR / f"lib{name}.so"


def status_path(name: str) -> Path:
    """The build's record of ``name``: built or not, why not, the command, the seconds."""
    return BUILD_DIR / f"{name}.json"


def unavailable(name: str) -> str | None:
    """Why extension ``name`` cannot run on this machine (not built, and the build's reason), or None."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the native {name} library is built for x86-64 CPUs only, not {platform.machine()}"
    if library_path(name).is_file():
        return None
    try:
        reason = json.loads(status_path(name).read_text(encoding="utf-8")).get("reason", "not built")
    except (OSError, ValueError):
        reason = "not built (make setup builds it)"
    return f"the native {name} library is not available: {reason}"


@functools.cache
def load(name: str, targets: tuple[str, ...]) -> ctypes.CDLL:
    """Extension ``name`` loaded, each of ``targets`` (symbols of XLA FFI handlers) registered under its own name for
    the CPU; an :class:`UnsupportedError` saying why where it cannot be."""
    import jax

    reason = unavailable(name)
    if reason:
        raise UnsupportedError(reason)
    try:
        library = ctypes.CDLL(str(library_path(name)))
    except OSError as err:
        raise UnsupportedError(f"the native {name} library does not load: {err}") from None
    for target in targets:
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)), platform="cpu")
    return library

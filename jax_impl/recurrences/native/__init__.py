"""The JAX twin's native LSTM kernels: shared libraries of XLA FFI handlers that ``make setup`` builds
(:mod:`jax_impl.recurrences.native.build`) into :data:`BUILD_DIR`, each beside its build record ``NAME.json``, loaded
here on first use.

:func:`validated` is the one way in: it checks a library against its build record (built, present, the recorded
size and SHA-256) before ``dlopen`` ever maps it (a truncated library mapped by ``dlopen`` kills the process with a
bus error), then loads it and checks that it exports every symbol this code calls (:data:`FFI_HANDLERS`,
:data:`FUNCTIONS`). Each failure is an :class:`UnsupportedError` of one line naming the file and what to do.
:func:`unavailable` gives that line (``None`` where the library can run), which ``--lstm-impl auto`` and the
refusals of a named implementation consult; :func:`load` also registers its FFI handlers with XLA. Registration is
process-wide state by nature (XLA keeps one table of custom-call targets per process), so it happens once per process
and handler.

The environment variable ``LSTM_TWINS_NATIVE_BUILD_DIR``, where set, names another build folder (read once, at
import): the build writes there and the twin loads from there, which lets a test run the CLI on a damaged copy.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import stat
from pathlib import Path

from common.errors import UnsupportedError

BUILD_DIR = Path(os.environ.get("LSTM_TWINS_NATIVE_BUILD_DIR") or Path(__file__).resolve().parent / "build").absolute()

# What this code calls in each library: the XLA FFI handlers (registered with XLA by load) and the plain C functions
# (called through ctypes). A library lacking any of them is not the library this code was written for.
FFI_HANDLERS = {
    "lstm_kernel": ("lstm_kernel_forward", "lstm_kernel_backward"),
    "onednn_lstm": ("onednn_lstm_forward", "onednn_lstm_backward", "onednn_lstm_forward_bf16",
                    "onednn_lstm_backward_bf16", "onednn_lstm_denormals_flushed"),
}
FUNCTIONS = {
    "lstm_kernel": ("lstm_kernel_isa", "lstm_kernel_supported", "lstm_kernel_set_isa", "lstm_kernel_exp_tanh",
                    "lstm_kernel_activation", "lstm_kernel_threads", "lstm_kernel_tile_gflops",
                    "lstm_kernel_team_flush_fraction"),
    "onednn_lstm": ("onednn_lstm_workspace_bytes", "onednn_lstm_version", "onednn_lstm_threads",
                    "onednn_lstm_copies"),
    "gemm_choice": ("gemm_choice_gflops",),
}


def library_path(name: str) -> Path:
    return BUILD_DIR / f"lib{name}.so"


def status_path(name: str) -> Path:
    """The build's record of ``name``: built or not, why not, the command, the seconds, the library's size in bytes
    and SHA-256."""
    return BUILD_DIR / f"{name}.json"


def rebuild(name: str) -> str:
    """What to do about a library that fails its checks."""
    return f"rebuild it with make setup (or python -m jax_impl.recurrences.native.build {name})"


def validated(name: str) -> ctypes.CDLL:
    """Library ``name`` loaded, once it has passed every check in order: an x86-64 machine; its build record a JSON
    object that says it was built, with its size and SHA-256; the file present, of that size and checksum (nothing is
    mapped before this); ``dlopen`` succeeds; every symbol of :data:`FFI_HANDLERS` and :data:`FUNCTIONS` exported.
    The first failure raises an :class:`UnsupportedError` of one line naming the file and what to do."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise UnsupportedError(f"the native {name} library is built for x86-64 CPUs only, not {platform.machine()}")
    library, status = library_path(name), status_path(name)
    fix = rebuild(name)
    try:
        record = json.loads(status.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if library.exists():
            raise UnsupportedError(f"the native {name} library {library} has no build record ({status} is missing), "
                                   f"so it cannot be checked; {fix}") from None
        raise UnsupportedError(f"the native {name} library is not available: not built; build it with make setup "
                               f"(or python -m jax_impl.recurrences.native.build {name})") from None
    except OSError as err:
        raise UnsupportedError(f"the native {name} library's build record {status} cannot be read "
                               f"({err.strerror}); {fix}") from None
    except ValueError as err:  # not JSON, or not UTF-8
        raise UnsupportedError(f"the native {name} library's build record {status} is not JSON ({err}); {fix}"
                               ) from None
    if not isinstance(record, dict):
        held = {type(None): "null", list: "a list", str: "a string", bool: "a boolean"}.get(type(record), "a number")
        raise UnsupportedError(f"the native {name} library's build record {status} holds {held}, not an object; {fix}")
    if record.get("built") is False:
        reason = record.get("reason")
        reason = " ".join(reason.split()) if isinstance(reason, str) else ""  # one line, whatever the record holds
        raise UnsupportedError(f"the native {name} library is not available: {reason or 'not built'}")
    if record.get("built") is not True:
        raise UnsupportedError(f"the native {name} library's build record {status} does not say whether it was "
                               f"built; {fix}")
    size, recorded = record.get("size"), record.get("sha256")
    if size is None or recorded is None:
        raise UnsupportedError(f"the native {name} library {library} was built by an older set-up (its build record "
                               f"has no size and SHA-256 to check it against); {fix}")
    if type(size) is not int or not isinstance(recorded, str) or len(recorded) != 64:
        raise UnsupportedError(f"the native {name} library's build record {status} holds a malformed size or "
                               f"SHA-256; {fix}")
    try:
        found = library.stat()
    except FileNotFoundError:
        raise UnsupportedError(f"the native {name} library {library} is missing, though its build record says it was "
                               f"built; {fix}") from None
    except OSError as err:
        raise UnsupportedError(f"the native {name} library {library} cannot be read ({err.strerror}); {fix}") from None
    if not stat.S_ISREG(found.st_mode):
        raise UnsupportedError(f"the native {name} library {library} is not a regular file; {fix}")
    if found.st_size != size:
        raise UnsupportedError(f"the native {name} library {library} is {found.st_size} bytes, not the {size} its "
                               f"build recorded (truncated or replaced since); {fix}")
    try:
        checksum = file_sha256(str(library), found.st_size, found.st_mtime_ns, found.st_ino)
    except OSError as err:
        raise UnsupportedError(f"the native {name} library {library} cannot be read ({err.strerror}); {fix}") from None
    if checksum != recorded.lower():
        raise UnsupportedError(f"the native {name} library {library} does not match the SHA-256 its build recorded "
                               f"(altered since it was built); {fix}")
    try:
        loaded = dlopen(str(library), checksum)
    except OSError as err:
        raise UnsupportedError(f"the native {name} library {library} does not load ({' '.join(str(err).split())}); "
                               f"{fix}") from None
    absent = [s for s in (*FFI_HANDLERS.get(name, ()), *FUNCTIONS.get(name, ())) if not hasattr(loaded, s)]
    if absent:
        more = f" and {len(absent) - 1} more of the symbols this code calls" if len(absent) > 1 else ""
        raise UnsupportedError(f"the native {name} library {library} does not export {absent[0]}{more} (it is not "
                               f"the {name} library this code was written for); {fix}")
    return loaded


def sha256(path: str | Path) -> str:
    """The SHA-256 of the file at ``path``, hex: what the build records and :func:`validated` compares."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@functools.cache
def file_sha256(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """:func:`sha256` once per process for each (size, mtime, inode) the file has, so a library rebuilt while the
    process runs is hashed anew."""
    return sha256(path)


@functools.cache
def dlopen(path: str, checksum: str) -> ctypes.CDLL:
    """The library at ``path`` with SHA-256 ``checksum`` loaded, one :class:`ctypes.CDLL` per process and file."""
    return ctypes.CDLL(path)


def unavailable(name: str) -> str | None:
    """Why library ``name`` cannot run here (not built, with the build's reason; damaged, missing, or not the library
    this code calls, with what to do), in one line; None where :func:`validated` accepts it."""
    try:
        validated(name)
    except UnsupportedError as err:
        return str(err)
    return None


_registered: set[str] = set()  # the FFI handlers registered with XLA in this process


def load(name: str) -> ctypes.CDLL:
    """Library ``name`` through :func:`validated`, its :data:`FFI_HANDLERS` registered with XLA for the CPU, each under
    its own name; an :class:`UnsupportedError` saying why where it cannot be. XLA's table of targets is process-wide:
    each handler is registered once per process, from the first library that passed."""
    import jax

    library = validated(name)
    for handler in FFI_HANDLERS.get(name, ()):
        if handler not in _registered:
            jax.ffi.register_ffi_target(handler, jax.ffi.pycapsule(getattr(library, handler)), platform="cpu")
            _registered.add(handler)
    return library

"""The JAX twin's native libraries: ``lib{NAME}.so`` files of XLA FFI handlers, built by the package's CMake build
(``CMakeLists.txt``, through scikit-build-core: ``pip install .``, ``pip install -e .`` and ``make setup`` alike) and
installed into :data:`FOLDER` of site-packages, where pip's install record (the distribution's ``RECORD``) lists each
with its size and SHA-256. A library the build could not make is installed as ``NAME.skipped``, a line saying why.

:func:`validated` is the one way in, and its one check comes before ``dlopen`` maps anything (a truncated library
mapped by ``dlopen`` kills the process with a bus error): the file's size and SHA-256 against the install record.
Then it loads the library, checks that it exports every symbol this code calls (:data:`FFI_HANDLERS`,
:data:`FUNCTIONS`), types those functions (and the test build's :data:`PROBES`) for ctypes, once per process, and
that it was built for the running jaxlib. Each failure is an :class:`UnsupportedError` of one line naming the file
and what to do; :func:`unavailable` gives that line (None where the library can run), which ``--lstm-impl auto`` and
the refusals of a named implementation consult. :func:`load` also registers the library's FFI handlers with XLA,
once per process and handler (XLA keeps one table of targets per process).

The environment variable ``LSTM_TWINS_NATIVE_DIR``, where set (read once, at import), names a folder whose
``lib{NAME}.so`` files are read in place of the installed ones, and checked against the same install record.
"""
from __future__ import annotations

import base64
import ctypes
import functools
import hashlib
import importlib.metadata
import os
import platform
import stat
from pathlib import Path

from common.errors import UnsupportedError

DIST = "lstm-twins"
FOLDER = "jax_impl/recurrences/native"  # where the libraries are installed, relative to site-packages
NATIVE_DIR_ENV = "LSTM_TWINS_NATIVE_DIR"
NATIVE_DIR = os.environ.get(NATIVE_DIR_ENV) or None
FIX = "reinstall the package (make setup, or pip install .)"

i64, f64, ptr = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
# What this code calls in each library: the XLA FFI handlers (registered with XLA by load) and the plain C functions
# (called through ctypes), each as (result type, argument types). A library lacking any of them is not the library
# this code was written for.
FFI_HANDLERS = {
    "lstm_kernel": ("lstm_kernel_forward", "lstm_kernel_backward"),
    "onednn_lstm": ("onednn_lstm_forward", "onednn_lstm_backward", "onednn_lstm_forward_bf16",
                    "onednn_lstm_backward_bf16", "onednn_lstm_denormals_flushed"),
}
BUILT_FOR = {"lstm_twins_jaxlib": (ctypes.c_char_p, ())}  # in every library: the jaxlib it was compiled against
FUNCTIONS = {
    "lstm_kernel": {**BUILT_FOR, "lstm_kernel_isa": (i64, ()), "lstm_kernel_supported": (i64, (i64,)),
                    "lstm_kernel_set_isa": (i64, (i64,)), "lstm_kernel_exp_tanh": (ctypes.c_char_p, (i64,)),
                    "lstm_kernel_threads": (i64, (i64,)), "lstm_kernel_tile_gflops": (f64, (i64,) * 4)},
    "onednn_lstm": {**BUILT_FOR, "onednn_lstm_workspace_bytes": (i64, (i64,) * 5), "onednn_lstm_version": (i64, ()),
                    "onednn_lstm_threads": (i64, ())},
}
# Exported by a test build only (CMake option LSTM_TWINS_TEST_PROBES, which make setup turns on): tests that call one
# skip, saying so, where it is absent.
PROBES = {
    "lstm_kernel": {"lstm_kernel_activation": (i64, (i64, i64, ptr, ptr, i64)),
                    "lstm_kernel_team_flush_fraction": (f64, (i64,))},
}


def distribution() -> importlib.metadata.Distribution:
    """The installed ``lstm-twins`` distribution, whose install record lists the libraries: the first on ``sys.path``
    with a RECORD (a setuptools ``.egg-info`` left in a source checkout has none)."""
    found = list(importlib.metadata.distributions(name=DIST))
    if not found:
        raise importlib.metadata.PackageNotFoundError(DIST)
    return next((d for d in found if d.read_text("RECORD") is not None), found[0])


def recorded(name: str) -> tuple[importlib.metadata.PackagePath | None, importlib.metadata.PackagePath | None, Path]:
    """Library ``name``'s entries in the install record, ``(lib{name}.so, {name}.skipped)`` (None where absent), and
    the record's own path; an :class:`UnsupportedError` where the package is not installed."""
    try:
        dist = distribution()
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedError(f"the native {name} library is not available: the {DIST} package is not installed; "
                               f"install it with make setup (or pip install .)") from None
    dist_info = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
    record_path = Path(str(dist.locate_file(f"{dist_info}/RECORD"))).absolute()
    try:
        files = {str(f): f for f in dist.files or ()}
    except (OSError, ValueError) as err:  # unreadable, or a line whose size is no number
        raise UnsupportedError(f"the native {name} library cannot be checked: the install record {record_path} "
                               f"cannot be read ({' '.join(str(err).split())}); {FIX}") from None
    return files.get(f"{FOLDER}/lib{name}.so"), files.get(f"{FOLDER}/{name}.skipped"), record_path


def library_path(name: str) -> Path:
    """Where library ``name`` is read from: in :data:`NATIVE_DIR` where it is set, else where the install record puts
    it; an :class:`UnsupportedError` where the package is not installed."""
    return where(name, *recorded(name)[::2])


def where(name: str, entry: importlib.metadata.PackagePath | None, record: Path) -> Path:
    if NATIVE_DIR:
        return Path(NATIVE_DIR).absolute() / f"lib{name}.so"
    return Path(entry.locate()).absolute() if entry else record.parent.parent / FOLDER / f"lib{name}.so"


def validated(name: str) -> ctypes.CDLL:
    """Library ``name`` loaded, once it has passed every check in order: an x86-64 machine; the build made it (else
    its ``.skipped`` reason); the install record has its size and SHA-256; the file is present, a regular file, of
    that size and checksum (nothing is mapped before this); ``dlopen`` succeeds; every symbol of :data:`FFI_HANDLERS`
    and :data:`FUNCTIONS` exported; built for the running jaxlib (``lstm_twins_jaxlib``). The first failure raises an
    :class:`UnsupportedError` of one line naming the file and what to do."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise UnsupportedError(f"the native {name} library is built for x86-64 CPUs only, not {platform.machine()}")
    if NATIVE_DIR and not Path(NATIVE_DIR).is_dir():
        raise UnsupportedError(f"{NATIVE_DIR_ENV} names {NATIVE_DIR}, which is not a folder; unset it or name the "
                               f"folder that holds lib{name}.so")
    entry, skipped, record = recorded(name)
    library = where(name, entry, record)
    if entry is None and skipped is None and library.exists():
        raise UnsupportedError(f"the native {name} library {library} is not in the install record {record}, so it "
                               f"cannot be checked; {FIX}")
    if entry is None:
        reason = "not built"
        if skipped is not None:
            try:
                reason = " ".join(Path(skipped.locate()).read_text(encoding="utf-8").split()) or reason
            except (OSError, ValueError):
                pass  # the reason is lost, not the refusal
        raise UnsupportedError(f"the native {name} library is not available: {reason}"
                               + ("" if skipped is not None else f"; {FIX}"))
    if entry.hash is None or entry.size is None or entry.hash.mode != "sha256":
        raise UnsupportedError(f"the native {name} library {library} has no size and SHA-256 in the install record "
                               f"{record} to check it against; {FIX}")
    try:
        found = library.stat()
    except FileNotFoundError:
        raise UnsupportedError(f"the native {name} library {library} is missing, though the install record {record} "
                               f"lists it; {FIX}") from None
    except OSError as err:
        raise UnsupportedError(f"the native {name} library {library} cannot be read ({err.strerror}); {FIX}") from None
    if not stat.S_ISREG(found.st_mode):
        raise UnsupportedError(f"the native {name} library {library} is not a regular file; {FIX}")
    if found.st_size != entry.size:
        raise UnsupportedError(f"the native {name} library {library} is {found.st_size} bytes, not the {entry.size} "
                               f"its install recorded (truncated or replaced since); {FIX}")
    try:
        checksum = file_sha256(str(library), found.st_size, found.st_mtime_ns, found.st_ino)
    except OSError as err:
        raise UnsupportedError(f"the native {name} library {library} cannot be read ({err.strerror}); {FIX}") from None
    if checksum != entry.hash.value:
        raise UnsupportedError(f"the native {name} library {library} does not match the SHA-256 its install recorded "
                               f"(altered since it was installed); {FIX}")
    try:
        loaded = dlopen(str(library), checksum)
    except OSError as err:
        raise UnsupportedError(f"the native {name} library {library} does not load ({' '.join(str(err).split())}); "
                               f"{FIX}") from None
    absent = [s for s in (*FFI_HANDLERS.get(name, ()), *FUNCTIONS.get(name, {})) if not hasattr(loaded, s)]
    if absent:
        more = f" and {len(absent) - 1} more of the symbols this code calls" if len(absent) > 1 else ""
        raise UnsupportedError(f"the native {name} library {library} does not export {absent[0]}{more} (it is not "
                               f"the {name} library this code was written for); {FIX}")
    for symbol, (result, arguments) in {**FUNCTIONS.get(name, {}), **PROBES.get(name, {})}.items():
        if hasattr(loaded, symbol):
            function = getattr(loaded, symbol)
            function.restype, function.argtypes = result, list(arguments)
    # XLA would refuse the handlers of a library built for another jaxlib only when its CPU backend starts, and that
    # refusal takes the backend down: refused here instead, before anything is registered.
    built, running = loaded.lstm_twins_jaxlib().decode(), importlib.metadata.version("jaxlib")
    if built != running:
        raise UnsupportedError(f"the native {name} library {library} was built for jaxlib {built}, and this is "
                               f"jaxlib {running} (XLA refuses a handler built against another FFI); {FIX}")
    return loaded


def sha256(path: str | Path) -> str:
    """The SHA-256 of the file at ``path`` as an install record writes it: urlsafe base64, unpadded."""
    with open(path, "rb") as f:
        return base64.urlsafe_b64encode(hashlib.file_digest(f, "sha256").digest()).rstrip(b"=").decode()


@functools.cache
def file_sha256(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """:func:`sha256` once per process for each (size, mtime, inode) the file has, so a library reinstalled while the
    process runs is hashed anew."""
    return sha256(path)


@functools.cache
def dlopen(path: str, checksum: str) -> ctypes.CDLL:
    """The library at ``path`` with SHA-256 ``checksum`` loaded, one :class:`ctypes.CDLL` per process and file."""
    return ctypes.CDLL(path)


def unavailable(name: str) -> str | None:
    """Why library ``name`` cannot run here (not built, with the build's reason; damaged, missing, not the library
    this code calls, or built for another jaxlib, with what to do), in one line; None where :func:`validated`
    accepts it."""
    try:
        validated(name)
    except UnsupportedError as err:
        return str(err)
    return None


def missing_probe(name: str, symbol: str) -> str | None:
    """Why the test probe ``symbol`` of library ``name`` cannot be called (the library is unavailable, or a production
    build without probes), in one line; None where it can."""
    reason = unavailable(name)
    if reason is None and not hasattr(validated(name), symbol):
        reason = (f"the native {name} library was built without its test probes ({symbol}); make setup builds them "
                  f"(CMake option LSTM_TWINS_TEST_PROBES=ON)")
    return reason


_registered: set[str] = set()  # the FFI handlers registered with XLA in this process


def load(name: str) -> ctypes.CDLL:
    """Library ``name`` through :func:`validated`, its :data:`FFI_HANDLERS` registered with XLA for the CPU, each under
    its own name; an :class:`UnsupportedError` saying why where it cannot be. Each handler is registered once per
    process, from the first library that passed. Nothing here starts the backend, so flags set later (``XLA_FLAGS``)
    still apply."""
    import jax

    library = validated(name)
    for handler in FFI_HANDLERS.get(name, ()):
        if handler not in _registered:
            jax.ffi.register_ffi_target(handler, jax.ffi.pycapsule(getattr(library, handler)), platform="cpu")
            _registered.add(handler)
    return library

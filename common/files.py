"""File helpers both twins share: writability and overwrite checks, atomic directory and file writes, JSON, and the
checksum manifest of a checkpoint (safetensors and Orbax's array data carry no checksum of their own)."""
import hashlib
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from common.errors import CheckpointError, ConfigError

CHECKSUM_FILE = "checksums.sha256"  # lines "SHA256  BYTES  RELATIVE/PATH", one per other file of the directory


def check_writable(directory: Path, what: str) -> None:
    """Fail before training, in one line, rather than after the first epoch."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{what} {directory}: exists and is not a directory")
    parent = directory if directory.is_dir() else directory.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as err:
        raise ConfigError(f"{what} {directory}: cannot write there ({err.strerror})") from None


def check_new_file(path: Path, what: str, overwrite: bool, hint: str = "") -> None:
    """Refuse, in one line, an output file that is a directory, or that holds something and ``overwrite`` is off."""
    if path.is_dir():
        raise ConfigError(f"{what} {path}: is a directory")
    if not overwrite and path.is_file() and path.stat().st_size:
        raise ConfigError(f"{what} {path}: exists; pass --overwrite to replace it{hint}")


def fsync(*paths: Path) -> None:
    """Flush files, or directories (so that a rename inside one survives a power loss), to the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextmanager
def atomic_dir(final: Path, what: str) -> Iterator[Path]:
    """Yield a temporary directory beside ``final`` to fill, then fsync it and rename it to ``final`` (an existing one
    moved aside first, removed last): a kill at any moment leaves the old or the new ``final`` and dot-named debris."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as err:
        raise CheckpointError(f"{final.parent}: cannot write {what} here ({err.strerror})") from None
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    try:
        yield tmp
        fsync(*tmp.iterdir(), tmp)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        fsync(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def atomic_files(writes: dict[Path, Callable[[Path], None]]) -> None:
    """Each ``write(a temporary path beside its path)``, fsynced, then all renamed into place: a failure in any leaves
    every path as it was, never a half-written file (the temporary ones are removed)."""
    tmps = {path: path.with_name(f"{path.name}.tmp") for path in writes}  # the manifest's own stays outside it by name
    try:
        for path, write in writes.items():
            write(tmps[path])
            fsync(tmps[path])
        for path, tmp in tmps.items():
            os.replace(tmp, path)
    except BaseException:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
        raise


def atomic_file(path: Path, write: Callable[[Path], None]) -> None:
    """:func:`atomic_files` of one file: a failure or a kill leaves the old ``path`` or the new one."""
    atomic_files({path: write})


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1), encoding="utf-8")


def read_json(path: Path) -> Any:
    """``path``'s JSON; a missing or malformed file is a :class:`CheckpointError` naming it."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None


def _entries(directory: Path) -> dict[str, tuple[str, int]]:
    """SHA-256 and size in bytes of every file below ``directory`` but the manifest, by relative path."""
    return {p.relative_to(directory).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size)
            for p in sorted(directory.rglob("*")) if p.is_file() and not p.name.startswith(CHECKSUM_FILE)}


def write_manifest(directory: Path) -> Path:
    """Write ``directory/checksums.sha256`` over every other file below it, atomically; return ``directory``."""
    lines = "".join(f"{sha}  {size}  {name}\n" for name, (sha, size) in _entries(directory).items())
    atomic_file(directory / CHECKSUM_FILE, lambda tmp: tmp.write_text(lines, encoding="utf-8"))
    return directory


def verify_manifest(directory: Path) -> None:
    """Raise :class:`CheckpointError` naming the first file that is missing, extra, truncated or altered."""
    manifest = directory / CHECKSUM_FILE
    if not manifest.is_file():
        raise CheckpointError(f"{manifest}: missing")
    try:
        text = manifest.read_text(encoding="utf-8")
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{manifest}: unreadable ({err})") from None
    lines = [re.fullmatch(r"([0-9a-f]{64})  (\d+)  (.+)", line) for line in text.splitlines()]
    if not text.endswith("\n") or not lines or not all(lines):
        raise CheckpointError(f"{manifest}: truncated or corrupt")
    expected, found = {m[3]: (m[1], int(m[2])) for m in lines}, _entries(directory)
    for name in sorted(expected.keys() | found.keys()):
        file, want, got = directory / name, expected.get(name), found.get(name)
        if got is None:
            raise CheckpointError(f"{file}: missing")
        if want is None:
            raise CheckpointError(f"{file}: a file the checkpoint did not write")
        if got[1] != want[1]:
            raise CheckpointError(f"{file}: {got[1]} bytes, expected {want[1]} (truncated or damaged)")
        if got[0] != want[0]:
            raise CheckpointError(f"{file}: contents differ from when it was written (damaged)")

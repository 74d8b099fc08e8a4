"""File helpers both twins share: the one check of a command's outputs before any work, atomic directory and file
writes (with the modes an ordinary write gets), JSON, and the checksum manifest of a checkpoint (safetensors and
Orbax's array data carry no checksum of their own)."""
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from common import interrupts
from common.errors import CheckpointError, ConfigError

CHECKSUM_FILE = "checksums.sha256"  # lines "SHA256  BYTES  RELATIVE/PATH", one per other file of the directory
STEP_PREFIX = "step_"  # a training checkpoint's directory: step_00000100 (common.runstate)
# A step directory, or the debris of one (a temporary or moved-aside one, dot-named, or Orbax's step_N.orbax-...):
# what pruning a run's training checkpoints removes, with everything inside it.
_STEP_DIR = re.compile(rf"\.?{STEP_PREFIX}\d")


def _every_path(relative: Path) -> bool:
    return True


@dataclass(frozen=True)
class Output:
    """A path a command writes, or (``read``) one it reads that a save could destroy: what :func:`check_outputs`
    checks before any work."""

    name: str  # how messages call it: its flag (--save-dir)
    path: Path
    directory: bool  # a directory (else a file)
    contents: str  # what it holds, for what a clash would lose ("the metrics log")
    replaced: str = ""  # how a save replaces what lies inside it ("which each save replaces whole"); "": it does not
    replaces: Callable[[Path], bool] = _every_path  # which paths (relative to it, "." itself) a save replaces
    held: Callable[[Path], str | None] | None = None  # given the existing output, the refusal of what writing would
    # lose without --overwrite (None: nothing); unset, a file that is not empty is refused, the message ending in hint
    hint: str = ""
    read: bool = False


def _nearest_existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())


def _check_place(out: Output) -> None:
    """Refuse an output of the wrong kind, or one that cannot be made and written: a temporary file is made in the
    output directory, or in the nearest folder that exists above it (nothing is created for good)."""
    path = out.path
    if out.directory and path.exists() and not path.is_dir():  # (a path under a file does not exist)
        raise ConfigError(f"{out.name} {path}: exists and is not a directory")
    if not out.directory and path.is_dir():
        raise ConfigError(f"{out.name} {path}: is a directory")
    where = _nearest_existing((path if out.directory else path.parent).absolute())
    if not where.is_dir():
        raise ConfigError(f"{out.name} {path}: cannot write there ({where} is a file)")
    try:
        tempfile.TemporaryFile(dir=where).close()
    except OSError as err:
        raise ConfigError(f"{out.name} {path}: cannot write there ({err.strerror})") from None


def _held(out: Output) -> str | None:
    if out.held is not None:
        return out.held(out.path) if out.path.exists() else None
    if not out.directory and out.path.is_file() and out.path.stat().st_size:
        return f"{out.name} {out.path}: exists; pass --overwrite to replace it{out.hint}"
    return None


def _relation(inner: Output, outer: Output) -> tuple[str, Path] | None:
    """``("is the same path as" | "is inside", inner's path relative to outer's)``, both resolved, or None."""
    a, b = inner.path.resolve(), outer.path.resolve()
    if a != b and b not in a.parents:
        return None
    return "is the same path as" if a == b else "is inside", a.relative_to(b)


def _lost(inner: Output, outer: Output, overwrite: bool) -> str | None:
    """The refusal of ``inner`` lying where a save of ``outer`` replaces it (an input: unless ``overwrite``)."""
    relation = _relation(inner, outer)
    if relation is None or not outer.replaced or not outer.replaces(relation[1]) or (inner.read and overwrite):
        return None
    return (f"{inner.name} {inner.path} {relation[0]} {outer.name} {outer.path}, {outer.replaced}: {inner.contents} "
            f"would be lost; give each its own path" + (", or pass --overwrite" if inner.read else ""))


def _overlap(inner: Output, outer: Output) -> str | None:
    """The refusal of two outputs on one path, or of one inside a file output."""
    relation = _relation(inner, outer)
    if relation is None or inner.read:
        return None
    said = f"{inner.name} {inner.path} {relation[0]} {outer.name} {outer.path}"
    if relation[1] == Path("."):
        return f"{said}: both would write it; give each its own path"
    return None if outer.directory else f"{said}, a file; give each its own path"


def _under_a_step_dir(out: Output) -> str | None:
    """The refusal of an output inside a directory named as a training checkpoint's step directory (or that is one):
    the pruning of the run whose checkpoints it is among, or of whatever run one day resumes there, removes it whole."""
    path = out.path.resolve()
    step = next((p for p in (*reversed(path.parents), path) if _STEP_DIR.match(p.name)), None)
    if step is None:
        return None
    where = "" if step == path else f"inside {step}, "
    return (f"{out.name} {out.path}: {where}a training checkpoint's directory by its name ({STEP_PREFIX}N), which "
            f"pruning a run's old checkpoints removes with everything in it; give it a path outside any "
            f"{STEP_PREFIX}* directory")


def check_outputs(outputs: Sequence[Output], overwrite: bool) -> None:
    """Refuse, in one line (:class:`ConfigError`), before any work: an output of the wrong kind (a directory given
    for a file, or a file for a directory) or one that cannot be made and written; an output a save replaces that
    holds the working directory (``--save-dir .``); an output inside, or the same as,
    another whose save replaces it (and an input there, unless ``overwrite``), two outputs on one path, a path inside
    a file output; an output in (or named as) a training checkpoint's step directory, which pruning removes; then an
    existing output holding what writing it would lose, unless ``overwrite``."""
    written = [out for out in outputs if not out.read]
    for out in written:
        _check_place(out)
    # The directory the command runs in, or one above it, renamed away by a save: refused even with --overwrite.
    here = Output("the working directory", Path.cwd(), directory=True, contents="the directory this command runs in")
    for outer in written:
        if why := _lost(here, outer, overwrite=False):
            raise ConfigError(why)
    for clash in (lambda inner, outer: _lost(inner, outer, overwrite), _overlap):  # what would be lost says most
        for inner in outputs:
            for outer in written:
                if inner is not outer and (why := clash(inner, outer)):
                    raise ConfigError(why)
    for out in written:
        if why := _under_a_step_dir(out):
            raise ConfigError(why)
    for out in written if not overwrite else ():
        if why := _held(out):
            raise ConfigError(why)


def check_new_file(path: Path, what: str, overwrite: bool, hint: str = "") -> None:
    """:func:`check_outputs` of one file output named ``what``; ``hint`` ends the refusal of an existing one."""
    check_outputs([Output(what, Path(path), directory=False, contents="the file", hint=hint)], overwrite)


def _umask() -> int:
    """The process's umask: read from the kernel where it says (Linux), else set and put back at once."""
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii")
        return int(re.search(r"^Umask:\s*([0-7]+)$", status, re.MULTILINE)[1], 8)
    except (OSError, TypeError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def ordinary_modes(*paths: Path) -> None:
    """Give ``paths`` (and everything below a directory among them) the modes a plain ``open``/``mkdir`` gives under
    the umask (0644 and 0755 under 022): safetensors writes 0600 files and ``mkdtemp`` 0700 directories, which would
    keep a shared checkpoint from anyone but its writer."""
    mask = _umask()
    for top in paths:
        for path in (top, *sorted(top.rglob("*"))) if top.is_dir() else (top,):
            if not path.is_symlink():
                path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


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
    """Yield a temporary directory beside ``final`` to fill, then give it the umask's ordinary modes, fsync it and
    rename it to ``final`` (an existing one moved aside first, removed last): a kill at any moment leaves the old or
    the new ``final`` and dot-named debris."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as err:
        raise CheckpointError(f"{final.parent}: cannot write {what} here ({err.strerror})") from None
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    try:
        yield tmp
        ordinary_modes(tmp)
        fsync(*tmp.iterdir(), tmp)
        with interrupts.deferred():  # a Ctrl-C between the two renames would leave no ``final`` at all
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            fsync(final.parent)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_files(writes: dict[Path, Callable[[Path], None]]) -> None:
    """Each ``write(a temporary path beside its path)``, its folder made where missing, given the umask's ordinary
    mode and fsynced, then all renamed into place: a failure in any leaves every path as it was, never a half-written
    file (the temporary ones are removed)."""
    tmps = {path: path.with_name(f"{path.name}.tmp") for path in writes}  # the manifest's own stays outside it by name
    try:
        for path, write in writes.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            write(tmps[path])
            ordinary_modes(tmps[path])
            fsync(tmps[path])
        with interrupts.deferred():  # all renamed, or (a failure) none left half-done by a Ctrl-C
            for path, tmp in tmps.items():
                os.replace(tmp, path)
    except BaseException:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
        raise


def atomic_file(path: Path, write: Callable[[Path], None]) -> None:
    """:func:`atomic_files` of one file: a failure or a kill leaves the old ``path`` or the new one."""
    atomic_files({path: write})


def finite_json(obj: Any) -> Any:
    """``obj`` with every float that is not finite (NaN, ±infinity), in it or in its dicts, lists and tuples, replaced
    by None: JSON has no such numbers (Python's ``json`` would write ``NaN`` or ``Infinity``, which no standard
    reader takes), so the project writes them as ``null``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite_json(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(value) for value in obj]
    return obj


def to_json(obj: Any, **options: Any) -> str:
    """``json.dumps`` of :func:`finite_json` ``(obj)``, refusing anything that would not be standard JSON: how every
    JSON file and record of the project is written (checkpoints, metrics logs, results)."""
    return json.dumps(finite_json(obj), allow_nan=False, **options)


def write_json(path: Path, obj: Any) -> None:
    """``path`` holding ``obj`` as standard JSON (:func:`to_json`: a number that is not finite as ``null``)."""
    path.write_text(to_json(obj, ensure_ascii=False, indent=1), encoding="utf-8")


def read_json(path: Path) -> Any:
    """``path``'s JSON; a missing, unreadable or malformed file is a :class:`CheckpointError` naming it."""
    try:
        if not path.is_file():
            raise CheckpointError(f"{path}: missing")
        text = path.read_text(encoding="utf-8")
        return json.loads(text)
    except OSError as err:  # permission denied, an I/O error, ...
        raise CheckpointError(f"{path}: cannot read it ({err.strerror or err})") from None
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None


def _entries(directory: Path) -> dict[str, tuple[str, int]]:
    """SHA-256 and size in bytes of every file below ``directory`` but the manifest, by relative path; a file that
    cannot be read is a :class:`CheckpointError` naming it."""
    entries = {}
    for p in sorted(directory.rglob("*")):
        try:
            if p.is_file() and not p.name.startswith(CHECKSUM_FILE):
                entries[p.relative_to(directory).as_posix()] = (hashlib.sha256(p.read_bytes()).hexdigest(),
                                                                p.stat().st_size)
        except OSError as err:
            raise CheckpointError(f"{p}: cannot read it ({err.strerror or err})") from None
    return entries


def write_manifest(directory: Path) -> Path:
    """Write ``directory/checksums.sha256`` over every other file below it, atomically; return ``directory``."""
    lines = "".join(f"{sha}  {size}  {name}\n" for name, (sha, size) in _entries(directory).items())
    atomic_file(directory / CHECKSUM_FILE, lambda tmp: tmp.write_text(lines, encoding="utf-8"))
    return directory


def verify_manifest(directory: Path) -> None:
    """Raise :class:`CheckpointError` naming the first file that is missing, extra, truncated or altered."""
    manifest = directory / CHECKSUM_FILE
    try:
        if not manifest.is_file():
            raise CheckpointError(f"{manifest}: missing")
        text = manifest.read_text(encoding="utf-8")
    except OSError as err:
        raise CheckpointError(f"{manifest}: cannot read it ({err.strerror or err})") from None
    except ValueError as err:
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

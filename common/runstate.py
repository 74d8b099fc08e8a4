"""Training checkpoints for ``--checkpoint-every`` / ``--resume``: what both twins share of them.

    RUN_DIR/step_00000100/   one complete training checkpoint per step, written by the twin
    RUN_DIR/step_00000200/   (JAX: an Orbax CheckpointManager step; PyTorch: :func:`write_checkpoint`)

Here: the framework-neutral progress record, the check that a resume keeps the trajectory's settings, the
fallback from a damaged newest checkpoint to an older one, and the PyTorch twin's atomic directory writes
(no library writes a directory of safetensors and JSON files atomically and keeps the newest N).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, TypeVar

from common.config import field_names, flag
from common.errors import CheckpointError, ConfigError

PREFIX = "step_"  # Orbax's step-name format with prefix "step" and 8 digits: step_00000100
DIGITS = 8
OLD_PREFIX = "step-"  # the layout before Orbax managed the JAX steps; neither twin reads it
PROGRESS_FILE = "progress.json"
T = TypeVar("T")


@dataclass(frozen=True)
class Progress:
    """Where training stands: ``step`` steps done; the next batch is batch ``batch`` (0-based) of epoch
    ``epoch`` (0-based). ``skipped``: non-finite steps skipped so far; ``best_val_loss`` for --save-dir;
    ``last_val``: the latest validation ``{"step", "loss", "accuracy"}``."""

    step: int
    epoch: int
    batch: int
    skipped: int = 0
    best_val_loss: float | None = None
    settings: dict | None = None  # trajectory_settings(cfg) of the run that wrote it
    last_val: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data, where: Path) -> "Progress":
        try:
            return cls(**data)
        except TypeError as err:
            raise CheckpointError(f"{where}: corrupt ({err})") from None


def trajectory_settings(cfg) -> dict:
    """The Config fields that decide the training trajectory (what a resume must not change)."""
    return {name: getattr(cfg, name) for name in field_names(resumable=False)}


def check_same_settings(progress: Progress, cfg, path: Path) -> None:
    """Refuse ``--resume`` with other trajectory settings, by name. A :class:`ConfigError`, not a damaged
    checkpoint: :func:`load_latest` does not fall back on it."""
    now = trajectory_settings(cfg)
    for name, then in (progress.settings or {}).items():
        if now.get(name) != then:
            raise ConfigError(f"--resume {path.parent}: the run was trained with --{flag(name)} "
                              f"{then!r}, not {now.get(name)!r}; resume with the same settings")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:0{DIGITS}d}"


def checkpoint_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """The step directories under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(p.name[len(PREFIX):]), p) for p in root.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found)


def checkpoint_root(cfg, twin: str) -> Path:
    """Where training checkpoints go: ``--checkpoint-dir``, else the ``--resume`` directory (a resumed run
    goes on writing where it left off), else a new ``runs/<twin>-<time>-<pid>`` (never an old run's)."""
    if cfg.checkpoint_dir:
        return Path(cfg.checkpoint_dir)
    if cfg.resume:
        return Path(cfg.resume)
    return Path("runs") / f"{twin}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(root: str | Path, progress: Progress, write_state: Callable[[Path], None],
                     keep: int = 3) -> Path:
    """Create ``root/step_N`` atomically: ``write_state(tmp_dir)`` writes the twin's files, then
    progress.json is added, everything fsynced and the directory renamed into place. Older ones beyond
    ``keep`` are removed afterwards."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    except OSError as err:
        raise CheckpointError(f"{root}: cannot write training checkpoints here ({err.strerror})") from None
    final = step_dir(root, progress.step)
    try:
        write_state(tmp)
        (tmp / PROGRESS_FILE).write_text(json.dumps(progress.to_dict()), encoding="utf-8")
        for path in [*tmp.iterdir(), tmp]:
            _fsync(path)
        if final.exists():  # the same step written again: after a fallback past a damaged one
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    found = checkpoint_dirs(root)
    for _, old in found[:max(len(found) - keep, 0)]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):  # left by a run killed mid-write (one writer per root)
        shutil.rmtree(stale, ignore_errors=True)
    return final


def read_progress(path: Path) -> Progress:
    file = path / PROGRESS_FILE
    try:
        return Progress.from_dict(json.loads(file.read_text(encoding="utf-8")), file)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: corrupt ({err})") from None


def load_latest(root: str | Path, load: Callable[[Path], tuple[Progress, T]], cfg=None) -> tuple[Progress, T, Path]:
    """The newest checkpoint under ``root`` that loads: ``(progress, state, dir)`` from ``load(dir)``.

    A checkpoint that fails (``CheckpointError``) is reported on stderr and the previous one is tried.
    With ``cfg``, a checkpoint written with other trajectory settings is refused (:func:`check_same_settings`).
    """
    root = Path(root)
    candidates = checkpoint_dirs(root)
    if not candidates:
        if root.is_dir() and any(p.name.startswith(OLD_PREFIX) for p in root.iterdir()):
            raise CheckpointError(f"--resume {root}: its checkpoints (step-NNNNNNNN) were written by an earlier "
                                  f"version of this project, whose layout this one does not read; start a new "
                                  f"run (--init-from a neutral checkpoint still works)")
        raise CheckpointError(f"--resume {root}: no training checkpoint ({PREFIX}*) found there")
    for _, path in reversed(candidates):
        try:
            progress, state = load(path)
            if cfg is not None:
                check_same_settings(progress, cfg, path)
            return progress, state, path
        except CheckpointError as err:
            print(f"warning: {err}; falling back to the previous checkpoint", file=sys.stderr)
    raise CheckpointError(f"--resume {root}: every training checkpoint there is damaged")

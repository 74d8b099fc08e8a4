"""Training checkpoints for ``--checkpoint-every`` / ``--resume``: the directory layout both twins share.

    RUN_DIR/step-00000100/   one complete training checkpoint per step (written by the twin: its own
    RUN_DIR/step-00000200/   state files, plus progress.json from here)

A checkpoint is written under a temporary name, fsynced and renamed, so a directory named ``step-*`` is
always complete; the newest ``keep`` are kept. Loading tries the newest first and falls back to older ones,
saying why, when a file is truncated or corrupt.
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

from common.errors import CheckpointError, ConfigError

PREFIX = "step-"
PROGRESS_FILE = "progress.json"
T = TypeVar("T")


@dataclass(frozen=True)
class Progress:
    """Where training stands: ``step`` steps done; the next batch is batch ``batch`` (0-based) of epoch
    ``epoch`` (0-based). ``skipped``: non-finite steps skipped so far; ``best_val_loss`` for --save-dir."""

    step: int
    epoch: int
    batch: int
    skipped: int = 0
    best_val_loss: float | None = None
    settings: dict | None = None  # trajectory_settings(cfg) of the run that wrote it


# Config fields a resumed run may change: they do not alter the trajectory (--skip-nonfinite included, so a
# run stopped by a non-finite step can be resumed with it).
RUN_ONLY_FIELDS = ("device", "init_from", "save_dir", "metrics_out", "checkpoint_every", "checkpoint_dir",
                   "resume", "keep_checkpoints", "log_every", "progress", "epochs", "max_steps", "skip_nonfinite")


def trajectory_settings(cfg) -> dict:
    """The Config fields that decide the training trajectory (what a resume must not change)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in RUN_ONLY_FIELDS}


def check_same_settings(progress: Progress, cfg, path: Path) -> None:
    """Refuse ``--resume`` with other trajectory settings, by name. A :class:`ConfigError`, not a damaged
    checkpoint: :func:`load_latest` does not fall back on it."""
    now = trajectory_settings(cfg)
    for name, then in (progress.settings or {}).items():
        if now.get(name) != then:
            raise ConfigError(f"--resume {path.parent}: the run was trained with --{name.replace('_', '-')} "
                              f"{then!r}, not {now.get(name)!r}; resume with the same settings")


def checkpoint_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit():
            found.append((int(p.name[len(PREFIX):]), p))
    return sorted(found)


def _fsync_tree(path: Path) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_checkpoint(root: str | Path, progress: Progress, write_state: Callable[[Path], None],
                     keep: int = 3) -> Path:
    """Create ``root/step-N`` atomically: ``write_state(tmp_dir)`` writes the twin's files, then
    progress.json is added, everything fsynced and the directory renamed into place. Older ones beyond
    ``keep`` are removed afterwards."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    except OSError as err:
        raise CheckpointError(f"{root}: cannot write training checkpoints here ({err.strerror})") from None
    final = root / f"{PREFIX}{progress.step:08d}"
    try:
        write_state(tmp)
        (tmp / PROGRESS_FILE).write_text(json.dumps(asdict(progress)), encoding="utf-8")
        _fsync_tree(tmp)
        if final.exists():  # the same step written again (e.g. end of epoch == every-N step)
            shutil.rmtree(final)
        os.replace(tmp, final)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    found = checkpoint_dirs(root)
    for _, old in found[:max(len(found) - keep, 0)]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):  # left by a run killed mid-write (one writer per root)
        shutil.rmtree(stale, ignore_errors=True)
    return final


def checkpoint_root(cfg, twin: str) -> Path:
    """Where training checkpoints go: ``--checkpoint-dir``, else the ``--resume`` directory (a resumed run
    goes on writing where it left off), else a new ``runs/<twin>-<time>-<pid>`` (never an old run's)."""
    if cfg.checkpoint_dir:
        return Path(cfg.checkpoint_dir)
    if cfg.resume:
        return Path(cfg.resume)
    return Path("runs") / f"{twin}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def read_progress(path: Path) -> Progress:
    file = path / PROGRESS_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        return Progress(**data)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing") from None
    except (ValueError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: corrupt ({err})") from None


def load_latest(root: str | Path, load_state: Callable[[Path], T], cfg=None) -> tuple[Progress, T, Path]:
    """The newest checkpoint under ``root`` that loads: ``(progress, load_state(dir), dir)``.

    A checkpoint that fails (``CheckpointError``) is reported on stderr and the previous one is tried.
    With ``cfg``, a checkpoint written with other trajectory settings is refused (:func:`check_same_settings`).
    """
    root = Path(root)
    candidates = checkpoint_dirs(root)
    if not candidates:
        raise CheckpointError(f"--resume {root}: no training checkpoint (step-*) found there")
    for _, path in reversed(candidates):
        try:
            progress = read_progress(path)
            if cfg is not None:
                check_same_settings(progress, cfg, path)
            return progress, load_state(path), path
        except CheckpointError as err:
            print(f"warning: {err}; falling back to the previous checkpoint", file=sys.stderr)
    raise CheckpointError(f"--resume {root}: every training checkpoint there is damaged")

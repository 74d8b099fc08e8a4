"""Training checkpoints for ``--checkpoint-every`` / ``--resume``: what both twins share of them.

    RUN_DIR/step_00000100/   one complete training checkpoint per step, written by the twin
    RUN_DIR/step_00000200/   (JAX: an Orbax CheckpointManager step; PyTorch: torch_impl.state.write_checkpoint)

The progress record, the resume's settings check and the fallback past a damaged checkpoint.
"""
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from common.config import field_names, flag
from common.errors import CheckpointError, ConfigError
from common.files import read_json

PREFIX = "step_"  # Orbax's step-name format with prefix "step" and 8 digits: step_00000100
DIGITS = 8
OLD_PREFIX = "step-"  # the layout before Orbax managed the JAX steps; neither twin reads it
PROGRESS_FILE = "progress.json"


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

    @classmethod
    def from_dict(cls, data, where: Path) -> "Progress":
        try:
            return cls(**data)
        except TypeError as err:
            raise CheckpointError(f"{where}: corrupt ({err})") from None


def trajectory_settings(cfg) -> dict:
    """The Config fields that decide the training trajectory (what a resume must not change)."""
    return {name: getattr(cfg, name) for name in field_names(resumable=False)}


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:0{DIGITS}d}"


def checkpoint_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """The step directories under ``root``, oldest first."""
    root = Path(root)
    return sorted((int(p.name[len(PREFIX):]), p) for p in (root.iterdir() if root.is_dir() else ())
                  if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit())


def checkpoint_root(cfg, twin: str) -> Path:
    """Where training checkpoints go: ``--checkpoint-dir``, else the ``--resume`` directory (a resumed run
    goes on writing where it left off), else a new ``runs/<twin>-<time>-<pid>`` (never an old run's)."""
    return Path(cfg.checkpoint_dir or cfg.resume or f"runs/{twin}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def read_progress(path: Path) -> Progress:
    return Progress.from_dict(read_json(path / PROGRESS_FILE), path / PROGRESS_FILE)


def load_latest(root: str | Path, load: Callable[[Path], tuple[Progress, Any]], cfg=None) -> tuple[Progress, Any, Path]:
    """The newest checkpoint under ``root`` that loads: ``(progress, state, dir)`` from ``load(dir)``. One that
    fails (``CheckpointError``) is reported on stderr and the previous one tried; with ``cfg``, one written with
    other trajectory settings is refused by name (a :class:`ConfigError`: no fallback)."""
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
        except CheckpointError as err:
            print(f"warning: {err}; falling back to the previous checkpoint", file=sys.stderr)
            continue
        now = trajectory_settings(cfg) if cfg is not None else None
        for name, then in (progress.settings or {}).items() if now is not None else ():
            if now.get(name) != then:
                raise ConfigError(f"--resume {root}: the run was trained with --{flag(name)} "
                                  f"{then!r}, not {now.get(name)!r}; resume with the same settings")
        return progress, state, path
    raise CheckpointError(f"--resume {root}: every training checkpoint there is damaged")

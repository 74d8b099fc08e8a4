"""Training checkpoints for ``--checkpoint-every`` / ``--resume``: what both twins share of them.

    RUN_DIR/step_00000100/   one complete training checkpoint per step, written by the twin
    RUN_DIR/step_00000200/   (JAX: an Orbax CheckpointManager step; PyTorch: torch_impl.state.write_checkpoint)

The progress record, the resume's check of the twin and the settings, and the fallback past a damaged checkpoint.
"""
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from common.config import field_names, flag
from common.errors import CheckpointError, ConfigError
from common.files import CHECKSUM_FILE, STEP_PREFIX, read_json, verify_manifest

PREFIX = STEP_PREFIX  # Orbax's step-name format with prefix "step" and 8 digits: step_00000100
DIGITS = 8
PROGRESS_FILE = "progress.json"
# Where each twin's step directories keep the Progress record (JAX's: an Orbax JSON item): it names the writer.
PROGRESS_FILES = {"torch": Path(PROGRESS_FILE), "jax": Path("progress", "metadata")}
VOCAB_SIZE = "vocab_size"  # in Progress.settings beside the Config fields
LSTM_IMPL_RAN = "lstm_impl_ran"  # there too: the implementation the run's --lstm-impl ran (auto resolved)
TWINS = {"torch": "PyTorch twin (python -m torch_impl.train)", "jax": "JAX twin (python -m jax_impl.train)"}


@dataclass(frozen=True)
class Progress:
    """Where training stands: ``step`` steps done; the next batch is batch ``batch`` (0-based) of epoch
    ``epoch`` (0-based). ``skipped``: non-finite steps skipped so far; ``best_val_loss`` for --save-dir;
    ``last_val``: the latest validation ``{"step", "loss", <metric>}``; ``lr``: the learning rate the next step
    takes (None: --lr, never decayed); ``run_id``: the run's id, which its metrics log's first record holds too (None:
    a checkpoint written before runs had ids).

    On disk as JSON, which has no NaN nor infinity: such a number is written ``null``, and a ``last_val`` loss or
    metric read as ``null`` comes back NaN (a ``best_val_loss`` that was not finite comes back None: none yet)."""

    step: int
    epoch: int
    batch: int
    skipped: int = 0
    best_val_loss: float | None = None
    settings: dict | None = None  # trajectory_settings(cfg, vocab_size) of the run that wrote it
    last_val: dict | None = None
    lr: float | None = None
    run_id: str | None = None

    @classmethod
    def from_dict(cls, data, where: Path) -> "Progress":
        try:
            progress = cls(**data)
        except TypeError as err:
            raise CheckpointError(f"{where}: corrupt ({err})") from None
        if not isinstance(progress.last_val, dict):
            return progress
        return replace(progress, last_val={key: math.nan if value is None else value
                                           for key, value in progress.last_val.items()})


def trajectory_settings(cfg, vocab_size: int | None = None, lstm_impl_ran: str | None = None) -> dict:
    """The Config fields that decide the training trajectory (what a resume must not change), the size of the
    vocabulary the data gave (a resume whose data gives another has another model), and the LSTM implementation that
    ran (the twin's record's ``lstm_impl``: what ``--lstm-impl auto`` chose), which a resume compares in place of the
    flag that chose it."""
    settings = {name: getattr(cfg, name) for name in field_names(resumable=False)}
    if vocab_size is not None:
        settings[VOCAB_SIZE] = vocab_size
    if lstm_impl_ran is not None:
        settings[LSTM_IMPL_RAN] = lstm_impl_ran
    return settings


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:0{DIGITS}d}"


def checkpoint_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """The step directories under ``root``, oldest first; a ``root`` the system does not let us list is a
    :class:`CheckpointError` naming it."""
    root = Path(root)
    try:
        return sorted((int(p.name[len(PREFIX):]), p) for p in (root.iterdir() if root.is_dir() else ())
                      if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit())
    except OSError as err:
        raise CheckpointError(f"{root}: cannot read it ({err.strerror or err})") from None


def checkpoint_root(cfg, twin: str) -> Path:
    """Where training checkpoints go: ``--checkpoint-dir``, else the ``--resume`` directory (a resumed run
    goes on writing where it left off), else a new ``runs/<twin>-<time>-<pid>`` (never an old run's)."""
    return Path(cfg.checkpoint_dir or cfg.resume or f"runs/{twin}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def read_progress(path: Path, framework: str = "torch") -> Progress:
    return Progress.from_dict(read_json(path / PROGRESS_FILES[framework]), path / PROGRESS_FILES[framework])


def run_ids(root: str | Path) -> set[str]:
    """The run ids the step directories under ``root`` hold in their progress records (either twin's), those that
    can be read."""
    found = set()
    for _, path in checkpoint_dirs(root):
        for file in PROGRESS_FILES.values():
            try:
                run_id = read_json(path / file).get("run_id") if (path / file).is_file() else None
            except (CheckpointError, AttributeError, OSError):  # damaged, not a JSON object, unreadable
                continue
            if isinstance(run_id, str):
                found.add(run_id)
    return found


def claim_run_dir(root: Path, cfg) -> None:
    """A new run (no --resume) writing its training checkpoints into ``root``: refuse one holding another run's,
    unless --overwrite, which removes them (kept, they would count as the newest of this run's)."""
    if cfg.resume or not checkpoint_dirs(root):
        return
    if not cfg.overwrite:
        raise ConfigError(f"training checkpoints: {root} holds another run's ({PREFIX}*); continue it with --resume "
                          f"{root}, or pass --overwrite to replace them")
    for _, old in checkpoint_dirs(root):
        shutil.rmtree(old)


def _setting(name: str, value: Any) -> str:
    return f"a vocabulary of {value}" if name == VOCAB_SIZE else f"--{flag(name)} {value!r}"


def _difference(name: str, then: dict, now: dict) -> str | None:
    """How setting ``name`` of the saved run (``then``, its settings) differs in the resume's (``now``), in words;
    None where it does not, or where the resume does not know it. Where both record the LSTM implementation that ran,
    that is compared, not the flag that chose it: a run whose ``--lstm-impl auto`` ran fused resumes under
    ``--lstm-impl fused``, and one whose auto ran another implementation than the resume would is refused."""
    if name not in now or name == LSTM_IMPL_RAN:
        return None
    if name == "lstm_impl" and LSTM_IMPL_RAN in then and LSTM_IMPL_RAN in now:
        ran, runs = then[LSTM_IMPL_RAN], now[LSTM_IMPL_RAN]
        if ran == runs:
            return None
        was = repr(ran) if then[name] == ran else f"{then[name]!r} (which ran {ran})"
        asked = repr(runs) if now[name] == runs else f"{now[name]!r} (which runs {runs} here)"
        return f"--lstm-impl {was}, not {asked}"
    if now[name] == then[name]:
        return None
    if isinstance(then[name], bool) and isinstance(now[name], bool):  # as the flags are spelt: --tied, --no-tied
        return ", not ".join(f"--{'' if value else 'no-'}{flag(name)}" for value in (then[name], now[name]))
    return f"{_setting(name, then[name])}, not {now[name]!r}"


def check_same_run(path: Path, settings: dict, framework: str | None, root: Path) -> None:
    """Refuse (:class:`ConfigError`, in one line) to resume from the step directory ``path`` a run of the other twin,
    or one trained with other trajectory ``settings`` (each differing one named), reading its progress record only.
    A record that is missing or damaged is a :class:`CheckpointError`."""
    writer = next((twin for twin, file in PROGRESS_FILES.items() if (path / file).is_file()), None)
    if writer is None:
        raise CheckpointError(f"{path}: no progress record (a checkpoint not written to the end)")
    if framework and writer != framework:
        raise ConfigError(f"--resume {root}: the run was written by the {TWINS[writer]}, whose training checkpoints "
                          f"the {TWINS[framework]} does not read; resume it with that twin")
    saved = read_progress(path, writer).settings or {}
    differ = [d for d in (_difference(name, saved, settings) for name in saved) if d]
    if differ:
        if (path / CHECKSUM_FILE).exists():
            verify_manifest(path)  # settings read from a damaged record are no one's: fall back past it
        raise ConfigError(f"--resume {root}: the run was trained with {'; '.join(differ)}. Resume with the same "
                          f"settings and data")


def load_latest(root: str | Path, load: Callable[[Path], tuple[Progress, Any]], cfg=None,
                vocab_size: int | None = None, framework: str | None = None,
                lstm_impl_ran: str | None = None) -> tuple[Progress, Any, Path]:
    """The newest checkpoint under ``root`` that loads: ``(progress, state, dir)`` from ``load(dir)``. One that
    fails (``CheckpointError``: a file missing, or not matching its checksum) is reported on stderr and the previous
    one tried; with ``cfg``, :func:`check_same_run` refuses, before ``load``, a checkpoint of other trajectory
    settings (``vocab_size`` and ``lstm_impl_ran``, the implementation the resume runs, among them), or of the twin
    other than ``framework`` (a :class:`ConfigError`: no fallback)."""
    root = Path(root)
    candidates = checkpoint_dirs(root)
    if not candidates:
        raise CheckpointError(f"--resume {root}: no training checkpoint ({PREFIX}*) found there")
    for _, path in reversed(candidates):
        try:
            if cfg is not None:
                check_same_run(path, trajectory_settings(cfg, vocab_size, lstm_impl_ran), framework, root)
            progress, state = load(path)
        except (CheckpointError, OSError) as err:  # OSError: a step directory the system does not let us search
            said = f"{err.filename}: cannot read it ({err.strerror})" if isinstance(err, OSError) else err
            print(f"warning: {said}; falling back to the previous checkpoint", file=sys.stderr)
            continue
        return progress, state, path
    raise CheckpointError(f"--resume {root}: every training checkpoint there is damaged or cannot be read (the "
                          f"warnings above name each)")

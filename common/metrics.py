"""What both trainers print and record: the seed's log line and the metrics JSONL."""
import contextlib
import json
import math
from pathlib import Path
from typing import Any

from common.errors import ConfigError

TIMING_FIELDS = ("train_seconds",)  # wall-clock fields: never equal between two runs


def log_line(epoch: int, epochs: int, step: int, loss: float, val_loss: float, value: float,
             metric: str = "accuracy", lr: float | None = None) -> str:
    """The classic notebook's line (``epoch`` 1-based), with the validation metric appended: the classifier's
    accuracy, or the language model's perplexity and learning rate (the LM example prints both)."""
    line = f"Epoch: {epoch}/{epochs}... Step: {step}... Loss: {loss:.6f}... Val Loss: {val_loss:.6f}... "
    if metric == "accuracy":
        return line + f"Val Acc: {value:.4f}"
    return line + f"Val PPL: {value:.2f}... LR: {lr:g}"


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62  # an unreadable (half-written) line is dropped


class MetricsLog(contextlib.AbstractContextManager):
    """JSON lines: ``{"step": 0, "run": {...}}`` first (what ran: framework, device, dtype, lstm_impl, ...),
    then ``{"step", "epoch", "loss"}`` per training step and ``{"step", "split", "loss", "accuracy"}`` per
    evaluation, flushed per record so a killed run keeps what it logged. ``truncate_after`` (resume) first
    drops the records with ``step`` beyond it, so a resumed run's file has no gap and no duplicated step."""

    def __init__(self, path: str | Path | None, truncate_after: int | None = None):
        self.path = Path(path) if path else None
        self._file = None
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if truncate_after is not None and self.path.exists():
                kept = [line + "\n" for line in self.path.read_text(encoding="utf-8").splitlines()
                        if line.strip() and _step_of(line) <= truncate_after]
                self.path.write_text("".join(kept), encoding="utf-8")
            self._file = open(self.path, "w" if truncate_after is None else "a", encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"--metrics-out {self.path}: cannot write ({err.strerror})") from None

    def write(self, **record: Any) -> None:
        if self._file is not None:
            # JSON has no NaN: a non-finite number is written as null.
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
            self._file.write(json.dumps(clean, allow_nan=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | Path, timing: bool = True) -> list[dict[str, Any]]:
    """The records of a metrics JSONL file; ``timing=False`` drops the wall-clock fields, leaving what two
    identical runs (an interrupted-and-resumed one and an uninterrupted one, say) agree on exactly."""
    records = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return records if timing else [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def training_steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step records (``{"step", "epoch", "loss", "train_seconds"}``), without the header and evaluations."""
    return [r for r in records if "epoch" in r]


def evaluations(records: list[dict[str, Any]], split: str | None = None) -> list[dict[str, Any]]:
    """The evaluation records (``{"step", "split", "loss", "accuracy", ...}``), of one split or of all."""
    return [r for r in records if "split" in r and (split is None or r["split"] == split)]

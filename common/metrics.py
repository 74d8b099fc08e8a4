"""What both trainers print and record: the seed's log line and the metrics JSONL."""
import contextlib
import json
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from common.files import to_json

TIMING_FIELDS = ("train_seconds",)  # wall-clock fields: never equal between two runs
RUN_ID = "run_id"  # in the first record: the run's id, which its training checkpoints' progress records hold too


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


def log_run_id(path: str | Path) -> str | None:
    """The run id in the first record of the metrics log ``path``; None for a file that has none (not a metrics log,
    one written before logs had ids) or that cannot be read."""
    try:
        with open(path, encoding="utf-8") as file:
            first = json.loads(file.readline())
    except (OSError, ValueError):
        return None
    found = first.get(RUN_ID) if isinstance(first, dict) else None
    return found if isinstance(found, str) else None


class MetricsLog(contextlib.AbstractContextManager):
    """JSON lines: ``{"step": 0, "run": {...}, "run_id": ...}`` first (what ran: framework, device, dtype, lstm_impl,
    ...; the run's id), then ``{"step", "epoch", "loss"}`` per training step and ``{"step", "split", "loss",
    "accuracy"}`` per evaluation, flushed per record so a killed run keeps what it logged. A number that is not finite
    is written ``null`` (JSON has no NaN).

    ``truncate_after`` (resume): the file is continued, its records with ``step`` beyond it dropped first, so a
    resumed run's file has no gap and no duplicated step; only when it is the run's own, though: with ``run_id``, a
    file whose first record names another run (or none) is started afresh instead. ``continued`` says which: a log
    started afresh needs its first record written."""

    def __init__(self, path: str | Path | None, truncate_after: int | None = None, run_id: str | None = None):
        self.path = Path(path) if path else None
        self._file = None
        self.continued = False
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.continued = (truncate_after is not None and self.path.is_file() and self.path.stat().st_size > 0
                              and (run_id is None or log_run_id(self.path) == run_id))
            if self.continued:
                kept = [line + "\n" for line in self.path.read_text(encoding="utf-8").splitlines()
                        if line.strip() and _step_of(line) <= truncate_after]
                self.path.write_text("".join(kept), encoding="utf-8")
            self._file = open(self.path, "a" if self.continued else "w", encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"--metrics-out {self.path}: cannot write ({err.strerror})") from None

    def write(self, **record: Any) -> None:
        if self._file is not None:
            self._file.write(to_json(record) + "\n")  # a number that is not finite: null
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | Path, timing: bool = True) -> list[dict[str, Any]]:
    """The records of a metrics JSONL file; ``timing=False`` drops the wall-clock fields and the run's id, leaving
    what two identical runs (an interrupted-and-resumed one and an uninterrupted one, say) agree on exactly."""
    records = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    varying = (*TIMING_FIELDS, RUN_ID)
    return records if timing else [{k: v for k, v in r.items() if k not in varying} for r in records]


def training_steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step records (``{"step", "epoch", "loss", "train_seconds"}``), without the header and evaluations."""
    return [r for r in records if "epoch" in r]


def evaluations(records: list[dict[str, Any]], split: str | None = None) -> list[dict[str, Any]]:
    """The evaluation records (``{"step", "split", "loss", "accuracy", ...}``), of one split or of all."""
    return [r for r in records if "split" in r and (split is None or r["split"] == split)]

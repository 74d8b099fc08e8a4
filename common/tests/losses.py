"""Tests' reading of a metrics log: the training losses, step by step."""
from typing import Any

from common.metrics import training_steps


def step_losses(records: list[dict[str, Any]]) -> list[float | None]:
    """Training losses in step order (``None``: a skipped non-finite step); ``ValueError`` unless steps are 1, 2, ..."""
    steps = training_steps(records)
    if [r["step"] for r in steps] != list(range(1, len(steps) + 1)):
        raise ValueError("the training steps of the metrics records are not 1, 2, 3, ...")
    return [r["loss"] for r in steps]

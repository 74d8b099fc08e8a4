"""``python -m common.tests.kill_at_step TRAINER before|after N ARGS...``: ``python -m TRAINER ARGS...`` (TRAINER is
``torch_impl.train`` or ``jax_impl.train``), its process killed by SIGKILL at its ``N``-th training step: ``after``,
right after that step returns (its work done, before the loop sees its result); ``before``, right before it starts
(so right after whatever the loop did for step N - 1, a checkpoint included).

A kill at a known step makes a resume test exact where watching the checkpoint folder races the run. The trainer
knows nothing of it: this builds the run as the trainer's ``main`` does (the same flags, the same set-up, its
``twin_maker`` and ``common.loop.train``) and hands the loop the trainer's own twin, wrapped only to count its
``train_step`` calls. The count starts at this process's first step: a fresh run's step numbers, not a resumed one's.
"""
from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any, Callable, Sequence

from common import loop
from common.config import parse_config
from common.errors import cli_main


def _start_jax() -> None:
    """What ``jax_impl.train.main`` does between parsing its flags and training."""
    from jax_impl import xla_env
    xla_env.configure()


BEFORE_TRAINING: dict[str, Callable[[], None]] = {"torch_impl.train": lambda: None, "jax_impl.train": _start_jax}


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # no handler, no flush, no atexit: as a crash or the OOM killer ends it


class KilledAtStep:
    """``twin`` as it is, but for its process killed before or after its ``step``-th ``train_step`` call."""

    def __init__(self, twin: Any, step: int, when: str):
        self._twin, self._step, self._when, self._calls = twin, step, when, 0

    def __getattr__(self, name: str) -> Any:  # everything but train_step: the trainer's twin itself
        return getattr(self._twin, name)

    def train_step(self, state: Any, carry: Any, batch: Any) -> tuple[Any, Any, float]:
        self._calls += 1
        if self._calls == self._step and self._when == "before":
            _die()
        out = self._twin.train_step(state, carry, batch)
        if self._calls == self._step:
            _die()
        return out


@cli_main
def main(argv: Sequence[str]) -> int:
    if len(argv) < 3 or argv[0] not in BEFORE_TRAINING or argv[1] not in ("before", "after") or not argv[2].isdigit():
        raise SystemExit(__doc__.split("\n\n")[0])  # the usage: exit status 1
    trainer_name, when, step, *args = argv
    trainer = importlib.import_module(trainer_name)
    cfg = parse_config(args, trainer.PROG, f"{trainer_name}, killed at training step {step}.")
    BEFORE_TRAINING[trainer_name]()
    with trainer.twin_maker(cfg) as make_twin:
        loop.train(cfg, lambda cfg, vocab_size: KilledAtStep(make_twin(cfg, vocab_size), int(step), when))
    # Exit 1, not -SIGKILL, so a test sees that the kill it asked for never happened.
    print(f"kill_at_step: the run ended before its training step {step}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

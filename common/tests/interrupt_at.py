"""``python -m common.tests.interrupt_at TRAINER step|save|eval|gc|compile N ARGS...``: ``python -m TRAINER ARGS...``
(TRAINER is ``torch_impl.train`` or ``jax_impl.train``), sent SIGINT by its own process at a chosen point, as Ctrl-C
would:

- ``step``: in the middle of the ``N``-th training step (PyTorch: in the model's forward pass; JAX: once the jitted
  step is dispatched, while it runs);
- ``save``: in the middle of the ``N``-th training checkpoint, as it is written (before its checksums);
- ``eval``: right after the ``N``-th evaluation batch is dispatched;
- ``gc``: inside a garbage-collection callback, right after the ``N``-th training step (where Python drops
  exceptions; JAX runs such a callback at every collection);
- ``compile`` (JAX): 0.1 s into XLA's ``N``-th compilation of the training step (seconds long), which runs in a
  thread of its own while JAX waits for it.

A signal at a known point makes an interrupt test exact. The trainer knows nothing of it: this builds the run as the
trainer's ``main`` does (as :mod:`common.tests.kill_at_step` does) and hands the loop the trainer's own twin, wrapped
only to count calls and to place the hooks. Its exit status is the trainer's: 130 when the interrupt ended the run.
"""
from __future__ import annotations

import importlib
import signal
import sys
import threading
from typing import Any, Callable, Sequence

from common import loop
from common.config import parse_config
from common.errors import cli_main
from common.interrupts import exit_process
from common.tests.interrupt_program import collect_with, interrupt, interrupt_in_gc
from common.tests.kill_at_step import BEFORE_TRAINING

POINTS = ("step", "save", "eval", "gc", "compile")
COMPILE_S = 0.1  # far shorter than any XLA compilation of a training step


class Trigger:
    """Sends SIGINT to this process at its ``n``-th call (1-based), once, by ``send``."""

    def __init__(self, n: int, send: Callable[[], None] = interrupt):
        self.n, self.calls, self.send = n, 0, send

    def __call__(self, *_: Any) -> None:
        self.calls += 1
        if self.calls == self.n:
            self.send()


def _during_torch_step(twin: Any, fire: Trigger) -> None:
    twin.model.register_forward_hook(lambda module, *_: fire() if module.training else None)


def _during_jax_step(twin: Any, fire: Trigger) -> None:
    step = twin.step

    def dispatched_then_fire(*args: Any) -> Any:
        out = step(*args)  # asynchronous: the step runs on while Python goes on
        fire()
        return out

    twin.step = dispatched_then_fire


def _during_jax_compile(fire: Trigger) -> None:
    from jax._src import compiler
    from jax._src.lib.mlir import ir
    compile_and_load = compiler.backend_compile_and_load

    def compiling_then_fire(backend: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        if "train_step" in ir.StringAttr(module.operation.attributes["sym_name"]).value:  # as JAX names it
            fire()
        return compile_and_load(backend, module, *args, **kwargs)

    compiler.backend_compile_and_load = compiling_then_fire


DURING_STEP: dict[str, Callable[[Any, Trigger], None]] = {"torch_impl.train": _during_torch_step,
                                                          "jax_impl.train": _during_jax_step}


class InterruptedAt:
    """``twin`` as it is, but for SIGINT sent at ``point`` (see the module's docstring)."""

    def __init__(self, twin: Any, point: str, fire: Trigger):
        self._twin, self._point, self._fire = twin, point, fire

    def __getattr__(self, name: str) -> Any:  # everything else: the trainer's twin itself
        return getattr(self._twin, name)

    def train_step(self, state: Any, carry: Any, batch: Any) -> tuple[Any, Any, float]:
        out = self._twin.train_step(state, carry, batch)
        if self._point == "gc":
            self._fire()
        return out

    def eval_step(self, state: Any, carry: Any, batch: Any) -> Any:
        out = self._twin.eval_step(state, carry, batch)
        if self._point == "eval":
            self._fire()
        return out


@cli_main
def main(argv: Sequence[str]) -> int:
    if len(argv) < 3 or argv[0] not in BEFORE_TRAINING or argv[1] not in POINTS or not argv[2].isdigit():
        raise SystemExit(__doc__.split("\n\n")[0])  # the usage: exit status 1
    trainer_name, point, n, *args = argv
    # Ctrl-C as a terminal delivers it, even where this process inherited SIGINT ignored (a shell's background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    trainer = importlib.import_module(trainer_name)
    cfg = parse_config(args, trainer.PROG, f"{trainer_name}, interrupted at {point} {n}.")
    send = {"gc": lambda: collect_with(interrupt_in_gc), "compile": threading.Timer(COMPILE_S, interrupt).start}
    fire = Trigger(int(n), send.get(point, interrupt))
    if point == "save":  # both twins' saves end with the checksums: the rest of the step is written by then
        state = importlib.import_module(trainer_name.replace(".train", ".state"))
        write_manifest = state.write_manifest
        state.write_manifest = lambda directory: (fire(), write_manifest(directory))[1]
    if point == "compile":
        _during_jax_compile(fire)
    BEFORE_TRAINING[trainer_name]()

    def make(cfg, vocab_size):
        twin = make_twin(cfg, vocab_size)
        if point == "step":
            DURING_STEP[trainer_name](twin, fire)
        return InterruptedAt(twin, point, fire)

    with trainer.twin_maker(cfg) as make_twin:
        loop.train(cfg, make)
    print(f"interrupt_at: the run ended without the interrupt ({fire.calls} calls of {point})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))

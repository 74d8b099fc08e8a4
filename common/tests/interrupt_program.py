"""``python -m common.tests.interrupt_program WHEN PROGRAM ARGS...``: ``python -m PROGRAM ARGS...`` (or ``python
PROGRAM ARGS...`` for a ``.py`` file), sent SIGINT by its own process at a chosen moment, as Ctrl-C would:

- ``import:MODULE``: as MODULE starts to be imported (by the program's own imports: ``jax``, ``torch``...);
- ``call:MODULE:NAME``: at the first call of ``MODULE.NAME``, before it runs (MODULE is imported first, so that the
  program imports the wrapped function from it);
- ``gc:MODULE:NAME``: the same, but from inside a garbage-collection callback, where Python drops exceptions (JAX
  runs such a callback at every collection);
- ``exit``: from an ``atexit`` callback, once the program has returned and the interpreter finishes.

A signal at a known moment makes an interrupt test exact. The program runs as ``__main__`` (``runpy``), as ``python
-m`` runs it, with its own command line in ``sys.orig_argv`` and the project's packages imported anew, and knows
nothing of this; the exit status and the output are its own.
"""
import atexit
import functools
import gc
import importlib
import os
import runpy
import signal
import sys
from typing import Any, Callable

from common.interrupts import PACKAGES


def interrupt() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # Python runs its handler before its next instruction


def interrupt_in_gc(phase: str, info: dict) -> None:
    if phase == "start":
        interrupt()


def collect_with(callback: Callable[[str, dict], None]) -> None:
    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)


class InterruptAtImport:
    """A ``sys.meta_path`` finder that finds nothing: it sends SIGINT when ``name``'s import starts, once."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == self.name:
            sys.meta_path.remove(self)
            interrupt()


def interrupt_at_call(module_name: str, name: str, send: Callable[[], None]) -> None:
    module = importlib.import_module(module_name)
    original = getattr(module, name)

    @functools.wraps(original)
    def sending_first(*args: Any, **kwargs: Any) -> Any:
        setattr(module, name, original)
        send()
        return original(*args, **kwargs)

    setattr(module, name, sending_first)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0].split(":")[0] not in ("import", "call", "gc", "exit"):
        raise SystemExit(__doc__.split("\n\n")[0])  # the usage: exit status 1
    when, program, *args = argv
    kind, *where = when.split(":")
    # As the program's own command starts: Ctrl-C delivered as a terminal does (even where this process inherited
    # SIGINT ignored, as a shell's background job does), its command line, none of the project's modules loaded yet.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.orig_argv = [sys.executable, *([] if program.endswith(".py") else ["-m"]), program, *args]
    for name in [name for name in sys.modules if name.split(".")[0] in PACKAGES]:
        del sys.modules[name]
    if kind == "import":
        sys.meta_path.insert(0, InterruptAtImport(*where))
    elif kind in ("call", "gc"):
        interrupt_at_call(*where, interrupt if kind == "call" else lambda: collect_with(interrupt_in_gc))
    else:
        atexit.register(interrupt)  # registered first, so run last: after the program's own
    sys.argv = [program, *args]
    if program.endswith(".py"):
        runpy.run_path(program, run_name="__main__")
    else:
        runpy.run_module(program, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])

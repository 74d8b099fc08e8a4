"""Ctrl-C during training: one line and exit status 130, whatever the run was doing, never a traceback, never lost.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives. Two places make that wrong: inside
a garbage-collection callback or a ``__del__`` (JAX runs one at every collection) Python prints the exception as
"ignored" and drops it, and inside a save it would leave a checkpoint half-written (or Orbax's threads mid-write).
While :func:`handled` is open a SIGINT is remembered and raises at once, except in those places: there it raises at
the next :func:`check` (the loop calls it at every step and evaluation batch) or when the :func:`deferred` block
ends. The exception's message is :data:`describe`'s answer, for ``cli_main`` to print; the trainers then leave
through :func:`exit_process`.
"""
import gc
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, NoReturn

describe: Callable[[], str] = lambda: "interrupted"  # the loop's: "interrupted at step N; resume with ..."
_pending = False
_deferring = 0


def _in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a garbage-collection callback or a ``__del__``, where exceptions are dropped."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum, frame) -> None:
    global _pending
    _pending = True
    if not _deferring and not _in_finalizer(frame):
        raise KeyboardInterrupt(describe())


def check() -> None:
    """Raise the ``KeyboardInterrupt`` of a SIGINT that has not raised yet (or whose exception was dropped)."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt(describe())


@contextmanager
def deferred() -> Iterator[None]:
    """A SIGINT arriving inside the block raises when it ends: what the block writes is written whole."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring:
        check()


@contextmanager
def handled() -> Iterator[None]:
    """SIGINT handled as above inside the block, where Python's own handling is in force (the main thread, SIGINT
    not ignored, as it is for a shell's background job, nor handled by the caller)."""
    global _pending, describe
    ours = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    before, _pending = describe, False
    if ours:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
        check()  # one that arrived where nothing checked after it
    finally:
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        describe = before


def exit_process(status: int) -> NoReturn:
    """``sys.exit(status)``, but after Ctrl-C (130) without Python's finalisation: a framework may still be at work in
    threads of its own on what the interrupt cut short (XLA's compiler is), and tearing the interpreter down under
    them crashes it. What the run saved is complete by then: saves finish before the interrupt is raised."""
    if status == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)

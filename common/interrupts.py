"""Ctrl-C at any moment of any command line: one line on stderr and exit status 130, never a traceback, never lost.

Two handlers share the work, and neither needs more than the standard library.

- In a command of the project (:func:`exit_on_ctrl_c_in_a_command`), from the moment Python imports its package,
  before any heavy import (jax, torch: seconds; this module's own but ``os``, ``signal`` and ``sys``),
  :func:`exit_on_ctrl_c` is in force. Outside :func:`handled`, a SIGINT then writes one line and ends the process at
  once, with ``os._exit``. That is the one safe answer there: Python raises ``KeyboardInterrupt`` wherever the main
  thread is, so that an import half done becomes a traceback (or an ``ImportError``), and one raised in a
  garbage-collection callback (JAX runs one at every collection) is dropped ("Exception ignored in ..."), the
  interrupt lost. And it is safe: outside ``handled()`` the program is loading or tearing down, and writes nothing of
  its own.
- Inside :func:`handled` (``common.errors.cli_main`` opens it around every ``main``; the training loop, around the
  run), Python's way is kept, so that ``finally`` blocks run (a benchmark stops its workers, the loop closes its
  metrics): a SIGINT raises ``KeyboardInterrupt`` with :data:`describe`'s message, for ``cli_main`` to print. Except
  where the exception would be dropped or would cut a write in two: inside a garbage-collection callback or a
  ``__del__``, and inside :func:`deferred` (a save), the SIGINT is remembered and raises at the next :func:`check` (the
  loop calls it at every step and evaluation batch, ``handled()`` when it opens and closes) or when the ``deferred()``
  block ends. One that Python drops all the same (a weakref callback) is remembered through ``sys.unraisablehook``.

A SIGINT that arrives while the main thread runs native code (an XLA compilation, a long kernel) takes effect when
control returns to the interpreter: Python runs signal handlers only between its own instructions. Programs then leave
through :func:`exit_process`, which skips the interpreter's finalisation (where Python gives SIGINT back its
default, fatal action).
"""
import os
import signal
import sys

INTERRUPTED = 130  # a shell's status for a process ended by SIGINT (128 + 2)
STARTING = "interrupted while starting; nothing was written"  # before any handled() block: imports and set-up only
PACKAGES = ("common", "jax_impl", "torch_impl", "benchmarks", "tools", "studies", "scripts", "parity_tests")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder that holds PACKAGES

_pending = False  # a SIGINT whose KeyboardInterrupt is still to be raised
_deferring = 0
_started = False  # a handled() block has taken over from exit_on_ctrl_c's handler: STARTING is no longer true
_said = False  # the interrupt's line is written: a further SIGINT ends the process without another
_message = ""  # what the last KeyboardInterrupt raised here said


def exit_on_ctrl_c_in_a_command() -> None:
    """:func:`exit_on_ctrl_c` where the running command is one of this project's (``python -m jax_impl.train``,
    ``python benchmarks/bench.py``: ``sys.orig_argv``); nothing where a program of someone else's imports the
    package. Every package of the project calls it as it is imported, this module first of all."""
    if is_a_command(sys.orig_argv):
        exit_on_ctrl_c()


def is_a_command(argv: list[str]) -> bool:
    """Whether the interpreter's command line ``argv`` runs a module (``-m``) or a script of :data:`PACKAGES`."""
    args = iter(argv[1:])
    for arg in args:
        if arg.startswith("-m"):
            return (arg[2:] or next(args, "")).split(".")[0] in PACKAGES
        if not arg.startswith("-"):  # a script's path
            return any(os.path.realpath(arg).startswith(os.path.join(_ROOT, p, "")) for p in PACKAGES)
        if arg == "-" or arg.startswith("-c"):  # standard input, or code on the command line
            return False
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            next(args, None)  # the option's value
    return False


def exit_on_ctrl_c() -> None:
    """From now on, outside :func:`handled`, a SIGINT ends the process at once with one line and status 130; nothing
    where SIGINT is ignored (a shell's background job) or handled by the caller, nor outside the main thread."""
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _exit_at_once):
        try:
            signal.signal(signal.SIGINT, _exit_at_once)
        except ValueError:  # not the main thread, the only one Python runs handlers in
            pass


def _exit_at_once(signum, frame) -> None:
    global _said
    if not _said:
        _said = True
        # A KeyboardInterrupt already on its way from handled() to cli_main (a second Ctrl-C) says more.
        in_flight = sys.exc_info()[1]
        said = (_message or str(in_flight)) if isinstance(in_flight, KeyboardInterrupt) else ""
        _write_line(said or ("interrupted" if _started else STARTING))
    _flush_output()
    os._exit(INTERRUPTED)  # no finalisation: nothing of the program's is mid-write here (see the module's docstring)


def _write_line(message: str) -> None:
    """``message`` on stderr, after what the program wrote; straight to the file descriptor, since the signal may have
    arrived inside a write to ``sys.stderr`` itself (which then refuses a second, reentrant one)."""
    _flush_output()
    try:
        os.write(2, f"{message}\n".encode(errors="replace"))
    except OSError:  # stderr closed: nowhere to say it
        pass


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError, AttributeError):  # a broken pipe, closed, reentrant, or None
            pass


exit_on_ctrl_c_in_a_command()  # first, before the imports below: a Ctrl-C while they load is already one line

import atexit  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import threading  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any, Callable, Iterator, NoReturn  # noqa: E402

describe: Callable[[], str] = lambda: "interrupted"  # the loop's: "interrupted at step N; resume with ..."


def _may_handle_sigint() -> bool:
    """In the main thread (the one Python runs handlers in), with SIGINT at Python's default or ours, not ignored."""
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _exit_at_once))


def say(message: str) -> None:
    """Write the interrupt's one line on stderr (``cli_main`` does, for the ``KeyboardInterrupt`` it caught); a further
    SIGINT then ends the process without a second line."""
    global _said
    _said = True
    print(message, file=sys.stderr, flush=True)


def _interrupt() -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` of a SIGINT, saying :data:`describe`'s answer, which :func:`message` keeps."""
    global _message
    _message = describe()
    return KeyboardInterrupt(_message)


def message(err: KeyboardInterrupt) -> str:
    """What to say of ``err``: the message it was raised with, even where code it passed through rewrapped it (a
    codec's decode turns it into "decoding with 'utf-8' codec failed (KeyboardInterrupt: ...)")."""
    return _message or str(err) or "interrupted"


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
    if _deferring or _in_finalizer(frame):
        _pending = True
    else:
        raise _interrupt()


def _remember_dropped(hook: Callable[[Any], None], unraisable: Any) -> None:
    """``sys.unraisablehook`` inside :func:`handled`: a ``KeyboardInterrupt`` that Python drops (one raised in a
    finalizer :func:`_in_finalizer` cannot see) raises at the next :func:`check`; anything else goes to ``hook``."""
    global _pending
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _pending = True
    else:
        hook(unraisable)


def check() -> None:
    """Raise the ``KeyboardInterrupt`` of a SIGINT that has not raised yet (or whose exception was dropped)."""
    global _pending
    if _pending:
        _pending = False
        raise _interrupt()


@contextmanager
def deferred() -> Iterator[None]:
    """Inside :func:`handled`: a SIGINT arriving inside the block raises when it ends, so what the block writes is
    written whole. (Outside ``handled()`` a program is only loading or tearing down: it ends at once.)"""
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
    """SIGINT handled as above inside the block, where Python's own handling or :func:`exit_on_ctrl_c`'s is in force
    (the main thread, SIGINT not ignored, as it is for a shell's background job, nor handled by the caller); when it
    closes, that handling is back. Nested, the block only raises a remembered SIGINT as it opens and closes."""
    global _pending, _started, describe
    before, takes_over = signal.getsignal(signal.SIGINT), _may_handle_sigint()
    described, unraisablehook = describe, sys.unraisablehook
    if takes_over:
        _pending, _started = False, _started or before is _exit_at_once
        signal.signal(signal.SIGINT, _on_sigint)
        sys.unraisablehook = functools.partial(_remember_dropped, unraisablehook)
    try:
        check()  # one an enclosing block remembered: now, not after this block's work
        yield
        check()  # one that arrived where nothing checked after it
    finally:
        if takes_over:
            signal.signal(signal.SIGINT, before)
            sys.unraisablehook = unraisablehook
        describe = described


def exit_process(status: int) -> NoReturn:
    """End the program with ``status``, Ctrl-C still one line and 130 until the very end. After Ctrl-C (130) at once:
    a framework may still be at work in threads of its own on what the interrupt cut short (XLA's compiler is), and
    tearing the interpreter down under them crashes it; what the run saved is complete by then (saves finish before
    the interrupt is raised). Otherwise as Python's own exit would, in its order, but for its finalisation: the
    threads it waits for stopped and joined (:func:`_stop_threads`), then the ``atexit`` functions run (under
    :func:`exit_on_ctrl_c`'s handler), the output flushed, then the process ends. Python's finalisation would put
    SIGINT back to its default first, so a Ctrl-C during the seconds torch and JAX take to tear down would kill the
    process silently, and it frees nothing a finished program needs."""
    if status != INTERRUPTED:
        _stop_threads()
        atexit._run_exitfuncs()  # what sys.exit would run; public spelling there is none
    _flush_output()
    os._exit(status)


def _stop_threads() -> None:
    """The first step of Python's own exit, which it takes before the ``atexit`` functions: the hooks registered with
    ``threading._register_atexit`` run (``concurrent.futures`` registers the one that tells the idle workers of every
    ``ThreadPoolExecutor`` to stop: torch.compile leaves such a pool), then every non-daemon thread is joined. A
    worker told nothing waits for work for ever, and joining it hangs. ``threading._shutdown`` is that step, the
    function the interpreter itself calls; public spelling there is none."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
        return
    for thread in threading.enumerate():  # an interpreter without it: at least the threads that end on their own
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()

"""Errors a user can cause, and the one place they become a message: every command line (train, predict,
common.data, bench) wraps its ``main`` in :func:`cli_main`, so a :class:`UserError` or a Ctrl-C is one line, never a
traceback."""
import functools
import sys
from typing import Callable

from common import interrupts


class UserError(Exception):
    """Something the user can fix: bad data, a bad flag value, a bad checkpoint."""


class DataError(UserError):
    """A missing, empty or malformed corpus file, or too little data."""


class ConfigError(UserError):
    """A flag or configuration value out of range."""


class UnsupportedError(ConfigError):
    """A combination a library cannot compute (e.g. bfloat16 in a float32-only kernel): the benchmark reports its row
    as not applicable, with this message."""


class CheckpointError(UserError):
    """A checkpoint that is missing, corrupt, or does not match the requested model."""


def cli_main(main: Callable[..., int | None]) -> Callable[..., int]:
    """Run ``main`` with Ctrl-C handled (:func:`common.interrupts.handled`: a ``KeyboardInterrupt``, never dropped,
    and raised after a save, not inside it); print a :class:`UserError` as ``error: ...`` on stderr and return 2
    (Ctrl-C: its message, and 130)."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            with interrupts.handled():
                return main(*args, **kwargs) or 0
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as err:  # the training loop's says where to resume
            interrupts.say(interrupts.message(err))
            return interrupts.INTERRUPTED

    return wrapped

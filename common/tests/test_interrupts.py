"""Ctrl-C's handling in this process: at once, after a save, never dropped in a garbage-collection callback."""
from __future__ import annotations

import gc
import os
import signal

import pytest

from common import interrupts


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handling, even where the test runner inherited SIGINT ignored (a background job)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def _said(where: str):
    interrupts.describe = lambda: f"interrupted at {where}"


def test_a_sigint_raises_at_once_with_the_loops_description(python_sigint):
    done = []
    with pytest.raises(KeyboardInterrupt, match="^interrupted at step 3$"):
        with interrupts.handled():
            _said("step 3")
            _ctrl_c()
            done.append("after")
    assert done == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigint_during_a_save_raises_once_the_save_is_written(python_sigint):
    written = []
    with pytest.raises(KeyboardInterrupt, match="^interrupted at the save$"):
        with interrupts.handled():
            _said("the save")
            with interrupts.deferred():
                _ctrl_c()
                written.append("first half")
                written.append("second half")
    assert written == ["first half", "second half"]


def test_a_sigint_in_a_garbage_collection_callback_is_not_dropped_but_raised_at_the_next_check(python_sigint, capsys):
    def callback(phase, info):
        if phase == "start":
            _ctrl_c()

    with interrupts.handled():
        gc.callbacks.append(callback)
        try:
            gc.collect()  # Python drops what a callback raises, printing "Exception ignored in"
        finally:
            gc.callbacks.remove(callback)
        with pytest.raises(KeyboardInterrupt, match="^interrupted$"):
            interrupts.check()
    assert capsys.readouterr().err == ""


def test_an_ignored_sigint_stays_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.handled():
            _ctrl_c()  # a shell's background job: Ctrl-C is not for it
            interrupts.check()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("status, finalised", [(130, ""), (2, "finalised\n")])
def test_an_interrupted_process_exits_without_finalisation(python_code, status, finalised):
    proc = python_code(f"import atexit\nfrom common.interrupts import exit_process\n"
                       f"atexit.register(print, 'finalised')\nprint('written', flush=False)\nexit_process({status})")
    assert proc.returncode == status and proc.stdout == "written\n" + finalised

"""Ctrl-C's handling: at once, after a save, never dropped in a garbage-collection callback; and in a program, from
its first line to its last, one line on stderr and exit status 130."""
from __future__ import annotations

import codecs
import gc
import os
import signal
import sys
import weakref

import pytest

from common import interrupts
from common.errors import cli_main
from common.tests.conftest import REPO_ROOT, run_python


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


@pytest.fixture
def early_handler(python_sigint):
    """:func:`interrupts.exit_on_ctrl_c` as a command's packages install it (a SIGINT would end pytest: none is sent
    outside a handled() block)."""
    interrupts.exit_on_ctrl_c()
    early = signal.getsignal(signal.SIGINT)
    yield early
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_importing_a_command_line_module_installs_no_handler(python_code):
    proc = python_code("import signal\nimport common.data\n"
                       "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    assert (proc.returncode, proc.stdout) == (0, "True\n"), proc.stderr


def test_a_users_program_that_imports_every_package_keeps_pythons_sigint_handling(tmp_path):
    program = tmp_path / "users_program.py"
    program.write_text(f"import signal, sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
                       f"import {', '.join(interrupts.PACKAGES)}, common.data\n"
                       "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    proc = run_python([str(program)])
    assert (proc.returncode, proc.stdout) == (0, "True\n"), proc.stderr


@pytest.mark.parametrize("argv, is_a_command", [
    (["python", "-m", "jax_impl.train", "--max-steps", "2"], True),
    (["python", "-u", "-W", "ignore", "-X", "importtime", "-mtorch_impl.train"], True),
    (["python", "-m", "common.data"], True),
    (["python", f"{REPO_ROOT}/benchmarks/bench.py", "--quick"], True),
    (["python", "-m", "pytest", "-q"], False),
    (["python", "-c", "import jax_impl.train", "-m", "jax_impl.train"], False),
    (["python", "-"], False),
    (["python", "/tmp/users_program.py"], False),
    (["python", f"{REPO_ROOT}/setup_helper.py"], False),  # the repository's folder, but none of its packages
    (["python"], False),
])
def test_a_command_of_the_project_is_a_module_or_a_script_of_its_packages(argv, is_a_command):
    assert interrupts.is_a_command(argv) is is_a_command


def test_in_a_command_the_handler_is_in_force_before_the_interrupt_modules_heavier_imports(python_code):
    # What the handler was as typing and threading (this module's heavier imports) started to load.
    proc = python_code("import signal, sys\nsys.orig_argv = [sys.executable, '-m', 'jax_impl.train']\n"
                       "seen = {}\nclass Watch:\n    def find_spec(self, name, path, target=None):\n"
                       "        if name in ('typing', 'threading'):\n"
                       "            seen[name] = signal.getsignal(signal.SIGINT).__name__\n"
                       "assert 'typing' not in sys.modules and 'threading' not in sys.modules\n"
                       "sys.meta_path.insert(0, Watch())\nimport common.interrupts\nprint(sorted(seen.items()))")
    assert (proc.returncode, proc.stdout) == (0, "[('threading', '_exit_at_once'), ('typing', '_exit_at_once')]\n"), \
        proc.stderr


def test_the_packages_that_install_the_handler_are_the_ones_the_wheel_installs():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert set(interrupts.PACKAGES) == set(pyproject["tool"]["scikit-build"]["wheel"]["packages"])


def test_a_handled_block_takes_over_from_the_early_handler_and_gives_it_back(early_handler):
    assert early_handler is not signal.default_int_handler
    with pytest.raises(KeyboardInterrupt, match="^interrupted at step 3$"):
        with interrupts.handled():
            _said("step 3")
            _ctrl_c()  # raised here, as a KeyboardInterrupt, not an exit at once
    assert signal.getsignal(signal.SIGINT) is early_handler


def test_a_sigint_remembered_in_an_enclosing_block_raises_as_a_nested_one_opens(python_sigint):
    def callback(phase, info):
        if phase == "start":
            _ctrl_c()

    ran = []
    with interrupts.handled():  # cli_main's, around main
        gc.callbacks.append(callback)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(callback)
        with pytest.raises(KeyboardInterrupt, match="^interrupted$"):
            with interrupts.handled():  # the training loop's: its work does not start
                ran.append("training")
    assert ran == []


def test_a_sigint_that_python_drops_in_a_weakref_callback_raises_at_the_next_check(python_sigint, capsys):
    class Resource:
        pass

    with interrupts.handled():
        resource = Resource()
        reference = weakref.ref(resource, lambda _: _ctrl_c())
        del resource  # Python runs the callback, and drops what it raises
        assert reference() is None
        with pytest.raises(KeyboardInterrupt, match="^interrupted$"):
            interrupts.check()
    assert capsys.readouterr().err == ""


def test_cli_main_prints_an_interrupt_once_and_returns_130(python_sigint, capsys):
    assert cli_main(_ctrl_c)() == 130
    assert capsys.readouterr().err == "interrupted\n"
    with interrupts.handled():  # nothing left over to raise a second time
        pass


def test_an_interrupt_a_codec_rewraps_is_said_as_it_was_raised(python_sigint, capsys, monkeypatch):
    codecs.register_error("lstm_twins_ctrl_c", lambda error: signal.raise_signal(signal.SIGINT))

    def read_a_file():  # Python rewraps it: "decoding with 'utf-8-sig' codec failed (KeyboardInterrupt: ...)"
        interrupts.describe = lambda: "interrupted while reading"
        b"\xff".decode("utf-8-sig", "lstm_twins_ctrl_c")  # a codec written in Python, as the corpus reader uses

    assert cli_main(read_a_file)() == 130
    assert capsys.readouterr().err == "interrupted while reading\n"


def test_importing_common_interrupts_imports_only_the_standard_library(python_code):
    proc = python_code("import sys\nbefore = set(sys.modules)\nimport common.interrupts\n"
                       "print(*sorted({m.split('.')[0] for m in set(sys.modules) - before}))")
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) - set(sys.stdlib_module_names) == {"common"}


# A program's life outside handled() blocks, in a fresh interpreter: its start (the imports) and its end.
PROGRAM = ("import gc, os, signal\nfrom common import interrupts\nfrom common.errors import cli_main\n"
           "interrupts.exit_on_ctrl_c()\n"
           "def ctrl_c(*_):\n    os.kill(os.getpid(), signal.SIGINT)\n")


def test_a_sigint_while_a_program_starts_is_one_line_and_exit_130_at_once(python_code):
    proc = python_code(PROGRAM + "print('loading')\nctrl_c()\nprint('loaded')")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "loading\n", f"{interrupts.STARTING}\n")


def test_a_sigint_in_a_garbage_collection_callback_while_a_program_starts_is_not_lost(python_code):
    proc = python_code(PROGRAM + "gc.callbacks.append(lambda phase, info: ctrl_c())\ngc.collect()\nprint('done:')")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", f"{interrupts.STARTING}\n")


def test_a_sigint_after_a_programs_main_is_one_line_and_exit_130(python_code):
    proc = python_code(PROGRAM + "status = cli_main(lambda: print('done:'))()\nctrl_c()\nprint('finishing')")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "done:\n", "interrupted\n")


def test_a_program_that_ends_well_keeps_ctrl_c_one_line_and_130_until_its_last_instruction(python_code):
    # Python's own exit would give SIGINT back its default action before tearing torch and JAX down (seconds), so a
    # Ctrl-C there killed the process without a word; exit_process ends it on the program's own terms.
    proc = python_code(PROGRAM + "import atexit, threading, time\n"
                       "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
                       "atexit.register(ctrl_c)\n"
                       "interrupts.exit_process(cli_main(lambda: print('done:'))())")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "done:\nthread\n", "interrupted\n")


def test_a_program_that_ends_well_exits_with_its_status_after_its_threads_and_exit_functions(python_code):
    proc = python_code(PROGRAM + "import atexit, threading, time\n"
                       "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
                       "atexit.register(lambda: print('exit function'))\n"
                       "interrupts.exit_process(cli_main(lambda: 2)())")
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "thread\nexit function\n", "")  # the thread waited for


def test_a_program_that_ends_well_exits_though_a_thread_pool_worker_waits_for_work():
    # A ThreadPoolExecutor's idle worker is a non-daemon thread that stops only when Python's exit hooks tell it to
    # (torch.compile leaves one): joined untold, it waits for ever. The exit functions run once it has stopped.
    proc = run_python(["-c", PROGRAM + "import atexit, threading\nfrom concurrent.futures import ThreadPoolExecutor\n"
                       "ThreadPoolExecutor(1).submit(print, 'work').result()\n"
                       "atexit.register(lambda: print('threads at exit', threading.active_count()))\n"
                       "interrupts.exit_process(cli_main(lambda: print('done:'))())"], timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "work\ndone:\nthreads at exit 1\n", "")


def test_a_second_sigint_after_the_interrupts_line_adds_no_second_line(python_code):
    proc = python_code(PROGRAM + "status = cli_main(ctrl_c)()\nctrl_c()\nprint('finishing')")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "interrupted\n")


def test_a_second_sigint_while_the_first_is_on_its_way_out_keeps_its_message(python_code):
    proc = python_code(PROGRAM + "try:\n    with interrupts.handled():\n"
                       "        interrupts.describe = lambda: 'interrupted at step 3'\n        ctrl_c()\n"
                       "finally:\n    ctrl_c()  # the handled() block closed: the early handler's again\n")
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "interrupted at step 3\n")


# Each command line, sent SIGINT as one of its heavy modules starts to load.
LOADING = {"jax_impl.train": "flax", "torch_impl.train": "torch.nn", "jax_impl.predict": "jax",
           "torch_impl.predict": "torch", "torch_impl.import_model": "torch", "torch_impl.export_model": "torch",
           "common.data": "numpy", "benchmarks/bench.py": "benchmarks.convergence", "benchmarks.worker": "numpy",
           "studies.profile_step": "jax", "studies.loop_cost": "jax", "studies.rng_cost": "jax",
           "studies.gemm_choice": "common.config", "scripts/gpu_check.py": "common.config",
           "scripts/preflight.py": "common.errors", "studies.ngram_baseline": "nltk",
           "studies.ctrl_c_window": "common.config", "tools.publish": "common.config"}


@pytest.mark.parametrize("program", list(LOADING))
def test_a_command_line_interrupted_while_it_loads_says_one_line_and_exits_130(program):
    proc = run_python(["-m", "common.tests.interrupt_program", f"import:{LOADING[program]}", program])
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", f"{interrupts.STARTING}\n")

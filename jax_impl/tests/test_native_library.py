"""A native library is checked against pip's install record before it is ever loaded: a damaged, missing or foreign
library, or a damaged record, is one line naming the file and what to do, never a crash or a traceback;
``--lstm-impl auto`` runs XLA's fused recurrence instead, saying why, and a named ``kernel`` or ``onednn`` is
refused with that line."""
from __future__ import annotations

import _ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import UnsupportedError
from jax_impl.recurrences import kernel, native, onednn
from jax_impl.recurrences.choice import Run, auto, resolve
from jax_impl.tests.native_site import fake_site, install, record_path, skip

FIX = "reinstall the package (make setup, or pip install .)"
LIBRARY_BYTES = b"\x7fELF not really a library, " * 40  # what the checks read; never loaded where they fail


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    """An install with nothing native in it that the native module reads instead of the real one."""
    return fake_site(tmp_path, monkeypatch)


@pytest.fixture
def no_dlopen(monkeypatch):
    """Any dlopen fails the test: the checks that run before it must have refused."""
    def refuse(path, *args, **kwargs):
        raise AssertionError(f"{path} was dlopen'ed")
    monkeypatch.setattr(native.ctypes, "CDLL", refuse)


def test_a_truncated_library_is_reported_and_never_loaded(site, no_dlopen):
    path = install(site, "liblstm_kernel.so", LIBRARY_BYTES)
    path.write_bytes(LIBRARY_BYTES[:100])
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {path} is 100 bytes, not the {len(LIBRARY_BYTES)} its install recorded "
        f"(truncated or replaced since); {FIX}")


def test_a_folder_in_the_librarys_place_is_reported_and_never_loaded(site, no_dlopen):
    path = install(site, "liblstm_kernel.so", LIBRARY_BYTES)
    path.unlink()
    path.mkdir()
    assert native.unavailable(kernel.NAME) == f"the native lstm_kernel library {path} is not a regular file; {FIX}"


def test_an_altered_byte_of_the_same_size_is_a_checksum_mismatch(site, no_dlopen):
    path = install(site, "libonednn_lstm.so", LIBRARY_BYTES)
    altered = bytearray(LIBRARY_BYTES)
    altered[500] ^= 0x01
    path.write_bytes(bytes(altered))
    assert native.unavailable(onednn.NAME) == (
        f"the native onednn_lstm library {path} does not match the SHA-256 its install recorded (altered since it was "
        f"installed); {FIX}")


@pytest.mark.parametrize("record", [",", "sha256=abc,", ",1120", "md5=abc,1120"],
                         ids=["nothing", "no-size", "no-hash", "not-sha256"])
def test_a_record_line_without_a_size_and_sha256_is_one_line(site, no_dlopen, record):
    path = install(site, "liblstm_kernel.so", LIBRARY_BYTES, record=record)
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {path} has no size and SHA-256 in the install record {record_path(site)} to "
        f"check it against; {FIX}")


def test_an_install_record_that_cannot_be_parsed_is_one_line(site, no_dlopen):
    install(site, "liblstm_kernel.so", LIBRARY_BYTES, record="sha256=abc,many")
    reason = native.unavailable(kernel.NAME)
    assert reason.startswith(f"the native lstm_kernel library cannot be checked: the install record "
                             f"{record_path(site)} cannot be read (") and reason.endswith(FIX) and "\n" not in reason


def test_a_recorded_library_whose_file_is_gone_is_missing_not_not_built(site, no_dlopen):
    path = install(site, "liblstm_kernel.so", LIBRARY_BYTES)
    path.unlink()
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {path} is missing, though the install record {record_path(site)} lists it; "
        f"{FIX}")


def test_a_library_the_install_record_does_not_list_is_not_loaded(site, no_dlopen):
    path = site / native.FOLDER / "liblstm_kernel.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(LIBRARY_BYTES)
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {path} is not in the install record {record_path(site)}, so it cannot be "
        f"checked; {FIX}")


def test_nothing_built_says_how_to_build(site):
    assert native.unavailable(kernel.NAME) == f"the native lstm_kernel library is not available: not built; {FIX}"


def test_a_library_the_build_skipped_is_refused_with_the_builds_reason(site):
    skip(site, onednn.NAME, "torch was not found at /nowhere/torch when this package was\nbuilt")
    assert native.unavailable(onednn.NAME) == (
        "the native onednn_lstm library is not available: torch was not found at /nowhere/torch when this package was "
        "built")


def test_a_package_that_is_not_installed_says_how_to_install_it(monkeypatch):
    def nowhere():
        raise native.importlib.metadata.PackageNotFoundError(native.DIST)
    monkeypatch.setattr(native, "distribution", nowhere)
    assert native.unavailable(kernel.NAME) == (
        "the native lstm_kernel library is not available: the lstm-twins package is not installed; install it with "
        "make setup (or pip install .)")


def test_a_native_dir_that_is_not_a_folder_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "NATIVE_DIR", str(tmp_path / "nowhere"))
    assert native.unavailable(kernel.NAME) == (
        f"LSTM_TWINS_NATIVE_DIR names {tmp_path / 'nowhere'}, which is not a folder; unset it or name the folder that "
        f"holds liblstm_kernel.so")


def test_a_library_that_does_not_load_is_one_line(site):
    path = install(site, "liblstm_kernel.so", LIBRARY_BYTES)  # its record matches, but it is no ELF file
    reason = native.unavailable(kernel.NAME)
    assert reason.startswith(f"the native lstm_kernel library {path} does not load (")
    assert reason.endswith(FIX) and "\n" not in reason


def test_a_library_without_its_handlers_is_one_line(site):
    # A shared object that loads (one of Python's own) in the kernel's place, its record rewritten to match it.
    path = install(site, "liblstm_kernel.so", Path(_ctypes.__file__).read_bytes())
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {path} does not export lstm_kernel_forward and 8 more of the symbols this "
        f"code calls (it is not the lstm_kernel library this code was written for); {FIX}")
    with pytest.raises(UnsupportedError, match="does not export lstm_kernel_forward"):
        native.load(kernel.NAME)


def test_a_library_is_hashed_once_per_process(site, monkeypatch):
    path = install(site, "liblstm_kernel.so", LIBRARY_BYTES)
    hashed = []
    digest = native.hashlib.file_digest
    monkeypatch.setattr(native.hashlib, "file_digest",
                        lambda f, algorithm: hashed.append(f.name) or digest(f, algorithm))
    for _ in range(3):
        assert "does not load" in native.unavailable(kernel.NAME)  # past the checksum each time
    assert hashed == [str(path)]


def test_auto_falls_back_to_fused_saying_why_before_asking_the_library_anything(site, no_dlopen):
    path = install(site, "liblstm_kernel.so", LIBRARY_BYTES)
    path.write_bytes(LIBRARY_BYTES[:100])
    assert auto(Run(platform="cpu")) == (
        "fused", f"XLA's fused recurrence, not our kernel: the native lstm_kernel library {path} is 100 bytes, not "
                 f"the {len(LIBRARY_BYTES)} its install recorded (truncated or replaced since); {FIX}")
    assert resolve("auto", Run(platform="cpu")) == "fused"


@pytest.mark.parametrize("impl,name", [("kernel", kernel.NAME), ("onednn", onednn.NAME)])
def test_a_named_implementation_on_a_damaged_library_is_refused_in_one_line(site, no_dlopen, impl, name):
    path = install(site, f"lib{name}.so", LIBRARY_BYTES)
    path.write_bytes(LIBRARY_BYTES[:100])
    with pytest.raises(UnsupportedError) as refused:
        resolve(impl, Run(platform="cpu"))
    assert str(refused.value) == (f"--lstm-impl {impl}: the native {name} library {path} is 100 bytes, not the "
                                  f"{len(LIBRARY_BYTES)} its install recorded (truncated or replaced since); {FIX}")


needs_built_kernel = pytest.mark.skipif(native.unavailable(kernel.NAME) is not None,
                                        reason=str(native.unavailable(kernel.NAME)))


def copy_of_the_install(folder: Path) -> Path:
    """The installed libraries, copied into ``folder``."""
    for name in (kernel.NAME, onednn.NAME):
        if native.unavailable(name) is None:
            shutil.copy2(native.library_path(name), folder / f"lib{name}.so")
    return folder


@needs_built_kernel
def test_a_copy_of_the_installed_library_in_the_native_dir_passes(tmp_path, monkeypatch):
    copy_of_the_install(tmp_path)
    monkeypatch.setattr(native, "NATIVE_DIR", str(tmp_path))
    assert native.library_path(kernel.NAME) == tmp_path / "liblstm_kernel.so"
    assert native.unavailable(kernel.NAME) is None


@needs_built_kernel
def test_a_library_built_for_another_jaxlib_is_refused_in_one_line_before_xla_sees_it(monkeypatch):
    import importlib.metadata

    import jax

    built = native.validated(kernel.NAME).lstm_twins_jaxlib().decode()
    assert built == importlib.metadata.version("jaxlib")  # make setup builds against the venv's own
    version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.6.2" if name == "jaxlib" else version(name))
    monkeypatch.setattr(native, "_registered", set())
    monkeypatch.setattr(jax.ffi, "register_ffi_target", lambda *args, **kwargs: pytest.fail("a handler registered"))
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {native.library_path(kernel.NAME)} was built for jaxlib {built}, and this "
        f"is jaxlib 0.6.2 (XLA refuses a handler built against another FFI); {FIX}")
    assert auto(Run(platform="cpu"))[0] == "fused"


def test_loading_a_library_leaves_the_backend_to_start_later_with_the_flags_set_then():
    flags = "--xla_force_host_platform_device_count=3"
    program = ("import os\nfrom jax_impl.recurrences import kernel, native\n"
               "native.unavailable(kernel.NAME)\n"
               f"os.environ['XLA_FLAGS'] = {flags!r}\nimport jax\nprint(len(jax.devices()))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    assert done.stdout.strip() == "3", done.stderr


@needs_built_kernel
def test_a_probe_the_build_left_out_is_a_reason_to_skip():
    assert native.missing_probe(kernel.NAME, "lstm_kernel_nonesuch") == (
        "the native lstm_kernel library was built without its test probes (lstm_kernel_nonesuch); make setup builds "
        "them (CMake option LSTM_TWINS_TEST_PROBES=ON)")


@pytest.mark.slow  # a training process: ~15 s on a 2-core CPU
@needs_built_kernel
def test_training_with_a_truncated_kernel_runs_fused_and_records_why(tmp_path):
    folder = tmp_path / "native"
    folder.mkdir()
    library = copy_of_the_install(folder) / "liblstm_kernel.so"
    size = library.stat().st_size
    os.truncate(library, size // 3)  # as an interrupted copy leaves it: dlopen would map past its end
    command = [sys.executable, "-m", "jax_impl.train", "--max-steps", "1", "--no-progress", "--hidden-dim", "8",
               "--embed-dim", "8", "--seq-len", "20", "--batch-size", "8", "--device", "cpu",
               "--metrics-out", str(tmp_path / "metrics.jsonl")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, native.NATIVE_DIR_ENV: str(folder)})
    assert done.returncode == 0, done.stderr
    assert "done: 1 steps" in done.stdout
    run = json.loads((tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])["run"]
    assert run["lstm_impl"] == "fused"
    assert run["lstm_impl_auto"] == (
        f"XLA's fused recurrence, not our kernel: the native lstm_kernel library {library} is {size // 3} bytes, not "
        f"the {size} its install recorded (truncated or replaced since); {FIX}")

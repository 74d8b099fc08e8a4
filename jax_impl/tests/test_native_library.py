"""A native library is checked against its build record before it is ever loaded: a damaged, missing or foreign
library, or a damaged record, is one line naming the file and what to do, never a crash or a traceback;
``--lstm-impl auto`` runs XLA's fused recurrence instead, saying why, and a named ``kernel`` or ``onednn`` is
refused with that line."""
from __future__ import annotations

import _ctypes
import hashlib
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

REBUILD = "rebuild it with make setup (or python -m jax_impl.recurrences.native.build {})"
LIBRARY_BYTES = b"\x7fELF not really a library, " * 40  # what the checks read; never loaded where they fail


@pytest.fixture
def build_dir(tmp_path, monkeypatch) -> Path:
    """An empty build folder that the native module reads instead of the real one."""
    monkeypatch.setattr(native, "BUILD_DIR", tmp_path)
    return tmp_path


@pytest.fixture
def no_dlopen(monkeypatch):
    """Any dlopen fails the test: the checks that run before it must have refused."""
    def refuse(path, *args, **kwargs):
        raise AssertionError(f"{path} was dlopen'ed")
    monkeypatch.setattr(native.ctypes, "CDLL", refuse)


def record_build(folder: Path, name: str, library: bytes, **record) -> Path:
    """``lib{name}.so`` holding ``library`` and the build record a build of it writes (``record`` overrides
    fields); the library's path."""
    path = folder / f"lib{name}.so"
    path.write_bytes(library)
    written = {"name": name, "built": True, "library": str(path), "size": len(library),
               "sha256": hashlib.sha256(library).hexdigest(), "seconds": 0.1} | record
    (folder / f"{name}.json").write_text(json.dumps(written), encoding="utf-8")
    return path


def test_a_truncated_library_is_reported_and_never_loaded(build_dir, no_dlopen):
    path = record_build(build_dir, kernel.NAME, LIBRARY_BYTES)
    path.write_bytes(LIBRARY_BYTES[:100])
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {path} is 100 bytes, not the {len(LIBRARY_BYTES)} its build recorded "
        f"(truncated or replaced since); {REBUILD.format('lstm_kernel')}")


def test_a_folder_in_the_librarys_place_is_reported_and_never_loaded(build_dir, no_dlopen):
    path = record_build(build_dir, kernel.NAME, LIBRARY_BYTES)
    path.unlink()
    path.mkdir()
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {path} is not a regular file; {REBUILD.format('lstm_kernel')}")


def test_an_altered_byte_of_the_same_size_is_a_checksum_mismatch(build_dir, no_dlopen):
    path = record_build(build_dir, onednn.NAME, LIBRARY_BYTES)
    altered = bytearray(LIBRARY_BYTES)
    altered[500] ^= 0x01
    path.write_bytes(bytes(altered))
    assert native.unavailable(onednn.NAME) == (
        f"the native onednn_lstm library {path} does not match the SHA-256 its build recorded (altered since it was "
        f"built); {REBUILD.format('onednn_lstm')}")


@pytest.mark.parametrize("text,held", [("null", "null"), ("[1, 2]", "a list"), ('"built"', "a string"),
                                       ("3", "a number"), ("true", "a boolean")])
def test_a_build_record_that_is_not_an_object_is_one_line(build_dir, no_dlopen, text, held):
    record_build(build_dir, kernel.NAME, LIBRARY_BYTES)
    (build_dir / "lstm_kernel.json").write_text(text, encoding="utf-8")
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library's build record {build_dir / 'lstm_kernel.json'} holds {held}, not an object; "
        f"{REBUILD.format('lstm_kernel')}")


def test_a_build_record_that_is_not_json_is_one_line(build_dir, no_dlopen):
    record_build(build_dir, kernel.NAME, LIBRARY_BYTES)
    (build_dir / "lstm_kernel.json").write_text('{"built": tru', encoding="utf-8")
    reason = native.unavailable(kernel.NAME)
    assert reason.startswith(f"the native lstm_kernel library's build record {build_dir / 'lstm_kernel.json'} is "
                             f"not JSON (") and reason.endswith(REBUILD.format("lstm_kernel")) and "\n" not in reason


@pytest.mark.parametrize("fields,says", [
    ({"size": None, "sha256": None}, " {library} was built by an older set-up (its build record has no size and "
                                     "SHA-256 to check it against)"),
    ({"size": "200", "sha256": "ab"}, "'s build record {record} holds a malformed size or SHA-256"),
    ({"built": None}, "'s build record {record} does not say whether it was built"),
    ({"built": "yes"}, "'s build record {record} does not say whether it was built"),
], ids=["older-build", "malformed", "no-built", "built-not-boolean"])
def test_a_build_record_missing_or_malforming_its_fields_is_one_line(build_dir, no_dlopen, fields, says):
    library = record_build(build_dir, kernel.NAME, LIBRARY_BYTES)
    record = json.loads((build_dir / "lstm_kernel.json").read_text(encoding="utf-8"))
    record = {k: v for k, v in (record | fields).items() if v is not None}
    (build_dir / "lstm_kernel.json").write_text(json.dumps(record), encoding="utf-8")
    said = says.format(library=library, record=build_dir / "lstm_kernel.json")
    assert native.unavailable(kernel.NAME) == f"the native lstm_kernel library{said}; {REBUILD.format('lstm_kernel')}"


def test_a_built_library_whose_file_is_gone_is_missing_not_not_built(build_dir, no_dlopen):
    record_build(build_dir, kernel.NAME, LIBRARY_BYTES).unlink()
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {build_dir / 'liblstm_kernel.so'} is missing, though its build record says "
        f"it was built; {REBUILD.format('lstm_kernel')}")


def test_a_library_without_a_build_record_is_not_loaded(build_dir, no_dlopen):
    (build_dir / "liblstm_kernel.so").write_bytes(LIBRARY_BYTES)
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {build_dir / 'liblstm_kernel.so'} has no build record "
        f"({build_dir / 'lstm_kernel.json'} is missing), so it cannot be checked; {REBUILD.format('lstm_kernel')}")


def test_nothing_built_says_how_to_build(build_dir):
    assert native.unavailable(kernel.NAME) == (
        "the native lstm_kernel library is not available: not built; build it with make setup (or python -m "
        "jax_impl.recurrences.native.build lstm_kernel)")


def test_a_library_that_does_not_load_is_one_line(build_dir):
    path = record_build(build_dir, kernel.NAME, LIBRARY_BYTES)  # its record matches, but it is no ELF file
    reason = native.unavailable(kernel.NAME)
    assert reason.startswith(f"the native lstm_kernel library {path} does not load (")
    assert reason.endswith(REBUILD.format("lstm_kernel")) and "\n" not in reason


def test_a_library_without_its_handlers_is_one_line(build_dir):
    # A shared object that loads (one of Python's own) in the kernel's place, its record rewritten to match it.
    path = record_build(build_dir, kernel.NAME, Path(_ctypes.__file__).read_bytes())
    assert native.unavailable(kernel.NAME) == (
        f"the native lstm_kernel library {path} does not export lstm_kernel_forward and 9 more of the symbols this "
        f"code calls (it is not the lstm_kernel library this code was written for); {REBUILD.format('lstm_kernel')}")
    with pytest.raises(UnsupportedError, match="does not export lstm_kernel_forward"):
        native.load(kernel.NAME)


def test_a_library_is_hashed_once_per_process(build_dir, monkeypatch):
    record_build(build_dir, kernel.NAME, LIBRARY_BYTES)
    hashed = []
    digest = hashlib.file_digest
    monkeypatch.setattr(native.hashlib, "file_digest",
                        lambda f, algorithm: hashed.append(f.name) or digest(f, algorithm))
    for _ in range(3):
        assert "does not load" in native.unavailable(kernel.NAME)  # past the checksum each time
    assert hashed == [str(build_dir / "liblstm_kernel.so")]


def test_auto_falls_back_to_fused_saying_why_before_asking_the_library_anything(build_dir, no_dlopen):
    path = record_build(build_dir, kernel.NAME, LIBRARY_BYTES)
    path.write_bytes(LIBRARY_BYTES[:100])
    assert auto(Run(platform="cpu")) == (
        "fused", f"XLA's fused recurrence, not our kernel: the native lstm_kernel library {path} is 100 bytes, not "
                 f"the {len(LIBRARY_BYTES)} its build recorded (truncated or replaced since); "
                 f"{REBUILD.format('lstm_kernel')}")
    assert resolve("auto", Run(platform="cpu")) == "fused"


@pytest.mark.parametrize("impl,name", [("kernel", kernel.NAME), ("onednn", onednn.NAME)])
def test_a_named_implementation_on_a_damaged_library_is_refused_in_one_line(build_dir, no_dlopen, impl, name):
    path = record_build(build_dir, name, LIBRARY_BYTES)
    path.write_bytes(LIBRARY_BYTES[:100])
    with pytest.raises(UnsupportedError) as refused:
        resolve(impl, Run(platform="cpu"))
    assert str(refused.value) == (f"--lstm-impl {impl}: the native {name} library {path} is 100 bytes, not the "
                                  f"{len(LIBRARY_BYTES)} its "
                                  f"build recorded (truncated or replaced since); {REBUILD.format(name)}")


needs_built_kernel = pytest.mark.skipif(native.unavailable(kernel.NAME) is not None,
                                        reason=str(native.unavailable(kernel.NAME)))


def copy_of_the_build(folder: Path) -> Path:
    """The real build folder's libraries and records, copied into ``folder``."""
    for name in (kernel.NAME, onednn.NAME):
        for path in (native.library_path(name), native.status_path(name)):
            if path.exists():
                shutil.copy2(path, folder / path.name)
    return folder


@needs_built_kernel
def test_a_copy_of_the_built_library_with_its_record_passes(tmp_path, monkeypatch):
    copy_of_the_build(tmp_path)
    monkeypatch.setattr(native, "BUILD_DIR", tmp_path)
    assert native.unavailable(kernel.NAME) is None


@pytest.mark.slow  # a training process: ~15 s on a 2-core CPU
@needs_built_kernel
def test_training_with_a_truncated_kernel_runs_fused_and_records_why(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    library = copy_of_the_build(build) / "liblstm_kernel.so"
    size = library.stat().st_size
    os.truncate(library, size // 3)  # as an interrupted copy leaves it: dlopen would map past its end
    command = [sys.executable, "-m", "jax_impl.train", "--max-steps", "1", "--no-progress", "--hidden-dim", "8",
               "--embed-dim", "8", "--seq-len", "20", "--batch-size", "8", "--device", "cpu",
               "--metrics-out", str(tmp_path / "metrics.jsonl")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LSTM_TWINS_NATIVE_BUILD_DIR": str(build)})
    assert done.returncode == 0, done.stderr
    assert "done: 1 steps" in done.stdout
    run = json.loads((tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])["run"]
    assert run["lstm_impl"] == "fused"
    assert run["lstm_impl_auto"] == (
        f"XLA's fused recurrence, not our kernel: the native lstm_kernel library {library} is {size // 3} bytes, not "
        f"the {size} its build recorded (truncated or replaced since); {REBUILD.format('lstm_kernel')}")

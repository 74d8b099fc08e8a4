"""The native build: a failed or impossible build is a reason on record and a working set-up, never an error; a
built library has its size and SHA-256 on record, which the checks before loading it compare."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from jax_impl.recurrences import native
from jax_impl.recurrences.native import build


@pytest.fixture
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "BUILD_DIR", tmp_path)
    return tmp_path


def broken(tmp_path):
    source = tmp_path / "broken.cc"
    source.write_text("int f() { return undeclared; }\n")
    return build.Extension("broken", (str(source),), lambda: [], "a source that does not compile")


def test_a_source_that_does_not_compile_leaves_a_reason_and_no_library(build_dir):
    (build_dir / "libbroken.so").write_text("an older build")
    record = build.build(broken(build_dir))
    assert record["built"] is False
    assert record["reason"].startswith("g++ failed:") and "undeclared" in record["reason"]
    assert not (build_dir / "libbroken.so").exists()
    assert json.loads((build_dir / "broken.json").read_text())["reason"] == record["reason"]
    assert native.unavailable("broken") == f"the native broken library is not available: {record['reason']}"


def test_a_failed_build_still_exits_zero_and_says_the_row_is_na(build_dir, monkeypatch, capsys):
    monkeypatch.setattr(build, "EXTENSIONS", {"broken": broken(build_dir)})
    assert build.main([]) == 0
    assert "native broken: not built (g++ failed:" in capsys.readouterr().out


def test_a_missing_dependency_is_the_reason(build_dir):
    def absent():
        raise build.Missing("torch is not installed")
    record = build.build(build.Extension("needs", ("x.cc",), absent, "needs torch"))
    assert (record["built"], record["reason"]) == (False, "torch is not installed")


def test_an_unknown_extension_is_a_usage_error(capsys):
    assert build.main(["nonesuch"]) == 2
    assert capsys.readouterr().err.startswith("error: no native extension 'nonesuch'")


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on PATH")
def test_a_built_library_has_its_size_and_sha256_on_record_and_passes_the_checks(build_dir):
    source = build_dir / "tiny.cc"
    source.write_text('extern "C" int tiny() { return 1; }\n')
    record = build.build(build.Extension("tiny", (str(source),), lambda: [], "one function"))
    library = build_dir / "libtiny.so"
    assert record["built"] is True
    assert record["size"] == library.stat().st_size
    assert record["sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()
    assert json.loads((build_dir / "tiny.json").read_text())["sha256"] == record["sha256"]
    assert native.unavailable("tiny") is None


@pytest.mark.slow  # a build of its own, about 15 s
def test_the_kernel_builds_and_runs_where_torch_cannot_be_imported(tmp_path):
    # A process in which `import torch` fails, as in a JAX-only install: the kernel builds from the packages the
    # project installs (scipy-openblas32) and glibc, then computes one layer through XLA.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from jax_impl.recurrences.native import build\n"
        "record = build.build(build.EXTENSIONS['lstm_kernel'])\n"
        "assert record['built'], record.get('reason')\n"
        "import jax.numpy as jnp\n"
        "from jax_impl.recurrences import kernel\n"
        "x, w, h = jnp.ones((3, 2, 8)), jnp.full((8, 2), 0.1), jnp.zeros((2, 2))\n"
        "ys, (h_t, c_t) = kernel.gates_layer(x, w, h, h)\n"
        "print(kernel.describe(2)['kernel_isa'], round(float(ys[-1, 0, 0]), 6), 'torch' in sys.modules and "
        "sys.modules['torch'] is not None)\n")
    env = {**os.environ, "LSTM_TWINS_NATIVE_BUILD_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    isa, y, torch_loaded = out.stdout.split()
    assert isa in ("portable", "avx2", "avx512") and torch_loaded == "False"
    assert float(y) == pytest.approx(reference_lstm_output(), abs=1e-6)


def reference_lstm_output() -> float:
    """h of unit 0 after 3 steps of a 2-unit LSTM whose input gates are 1 each step and whose W_hh is 0.1 everywhere,
    in numpy float64."""
    import numpy as np
    sigmoid = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    h = c = np.zeros(2)
    for _ in range(3):
        z = 1.0 + 0.1 * h.sum()
        i = f = o = sigmoid(z)
        c = f * c + i * np.tanh(z)
        h = o * np.tanh(c)
    return float(h[0])

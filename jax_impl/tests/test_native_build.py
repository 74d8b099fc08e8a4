"""The native build (CMakeLists.txt, which pip install runs through scikit-build-core): without torch it still
installs the kernel, and in onednn_lstm's place the reason; the test probes only in a test build; the kernel needs
nothing of torch to run."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jax_impl.recurrences import kernel, native

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # make setup installs cmake and ninja here
CMAKE = shutil.which("cmake") or shutil.which("cmake", path=str(VENV_BIN))
NINJA = shutil.which("ninja") or shutil.which("ninja", path=str(VENV_BIN))


@pytest.mark.slow  # a configure and a build of the kernel: about a minute on a 2-core CPU
@pytest.mark.skipif(CMAKE is None or shutil.which("c++") is None, reason="no cmake or no C++ compiler on PATH")
def test_without_torch_the_kernel_is_installed_and_onednn_lstm_says_why_not(tmp_path):
    build, prefix, nowhere = tmp_path / "build", tmp_path / "site", tmp_path / "no-torch"
    generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={NINJA}"] if NINJA else []
    for command in ([CMAKE, "-S", str(ROOT), "-B", str(build), *generator, f"-DPython_EXECUTABLE={sys.executable}",
                     "-DCMAKE_BUILD_TYPE=Release", f"-DLSTM_TWINS_TORCH_DIR={nowhere}"],
                    [CMAKE, "--build", str(build)], [CMAKE, "--install", str(build), "--prefix", str(prefix)]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    installed = prefix / native.FOLDER
    assert sorted(p.name for p in installed.iterdir()) == ["liblstm_kernel.so", "onednn_lstm.skipped"]
    assert (installed / "onednn_lstm.skipped").read_text(encoding="utf-8") == (
        f"torch was not found at {nowhere} when this package was built (ATen's oneDNN LSTM comes from it); install "
        f"torch, then reinstall this package\n")
    library = (installed / "liblstm_kernel.so").read_bytes()
    assert b"lstm_kernel_forward" in library and b"lstm_kernel_activation" not in library  # no probes by default


@pytest.mark.skipif(native.unavailable(kernel.NAME) is not None, reason=str(native.unavailable(kernel.NAME)))
def test_the_installed_kernel_runs_where_torch_cannot_be_imported():
    # A process in which `import torch` fails, as in a JAX-only install: the kernel computes one layer through XLA.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import jax.numpy as jnp\n"
        "from jax_impl.recurrences import kernel\n"
        "x, w, h = jnp.ones((3, 2, 8)), jnp.full((8, 2), 0.1), jnp.zeros((2, 2))\n"
        "ys, (h_t, c_t) = kernel.gates_layer(x, w, h, h)\n"
        "print(kernel.describe(2)['kernel_isa'], round(float(ys[-1, 0, 0]), 6))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    isa, y = out.stdout.split()
    assert isa in kernel.ISAS
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

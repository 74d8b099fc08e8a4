"""JAX's x64 mode is switched on where a program starts, never inside a helper: float64 is refused in one line where
it is off, and computed where a test (the ``x64`` fixture) or the trainer's ``main`` switched it on."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from common.errors import ConfigError
from jax_impl.numerics import compute_dtype
from jax_impl.tests.conftest import tiny_config
from jax_impl.train import twin_maker

X64_OFF = r"^--dtype float64 needs JAX's x64 mode, switched on where the program starts, before any JAX array: "


@pytest.fixture
def x64():
    """JAX's x64 mode for the test's duration only."""
    with jax.enable_x64(True):
        yield


def test_float64_is_refused_in_one_line_where_x64_is_off():
    with jax.enable_x64(False):
        with pytest.raises(ConfigError, match=X64_OFF):
            compute_dtype("float64")
        assert not jax.config.jax_enable_x64  # refused, not switched on


def test_float64_is_computed_in_float64_where_x64_is_on(x64):
    assert jnp.ones(3, compute_dtype("float64")).dtype == jnp.float64


def test_the_trainers_set_up_refuses_float64_without_x64_before_the_data_is_read(tmp_path):
    cfg = tiny_config(tmp_path / "no-pos.txt", tmp_path / "no-neg.txt", dtype="float64")  # never read
    with jax.enable_x64(False), pytest.raises(ConfigError, match=X64_OFF):
        with twin_maker(cfg):
            pass


@pytest.mark.slow
def test_the_trainer_switches_x64_on_where_it_starts_for_float64(corpus, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    proc = subprocess.run([sys.executable, "-m", "jax_impl.train", "--pos", str(corpus[0]), "--neg", str(corpus[1]),
                           "--dtype", "float64", "--max-steps", "1", "--embed-dim", "8", "--hidden-dim", "16",
                           "--seq-len", "12", "--batch-size", "4", "--no-progress", "--metrics-out", str(metrics)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(metrics.read_text().splitlines()[0])["run"]["dtype"] == "float64"

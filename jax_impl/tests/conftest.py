"""Shared tiny fixtures: a word corpus built in code, a tiny config, and compiled steps reused by every test
(jit compilation dominates the run time on a small CPU, so each distinct step is compiled once per session)."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np
import pytest

# Processes sharing one GPU (this one, the CLIs it starts) must not each take 75% of its memory at start.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from common.config import Config
from common.data import Dataset, prepare_data
from common.params import init_params
from jax_impl.classifier import make_eval_step, make_loss_fn, model_from_config
from jax_impl.model import SentimentRNN
from jax_impl.step import make_train_step

POSITIVE = "good great happy love excellent fine nice wonderful best superb".split()
NEGATIVE = "bad awful sad hate terrible poor ugly worst boring dull".split()
NEUTRAL = "the a movie book it was and very is this".split()


def write_corpus(folder: Path, per_class: int = 65, seed: int = 0, neutral: Sequence[str] = NEUTRAL,
                 label_in_tag: bool = False) -> tuple[Path, Path]:
    """pos.txt and neg.txt: ``per_class`` distinct short texts each (3 to 16 words, some longer than
    seq_len 12 so truncation is exercised), each led by a unique tag (``7``, or ``pos7`` with ``label_in_tag``)
    and drawn from its class's sentiment words and ``neutral``. Also the parity suite's small corpus."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, words in (("pos", POSITIVE), ("neg", NEGATIVE)):
        tag = name if label_in_tag else ""
        texts = [f"{tag}{i} " + " ".join(rng.choice(words + list(neutral)) for _ in range(rng.randint(3, 16)))
                 for i in range(per_class)]
        path = folder / f"{name}.txt"
        path.write_text("\n".join(texts) + "\n", encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def tiny_config(pos: Path, neg: Path, **changes: Any) -> Config:
    """Embed 8, hidden 16, 2 layers, seq_len 12, batch 4: compiles in seconds."""
    base = Config(pos=str(pos), neg=str(neg), embed_dim=8, hidden_dim=16, layers=2, seq_len=12, batch_size=4,
                  epochs=1, log_every=0, progress=False, device="cpu")
    return base.replace(**changes)


@dataclass(frozen=True)
class Tiny:
    cfg: Config
    data: Dataset
    model: SentimentRNN
    neutral: dict[str, np.ndarray]
    train_step: Callable
    eval_step: Callable
    device: jax.Device


@pytest.fixture(scope="session", autouse=True)
def cpu_by_default():
    """JAX's default device is the CPU for these tests on any host; a test meant for a GPU places its arrays there
    (and is marked ``gpu``)."""
    before = jax.config.jax_default_device
    jax.config.update("jax_default_device", jax.devices("cpu")[0])
    yield
    jax.config.update("jax_default_device", before)


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """A persistent XLA compilation cache for this test session, shared with the subprocesses the tests
    start (JAX_COMPILATION_CACHE_DIR): a CLI run of a configuration compiled here loads the executable
    instead of compiling it again. Speed only: a cached executable is the same code."""
    folder = str(tmp_path_factory.mktemp("xla-cache"))
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs,
              os.environ.get("JAX_COMPILATION_CACHE_DIR"))
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the loop in train() recompiles the
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder                     # tests' steps: let it find them
    yield folder
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
    if before[2] is None:
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    else:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = before[2]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def tiny(corpus) -> Tiny:
    cfg = tiny_config(*corpus)
    data = prepare_data(cfg)
    model = model_from_config(cfg, len(data.vocab))
    neutral = init_params(len(data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)
    return Tiny(cfg, data, model, neutral, make_train_step(make_loss_fn(model, cfg), cfg), make_eval_step(model, cfg),
                jax.devices("cpu")[0])

"""The language model from the command line, in both twins: training prints perplexity, each twin reads the other's
checkpoint and continues a prompt with the same words, a run killed by SIGKILL resumes to bitwise the same end, the
learning rate is annealed as the example anneals it, and the classic bug is reproduced on purpose."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.checkpoint import save_checkpoint
from common.config import Config
from common.metrics import read_metrics
from common.params import init_params
from common.runstate import checkpoint_dirs
from common.text import Vocab
from common.tests.lm_corpus import LM_TINY, lm_args, write_lm_corpus
from common.workloads import load_run
from parity_tests.twins import make_twin

pytestmark = pytest.mark.slow  # seconds each: whole trainer processes
ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("torch", "jax")


def python(*args: str, cwd: Path = ROOT, wait: bool = True):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", *args]
    if wait:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_lm_corpus(tmp_path_factory.mktemp("lm") / "corpus.txt")


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(framework, cell) → the --save-dir of a 2-epoch run (GRU runs tied)."""
    out = {}
    for framework in FRAMEWORKS:
        for cell in ("lstm", "gru"):
            folder = tmp_path_factory.mktemp(f"{framework}-{cell}")
            done = python(f"{framework}_impl.train", *lm_args(corpus, cell=cell, tied=cell == "gru"),
                          "--save-dir", str(folder / "best"), "--metrics-out", str(folder / "metrics.jsonl"))
            assert done.returncode == 0, done.stderr[-2000:]
            (folder / "stdout.txt").write_text(done.stdout, encoding="utf-8")
            out[framework, cell] = folder
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("cell", ("lstm", "gru"))
def test_the_lm_trains_from_the_command_line_and_reports_perplexity(trained, framework, cell):
    stdout = (trained[framework, cell] / "stdout.txt").read_text(encoding="utf-8")
    assert stdout.startswith("data: 521 words read in 120 lines")
    done = stdout.strip().splitlines()[-1]
    assert done.startswith("done: 52 steps (0 skipped)") and " ppl " in done
    records = read_metrics(trained[framework, cell] / "metrics.jsonl")
    run = records[0]["run"]
    jax_impl = {"lstm": "fused", "gru": "scan"}[cell]  # --lstm-impl auto's choice for the language model
    assert run["lstm_impl"] == (jax_impl if framework == "jax" else f"nn.{cell.upper()}")
    test = [r for r in records if r.get("split") == "test"][-1]
    assert test["perplexity"] == pytest.approx(np.exp(test["loss"]), rel=1e-12)
    assert test["perplexity"] < 19  # better than a uniform guess over the 19 words


@pytest.mark.parametrize("cell", ("lstm", "gru"))
@pytest.mark.parametrize("writer", FRAMEWORKS)
def test_each_twin_reads_the_others_lm_checkpoint_and_continues_a_prompt_identically(trained, writer, cell):
    checkpoint = trained[writer, cell] / "best"
    outputs = {}
    for reader in FRAMEWORKS:
        prompts = ("猫 喜欢", "中国 人民 学生")
        done = python(f"{reader}_impl.predict", str(checkpoint), *prompts, "--words", "12", "--json")
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[reader] = json.loads(done.stdout)
    assert outputs["torch"] == outputs["jax"]
    first = outputs["torch"][0]
    assert first["prompt"] == "猫 喜欢" and len(first["continuation"]) == 12 and first["unknown_words"] == 0
    assert outputs["torch"][1]["unknown_words"] == 0


def test_predict_prints_the_prompt_followed_by_its_continuation(trained):
    done = python("torch_impl.predict", str(trained["torch", "lstm"] / "best"), "猫 火星", "--words", "3")
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:2] == ["猫", "火星"] and len(words) == 5  # an unknown prompt word reads as <unk>


def test_words_with_a_classifier_checkpoint_is_refused_in_one_line(tmp_path):
    cfg = Config(embed_dim=4, hidden_dim=4, layers=1)
    vocab = Vocab(("<pad>", "<unk>", "good", "bad"))
    save_checkpoint(tmp_path / "classifier", init_params(len(vocab), 4, 4, 1, seed=0), cfg, vocab, "word")
    done = python("torch_impl.predict", str(tmp_path / "classifier"), "good", "--words", "3")
    assert done.returncode == 2
    assert done.stderr.strip().endswith("--words continues a language model's prompts; "
                                        f"{tmp_path / 'classifier'} is a classifier's")


@pytest.mark.parametrize("framework, cell", [("torch", "lstm"), ("jax", "gru")])
def test_a_killed_lm_run_resumes_to_bitwise_the_same_end(corpus, tmp_path, framework, cell):
    args = [*lm_args(corpus, cell=cell, epochs=3), "--checkpoint-every", "4"]  # 78 steps; the kill at 11, after 8's
    full, cut = tmp_path / "full", tmp_path / "cut"
    for folder in (full, cut):
        folder.mkdir()
    runs = {folder: [*args, "--metrics-out", str(folder / "m.jsonl"), "--save-dir", str(folder / "best")]
            for folder in (full, cut)}
    reference = python(f"{framework}_impl.train", *runs[full], cwd=full, wait=False)
    killed = python("common.tests.kill_at_step", f"{framework}_impl.train", "after", "11", *runs[cut], cwd=cut,
                    wait=False)
    assert killed.wait(timeout=300) == -signal.SIGKILL, killed.stderr.read()[-2000:]
    assert reference.wait(timeout=300) == 0, reference.stderr.read()[-2000:]
    (run_dir,) = (cut / "runs").iterdir()
    assert checkpoint_dirs(run_dir)[-1][0] == 8
    resumed = python(f"{framework}_impl.train", *runs[cut], "--resume", str(run_dir), cwd=cut)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stderr and "step_00000008" in resumed.stderr

    assert read_metrics(cut / "m.jsonl", timing=False) == read_metrics(full / "m.jsonl", timing=False)
    assert (cut / "best" / "model.safetensors").read_bytes() == (full / "best" / "model.safetensors").read_bytes()
    cfg = Config(**{**LM_TINY, "data": str(corpus), "cell": cell, "epochs": 3})
    cfg, data, neutral = load_run(cfg)
    twin = make_twin(framework, cfg, len(data.vocab))
    ends = []
    for folder in (full, cut):
        (root,) = (folder / "runs").iterdir()
        step, path = checkpoint_dirs(root)[-1]
        progress, (state, carry) = twin.restore_state(path, twin.init_state(neutral), twin.init_carry())
        ends.append((step, twin.export_params(state), [np.asarray(c) for c in _leaves(carry)], progress.lr))
    (step_a, params_a, carry_a, lr_a), (step_b, params_b, carry_b, lr_b) = ends
    assert step_a == step_b == 78 and lr_a == lr_b
    assert all(np.array_equal(params_a[k], params_b[k]) for k in params_a)
    assert all(np.array_equal(a, b) for a, b in zip(carry_a, carry_b, strict=True))


def _leaves(carry) -> list:
    if hasattr(carry, "shape"):
        return [carry.detach().numpy() if hasattr(carry, "detach") else carry]
    return [leaf for part in carry for leaf in _leaves(part)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_learning_rate_is_divided_by_lr_decay_after_each_epoch_that_does_not_improve(corpus, tmp_path,
                                                                                         framework):
    done = python(f"{framework}_impl.train", *lm_args(corpus, epochs=6, lr=60.0), "--metrics-out",
                  str(tmp_path / "m.jsonl"))
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_metrics(tmp_path / "m.jsonl")
    epoch_ends = [r for r in records if r.get("split") == "val"]  # --log-every 0: one per epoch
    changes = [r["lr"] for r in records if "lr" in r and "split" not in r]
    lr, best, expected = 60.0, None, []
    for val in epoch_ends:
        if best is None or val["loss"] < best:
            best = val["loss"]
        else:
            lr /= 4
            expected.append(lr)
    assert changes == expected and changes  # at lr 60 some epoch does not improve


@pytest.mark.parametrize("cell", ("lstm", "gru"))
def test_no_detach_reproduces_the_classic_error_in_the_lm(corpus, cell):
    done = python("torch_impl.train", *lm_args(corpus, cell=cell), "--no-detach")
    assert done.returncode == 2
    assert "Trying to backward through the graph a second time" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

"""The command lines: the seed's error reproduced on purpose, predict, user errors, and the real corpus."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common import loop
from common.checkpoint import load_checkpoint, save_checkpoint
from common.config import Config
from common.errors import ConfigError
from common.metrics import read_metrics, training_steps
from common.runstate import checkpoint_dirs, read_progress
from common.tests.lm_corpus import lm_args, write_lm_corpus
from torch_impl import predict as torch_predict
from torch_impl import train as torch_train
from torch_impl.classifier import model_from_config
from torch_impl.model import export_params
from torch_impl.tests.conftest import ROOT, run_cli, tiny_args


def test_no_detach_stops_at_the_second_batch_in_one_line(tiny_cfg):
    proc = run_cli("torch_impl.train", *tiny_args(tiny_cfg), "--no-detach")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Trying to backward through the graph a second time" in lines[0]
    assert lines[0].startswith("error: step 2:")
    assert "seed's bug" in lines[0] and "--no-detach" in lines[0]


def test_predict_scores_texts_from_a_saved_checkpoint(tmp_path, tiny_cfg, tiny_data):
    model = model_from_config(tiny_cfg.replace(seed=5), len(tiny_data.vocab))
    save_checkpoint(tmp_path / "ckpt", export_params(model), tiny_cfg, tiny_data.vocab, tiny_data.tokenizer)
    texts = ["a good great movie", "awful and boring", ""]
    proc = run_cli("torch_impl.predict", str(tmp_path / "ckpt"), *texts, "--json", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    ckpt = load_checkpoint(tmp_path / "ckpt")
    expected = torch_predict.predict_probs(ckpt, texts, torch_train.resolve_device("cpu"))
    assert [r["text"] for r in rows] == texts
    # The same code on the same CPU: equal up to JSON's float printing, which is exact for float64.
    np.testing.assert_allclose([r["prob"] for r in rows], expected, rtol=0, atol=1e-7)
    assert all(r["label"] == ("positive" if r["prob"] > 0.5 else "negative") for r in rows)


def test_predict_prints_one_line_per_text(tmp_path, tiny_cfg, tiny_data, capsys):
    model = model_from_config(tiny_cfg, len(tiny_data.vocab))
    save_checkpoint(tmp_path / "ckpt", export_params(model), tiny_cfg, tiny_data.vocab, tiny_data.tokenizer)
    assert torch_predict.main([str(tmp_path / "ckpt"), "good", "bad movie"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[2] for line in lines] == ["good", "bad movie"]


def test_predict_on_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    assert torch_predict.main([str(tmp_path / "nothing"), "text"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_unwritable_save_dir_is_one_line_before_training(tmp_path, tiny_cfg, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert torch_train.main([*tiny_args(tiny_cfg), "--save-dir", str(blocker / "ckpt")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --save-dir") and captured.err.count("\n") == 1
    assert "done:" not in captured.out


@pytest.mark.parametrize("flags,message", [
    (["--lstm-impl", "fused"], "--lstm-impl fused is JAX-only: PyTorch runs nn.LSTM (leave --lstm-impl auto)"),
    (["--flax-api", "nnx"], "--flax-api nnx is JAX-only: PyTorch runs nn.LSTM (leave --flax-api linen)"),
], ids=["lstm-impl", "flax-api"])
def test_a_jax_only_flag_is_one_line_before_training(tiny_cfg, capsys, flags, message):
    assert torch_train.main([*tiny_args(tiny_cfg), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {message}\n" and "done:" not in captured.out


def test_the_tpu_is_a_config_error(tiny_cfg):
    with pytest.raises(ConfigError, match="tpu is not supported"):
        torch_train.train(tiny_cfg.replace(device="tpu"))


def test_device_auto_is_cuda_when_present_else_cpu():
    import torch
    assert torch_train.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_init_from_starts_from_the_checkpoint_weights_and_vocabulary(tmp_path, tiny_cfg, tiny_data):
    model = model_from_config(tiny_cfg.replace(seed=7), len(tiny_data.vocab))
    save_checkpoint(tmp_path / "ckpt", export_params(model), tiny_cfg, tiny_data.vocab, tiny_data.tokenizer)
    cfg, data, started = loop.load_run(tiny_cfg.replace(init_from=str(tmp_path / "ckpt"), device="cpu"))
    assert data.vocab == tiny_data.vocab
    for name, value in export_params(model).items():
        assert started[name].tobytes() == value.tobytes(), name


@pytest.mark.slow
def test_short_run_on_the_real_corpus(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = torch_train.train(Config(
        embed_dim=8, hidden_dim=8, seq_len=20, batch_size=32, max_steps=3, log_every=0, progress=False,
        device="cpu", metrics_out=str(metrics)))
    assert result["steps"] == 3 and result["skipped_steps"] == 0
    # Three steps from PyTorch-style initial weights: the loss is still near log 2 = 0.693.
    assert 0.6 < result["val_loss"] < 0.8 and 0.6 < result["test_loss"] < 0.8
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if "epoch" in r] == [1, 2, 3]
    assert [r["split"] for r in records if "split" in r] == ["val", "test"]
    # The first record says which float rules were in force: JAX's, by default.
    assert records[0]["run"]["flush_denormal"] is True and records[0]["run"]["allow_tf32"] is False


@pytest.mark.slow
def test_a_torch_compile_run_exits_after_done(tmp_path):
    # An empty compile cache: Inductor then compiles in a pool of threads that stays alive, idle, after the run.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    args = lm_args(write_lm_corpus(tmp_path / "lm.txt"), max_steps=2, torch_compile=True)
    proc = subprocess.run([sys.executable, "-m", "torch_impl.train", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("done: 2 steps")


def test_unwritable_checkpoint_dir_is_one_line_before_training(tmp_path, tiny_cfg, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file where the run directories would go")
    assert torch_train.main([*tiny_args(tiny_cfg), "--checkpoint-every", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "error: --checkpoint-dir (default) runs: exists and is not a directory\n"
    assert "done:" not in captured.out


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing saved lost


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured.err
    assert "done:" not in captured.out
    return captured.err


@pytest.mark.parametrize("flags, message", [
    (["--hidden-dim", "99999999999"], "--hidden-dim 99999999999, --layers 2, --seq-len 12 and --batch-size 4, with a "
                                      "vocabulary of"),
    (["--embed-dim", "99999999999"], "--embed-dim 99999999999, --hidden-dim 16"),
    (["--seq-len", "99999999999"], "--seq-len 99999999999 and --batch-size 4"),
])
def test_a_size_beyond_the_machine_is_one_line(tiny_cfg, capsys, flags, message):
    assert torch_train.main([*tiny_args(tiny_cfg), *flags]) == 2
    err = _one_line_error(capsys)
    assert message in err and "this process can have" in err


def test_data_with_pos_and_neg_is_one_line(tmp_path, tiny_cfg, capsys):
    assert torch_train.main([*tiny_args(tiny_cfg), "--data", str(tmp_path / "missing.csv")]) == 2
    assert "name two corpora: give one source" in _one_line_error(capsys)


def test_one_class_of_labels_is_one_line(tmp_path, tiny_cfg, capsys):
    texts = Path(tiny_cfg.pos).read_text(encoding="utf-8").splitlines()
    (tmp_path / "positive.csv").write_text("text,label\n" + "".join(f"{t},1\n" for t in texts), encoding="utf-8")
    assert torch_train.main(["--data", str(tmp_path / "positive.csv"), "--batch-size", "4", "--no-progress"]) == 2
    assert "are all positive: a classifier needs both classes" in _one_line_error(capsys)


def test_the_runs_first_line_counts_the_texts_of_each_class(tiny_cfg, capsys):
    assert torch_train.main([*tiny_args(tiny_cfg), "--max-steps", "1"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("data: 120 texts read (60 positive, 60 negative), 120 kept after cleaning: train 96, val 12, "
                     "test 12")


def test_a_save_dir_of_another_run_is_refused_and_kept_unless_overwrite(tmp_path, tiny_cfg, tiny_data, capsys):
    other = tiny_cfg.replace(hidden_dim=8)
    model = model_from_config(other, len(tiny_data.vocab))
    save_checkpoint(tmp_path / "best", export_params(model), other, tiny_data.vocab, tiny_data.tokenizer)
    before = (tmp_path / "best" / "model.safetensors").read_bytes()
    assert torch_train.main([*tiny_args(tiny_cfg), "--save-dir", str(tmp_path / "best")]) == 2
    assert "holds a checkpoint with hidden_dim=8, not this run's" in _one_line_error(capsys)
    assert (tmp_path / "best" / "model.safetensors").read_bytes() == before
    assert torch_train.main([*tiny_args(tiny_cfg), "--save-dir", str(tmp_path / "best"), "--max-steps", "1",
                             "--overwrite"]) == 0
    assert load_checkpoint(tmp_path / "best").config.hidden_dim == tiny_cfg.hidden_dim


def test_an_existing_metrics_file_is_refused_and_kept_unless_overwrite(tmp_path, tiny_cfg, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0, "run": "another"}\n', encoding="utf-8")
    assert torch_train.main([*tiny_args(tiny_cfg), "--metrics-out", str(metrics)]) == 2
    assert _one_line_error(capsys) == (f"error: --metrics-out {metrics}: exists; pass --overwrite to replace it, or "
                                       f"--resume the run that wrote it\n")
    assert metrics.read_text(encoding="utf-8") == '{"step": 0, "run": "another"}\n'
    assert torch_train.main([*tiny_args(tiny_cfg), "--metrics-out", str(metrics), "--max-steps", "1",
                             "--overwrite"]) == 0
    assert json.loads(metrics.read_text(encoding="utf-8").splitlines()[0])["run"]["framework"] == "torch"


def test_a_checkpoint_dir_of_another_run_is_refused_and_kept_unless_overwrite(tmp_path, tiny_cfg, capsys):
    args = [*tiny_args(tiny_cfg), "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "run")]
    assert torch_train.main([*args, "--max-steps", "4"]) == 0
    capsys.readouterr()
    assert torch_train.main([*args, "--max-steps", "2", "--lr", "0.01"]) == 2
    assert _one_line_error(capsys) == (f"error: training checkpoints: {tmp_path / 'run'} holds another run's (step_*); "
                                       f"continue it with --resume {tmp_path / 'run'}, or pass --overwrite to replace "
                                       f"them\n")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step_00000002", "step_00000004"]
    assert torch_train.main([*args, "--max-steps", "2", "--lr", "0.01", "--overwrite"]) == 0
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step_00000002"]


def test_a_resume_refuses_another_runs_metrics_log_and_goes_on_with_its_own(tmp_path, tiny_cfg, capsys):
    args = [*tiny_args(tiny_cfg.replace(epochs=1)), "--checkpoint-every", "4"]
    for run, steps in (("a", "0"), ("b", "8")):  # two runs, the second stopped at step 8
        assert torch_train.main([*args, "--checkpoint-dir", str(tmp_path / run), "--metrics-out",
                                 str(tmp_path / f"{run}.jsonl"), "--max-steps", steps]) == 0
    others = (tmp_path / "a.jsonl").read_bytes()
    capsys.readouterr()
    resume_b = [*args, "--resume", str(tmp_path / "b"), "--metrics-out"]
    assert torch_train.main([*resume_b, str(tmp_path / "a.jsonl")]) == 2
    assert _one_line_error(capsys).startswith(f"error: --metrics-out {tmp_path / 'a.jsonl'}: not the metrics log of "
                                              f"the run in --resume {tmp_path / 'b'} ")
    assert (tmp_path / "a.jsonl").read_bytes() == others
    assert torch_train.main([*resume_b, str(tmp_path / "b.jsonl")]) == 0
    records = read_metrics(tmp_path / "b.jsonl")
    assert [r["step"] for r in training_steps(records)] == list(range(1, 25))
    assert records[0]["run_id"] == read_progress(checkpoint_dirs(tmp_path / "b")[-1][1]).run_id


def test_a_resume_with_overwrite_starts_another_runs_metrics_log_afresh(tmp_path, tiny_cfg):
    args = [*tiny_args(tiny_cfg.replace(epochs=1)), "--checkpoint-every", "4"]
    for run, steps in (("a", "0"), ("b", "8")):
        assert torch_train.main([*args, "--checkpoint-dir", str(tmp_path / run), "--metrics-out",
                                 str(tmp_path / f"{run}.jsonl"), "--max-steps", steps]) == 0
    assert torch_train.main([*args, "--resume", str(tmp_path / "b"), "--metrics-out", str(tmp_path / "a.jsonl"),
                             "--overwrite"]) == 0
    records = read_metrics(tmp_path / "a.jsonl")
    assert records[0]["run_id"] == read_metrics(tmp_path / "b.jsonl")[0]["run_id"]
    assert [r["step"] for r in training_steps(records)] == list(range(9, 25))  # the resumed steps alone


def test_predict_refuses_a_checkpoint_with_a_flipped_weight_byte(tmp_path, tiny_cfg, tiny_data, capsys):
    model = model_from_config(tiny_cfg, len(tiny_data.vocab))
    weights = save_checkpoint(tmp_path / "ckpt", export_params(model), tiny_cfg, tiny_data.vocab,
                              tiny_data.tokenizer) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8 + int.from_bytes(data[:8], "little")] ^= 0x01  # the data region's first byte: a valid file, one value off
    weights.write_bytes(bytes(data))
    assert torch_predict.main([str(tmp_path / "ckpt"), "good"]) == 2
    assert _one_line_error(capsys) == f"error: {weights}: contents differ from when it was written (damaged)\n"

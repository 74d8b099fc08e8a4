"""The command lines: predict on a saved checkpoint, one-line errors, and a short run on the real corpus."""
import json
import subprocess
import sys

import numpy as np
import pytest

from common.checkpoint import load_checkpoint, save_checkpoint
from jax_impl.recurrences.choice import Run, auto
from jax_impl.predict import predict_probs
from jax_impl.train import main


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("predict") / "ckpt"
    save_checkpoint(path, tiny.neutral, tiny.cfg, tiny.data.vocab, tiny.data.tokenizer)
    return path


def test_predict_cli_prints_json_probabilities_from_a_checkpoint(checkpoint):
    texts = ["a good great movie", "bad awful boring book", "unseenword"]
    out = subprocess.run([sys.executable, "-m", "jax_impl.predict", str(checkpoint), *texts, "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["text"] for r in rows] == texts
    expected = predict_probs(load_checkpoint(checkpoint), texts)
    # The same computation in another process: equal to float32 rounding.
    np.testing.assert_allclose([r["prob"] for r in rows], expected, rtol=1e-6)
    assert all(r["label"] == ("positive" if r["prob"] > 0.5 else "negative") for r in rows)


def test_predict_probabilities_are_the_models_sigmoid_with_a_zero_carry(tiny, checkpoint):
    import jax
    from jax_impl.convert import to_flax
    from common.data import encode_texts
    texts = ["good movie", "the worst"]
    tokens, _ = encode_texts(texts, tiny.data.vocab, tiny.data.tokenizer, tiny.cfg.seq_len)
    logits, _ = jax.jit(tiny.model.apply)({"params": to_flax(tiny.neutral)}, tokens, tiny.model.zero_carry(2))
    np.testing.assert_allclose(predict_probs(load_checkpoint(checkpoint), texts),
                               1 / (1 + np.exp(-np.asarray(logits, np.float64))), rtol=1e-6)


def test_a_missing_device_is_one_line_and_exit_status_2(capsys):
    assert main(["--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device tpu: JAX sees no tpu device") and err.count("\n") == 1


def test_more_devices_than_jax_sees_is_one_line_and_exit_status_2(corpus, capsys):
    assert main(["--pos", str(corpus[0]), "--neg", str(corpus[1]), "--device", "cpu", "--devices", "64",
                 "--batch-size", "64", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --devices 64: JAX sees only 1 cpu device(s)") and err.count("\n") == 1


def test_a_bad_checkpoint_for_predict_is_one_line(tmp_path, capsys):
    from jax_impl.predict import main as predict_main
    assert predict_main([str(tmp_path / "nowhere"), "text"]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err


@pytest.mark.slow
def test_three_steps_on_the_real_corpus(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    status = main(["--max-steps", "3", "--embed-dim", "8", "--hidden-dim", "16", "--seq-len", "16",
                   "--log-every", "2", "--no-progress", "--metrics-out", str(metrics),
                   "--save-dir", str(tmp_path / "best")])
    assert status == 0
    out = capsys.readouterr().out
    assert "Epoch: 1/4... Step: 2... Loss:" in out and "done: 3 steps (0 skipped)" in out
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if "epoch" in r] == [1, 2, 3]
    assert [(r["step"], r["split"]) for r in records if "split" in r] == [(2, "val"), (3, "val"), (3, "test")]
    # A fresh model on a balanced corpus: the loss is near log 2 (within 0.1).
    assert all(abs(r["loss"] - np.log(2)) < 0.1 for r in records[1:])
    # The first record says what ran: the resolved LSTM implementation among it.
    chosen, why = auto(Run(platform="cpu"))  # our kernel where built, on a CPU with AVX2 or AVX-512; else fused
    assert records[0]["step"] == 0 and records[0]["run"]["lstm_impl"] == chosen
    assert records[0]["run"]["lstm_impl_auto"] == why
    assert records[0]["run"]["framework"] == "jax" and records[0]["run"]["dtype"] == "float32"
    assert records[0]["run"]["flush_denormal"] is True and records[0]["run"]["allow_tf32"] is False
    assert load_checkpoint(tmp_path / "best").tokenizer == "char"


def test_a_size_beyond_the_machine_is_one_line_and_exit_status_2(corpus, capsys):
    assert main(["--pos", str(corpus[0]), "--neg", str(corpus[1]), "--hidden-dim", "99999999999", "--device", "cpu",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --embed-dim 400, --hidden-dim 99999999999, --layers 2") and err.count("\n") == 1
    assert "of memory (parameters with their gradients and Adam's state" in err and "this process can have" in err


@pytest.mark.parametrize("flags,message", [
    (["--lstm-impl", "fused"], "--lstm-impl fused is linen's: under --flax-api nnx the LSTM is nnx.RNN over Flax's "
                               "stock cell (leave --lstm-impl auto, or pass --flax-api linen)"),
    (["--dtype", "bfloat16"], "--flax-api nnx: it computes float32 or float64: PyTorch's bfloat16 autocast rules are "
                              "implemented in linen's scan stack only (use --flax-api linen)"),
    (["--workload", "lm"], "--flax-api is not a setting of the lm workload (--workload lm): it is the classifier's; "
                           "leave it out"),
], ids=["lstm-impl", "bfloat16", "lm"])
def test_what_flax_api_nnx_cannot_run_is_one_line_and_exit_status_2_before_the_data_is_read(tmp_path, capsys, flags,
                                                                                           message):
    missing = [] if "lm" in flags else ["--pos", str(tmp_path / "no-pos.txt"), "--neg", str(tmp_path / "no-neg.txt")]
    assert main(["--flax-api", "nnx", "--device", "cpu", "--no-progress", *missing, *flags]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"  # not the missing corpus: refused before it is read


def test_flax_api_nnx_trains_through_the_loop_and_resumes_from_its_training_checkpoint(corpus, tmp_path, capsys):
    """What the bench's jax:nnx row times, a trainer runs: the NNX twin through common.loop, its neutral checkpoint
    read by the linen predictor, and its Orbax training state resumed onto the uninterrupted run's losses."""
    def run(steps: int, name: str, *flags: str) -> list[dict]:
        metrics = tmp_path / f"{name}.jsonl"
        assert main(["--pos", str(corpus[0]), "--neg", str(corpus[1]), "--flax-api", "nnx", "--embed-dim", "8",
                     "--hidden-dim", "16", "--seq-len", "12", "--batch-size", "4", "--device", "cpu", "--log-every",
                     "0", "--no-progress", "--max-steps", str(steps), "--metrics-out", str(metrics), *flags]) == 0
        return [json.loads(line) for line in metrics.read_text().splitlines()]

    whole = run(4, "whole", "--save-dir", str(tmp_path / "best"))
    run(2, "first", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "runs"))
    resumed = run(4, "resumed", "--resume", str(tmp_path / "runs"))
    assert {k: whole[0]["run"][k] for k in ("flax_api", "lstm_impl")} == {"flax_api": "nnx", "lstm_impl": "flax"}
    losses = lambda records: {r["step"]: r["loss"] for r in records if "epoch" in r}  # noqa: E731
    assert losses(resumed) == {k: v for k, v in losses(whole).items() if k > 2}  # the same numbers, bit for bit
    probs = predict_probs(load_checkpoint(tmp_path / "best"), ["good great", "bad awful"])  # linen reads it
    assert probs.shape == (2,) and np.all((probs > 0) & (probs < 1))

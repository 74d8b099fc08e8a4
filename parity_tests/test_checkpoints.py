"""A neutral checkpoint written by one twin's training run scores the test split the same in the
other twin. One epoch of each twin's real ``train(cfg)`` with ``--save-dir`` on the small word corpus (E 8,
H 16, T 12, B 8, the seed's dropout 0.5/0.3 and clip 5), then ``torch_impl.predict.predict_probs`` and
``jax_impl.predict.predict_probs`` on the saved checkpoint. JAX → PyTorch with the seed's left padding,
PyTorch → JAX with right padding (PyTorch packs, JAX masks with the lengths).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from common.checkpoint import load_checkpoint
from common.data import prepare_data
from jax_impl import predict as jax_predict
from jax_impl import train as jax_train
from parity_tests import report
from parity_tests.conftest import small_config
from torch_impl import predict as torch_predict
from torch_impl import train as torch_train

# Probabilities of 16 texts from a float32 forward pass of 12 steps: measured 0 to 6e-8. 1e-5 is the suite's bound.
PROB_TOL = 1e-5
# The training run's own test loss (its twin's evaluation of the same checkpoint) against the mean BCE of
# the other twin's probabilities: float32 terms near 0.69, summed in different orders: a few ulps (6e-8).
LOSS_TOL = 1e-6

DIRECTIONS = {"jax->torch": ("left", jax_train.train), "torch->jax": ("right", torch_train.train)}


def bce(probs: np.ndarray, labels: np.ndarray) -> float:
    """PyTorch BCELoss semantics (each log clamped at -100), mean, in float64."""
    p = np.asarray(probs, np.float64)
    return float(np.mean(-(labels * np.maximum(np.log(p), -100) + (1 - labels) * np.maximum(np.log1p(-p), -100))))


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_a_checkpoint_trained_by_one_twin_predicts_the_same_in_the_other(small_corpus, tmp_path, direction):
    padding, train = DIRECTIONS[direction]
    cfg = small_config(small_corpus, padding=padding, dropout=0.5, fc_dropout=0.3, clip=5.0, epochs=1,
                       save_dir=str(tmp_path / "ckpt"))
    result = train(cfg)
    assert result["steps"] > 0 and (tmp_path / "ckpt" / "model.safetensors").is_file()

    ckpt = load_checkpoint(cfg.save_dir)
    assert ckpt.config.padding == padding
    test = prepare_data(cfg).test  # the run's own split (the checkpoint holds no data settings)
    probs_t = torch_predict.predict_probs(ckpt, test.texts, torch.device("cpu"))
    probs_j = jax_predict.predict_probs(ckpt, test.texts)
    assert len(probs_t) == len(probs_j) == len(test) > 0
    # Training moved the weights: the predictions are not the constant ~0.5 of an untrained model.
    assert np.ptp(probs_t) > 1e-3

    report.within(f"checkpoint {direction} ({padding} padding): test-split P(positive)",
                  report.max_abs_diff(probs_t, probs_j), PROB_TOL)
    other = probs_t if direction == "jax->torch" else probs_j
    report.within(f"checkpoint {direction}: the run's test loss from the other twin",
                  abs(bce(other, test.labels) - result["test_loss"]), LOSS_TOL)

"""The training loop: a non-finite step stops the run (or is skipped and counted)."""
import json

import jax
import numpy as np
import pytest

import jax_impl.classifier
from common.batches import batches
from common.runstate import checkpoint_dirs, load_latest
from jax_impl.state import load_training_state
from common.loop import NonFiniteError
from jax_impl.step import create_train_state
from jax_impl.train import train


@pytest.fixture
def poisoned_steps(tiny, monkeypatch):
    """Make the loss of every training batch holding one token NaN (its rows get a NaN label, through the
    real jitted step); the token is only in training texts and first occurs in the third batch or later.
    Returns the 1-based steps of the first epoch whose batch holds it."""
    cfg, data = tiny.cfg, tiny.data
    order = [set(np.unique(b.tokens).tolist()) for b in batches(data.train, cfg.batch_size, shuffle_seed=cfg.seed,
                                                                epoch=0)]
    elsewhere = set(np.unique(data.val.tokens).tolist()) | set(np.unique(data.test.tokens).tolist())
    token = next(t for t in range(2, len(data.vocab)) if t not in elsewhere
                 and not any(t in ids for ids in order[:2]) and any(t in ids for ids in order))
    real = jax_impl.classifier.to_device

    def poisoning(batch, device=None):
        out = real(batch, device)
        rows = (batch.tokens == token).any(axis=1)
        if rows.any():
            out["labels"] = real(batch.__class__(batch.tokens, np.where(rows, np.nan, batch.labels).astype(
                np.float32), batch.lengths), device)["labels"]
        return out

    monkeypatch.setattr(jax_impl.classifier, "to_device", poisoning)
    return [step for step, ids in enumerate(order, 1) if token in ids]


def test_a_nonfinite_step_stops_with_its_number_and_keeps_the_last_good_checkpoint(tiny, poisoned_steps, tmp_path):
    bad = poisoned_steps[0]
    run_dir = tmp_path / "checkpoints"
    with pytest.raises(NonFiniteError, match=rf"^step {bad} \(epoch 1\): the loss or gradient is not finite"):
        train(tiny.cfg.replace(checkpoint_every=1, checkpoint_dir=str(run_dir)))
    assert checkpoint_dirs(run_dir)[-1][0] == bad - 1
    template = create_train_state(tiny.model, tiny.cfg, tiny.neutral, tiny.device)
    progress, (state, _), _ = load_latest(run_dir, lambda p: load_training_state(
        p, template, jax.device_put(tiny.model.zero_carry(tiny.cfg.batch_size), tiny.device)))
    assert progress.step == bad - 1 and int(state.step) == bad - 1


def test_skip_nonfinite_skips_and_counts_exactly_the_bad_steps(tiny, poisoned_steps, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = train(tiny.cfg.replace(skip_nonfinite=True, metrics_out=str(metrics)))
    assert result["skipped_steps"] == len(poisoned_steps) > 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if "epoch" in r]
    assert [r["step"] for r in steps if r["loss"] is None] == poisoned_steps
    assert all(np.isfinite(r["loss"]) for r in steps if r["loss"] is not None)
    assert result["steps"] == len(steps) and np.isfinite(result["val_loss"])

"""One training step: the carry, detaching, the seed's two errors, truncated BPTT, packing, non-finite steps,
and evaluation. float64 where a test compares numbers, so rounding (~1e-16) cannot blur a real difference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from common.batches import Batch, batches
from common.data import prepare_data
from torch_impl.classifier import eval_step, model_from_config, train_step
from common.loop import evaluate
from torch_impl.step import TrainState, make_optimizer, repackage_hidden
from torch_impl.train import TorchTwin


def _setup(cfg, data, dtype=torch.float64) -> TrainState:
    torch.manual_seed(0)
    model = model_from_config(cfg, len(data.vocab)).to(dtype)
    return TrainState(model, make_optimizer(model, cfg))


def _train_batches(data, cfg, n=2):
    it = batches(data.train, cfg.batch_size, shuffle_seed=cfg.seed, epoch=0)
    return [next(it) for _ in range(n)]


@pytest.fixture
def cfg(tiny_cfg):
    return tiny_cfg.replace(dropout=0.0, fc_dropout=0.0, dtype="float64")


def test_repackage_hidden_keeps_values_and_drops_the_graph():
    h = torch.ones(2, 3, 4, requires_grad=True) * 2
    c = torch.ones(2, 3, 4, requires_grad=True) * 3
    h2, c2 = repackage_hidden((h, c))
    assert h2.grad_fn is None and not h2.requires_grad and not c2.requires_grad
    assert torch.equal(h2, h) and torch.equal(c2, c)
    assert h2.data_ptr() == h.data_ptr()  # the same numbers, not a copy


@pytest.mark.parametrize("detach", [True, False])
def test_gradient_reaches_the_previous_batch_only_without_detach(cfg, tiny_data, detach):
    state = _setup(cfg, tiny_data)
    model = state.model
    h0, c0 = (t.requires_grad_() for t in model.init_hidden(cfg.batch_size))  # stands for the last batch's state
    train_step(state, (h0, c0), _train_batches(tiny_data, cfg, 1)[0], cfg.replace(detach=detach))
    if detach:
        assert h0.grad is None and c0.grad is None
    else:
        assert h0.grad is not None and h0.grad.abs().sum() > 0


def test_the_returned_carry_is_the_next_batchs_starting_state(cfg, tiny_data):
    first, second = _train_batches(tiny_data, cfg)
    losses = {}
    for carry in ("stateful", "reset"):  # reset: the loop hands the step zeros instead
        state = _setup(cfg, tiny_data)
        model = state.model
        _, hidden, loss1 = train_step(state, model.init_hidden(cfg.batch_size), first, cfg)
        hidden = model.init_hidden(cfg.batch_size) if carry == "reset" else hidden
        _, hidden, loss2 = train_step(state, hidden, second, cfg)
        losses[carry] = (loss1.item(), loss2.item())
    assert losses["stateful"][0] == losses["reset"][0]  # both start from zeros
    assert abs(losses["stateful"][1] - losses["reset"][1]) > 1e-8  # only the carry differs


def test_no_detach_fails_at_the_second_batch_with_pytorch_message(cfg, tiny_data):
    cfg = cfg.replace(detach=False, dtype="float32")
    state = _setup(cfg, tiny_data, torch.float32)
    model = state.model
    first, second = _train_batches(tiny_data, cfg)
    _, hidden, _ = train_step(state, model.init_hidden(cfg.batch_size), first, cfg)
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        train_step(state, hidden, second, cfg)


def test_retain_graph_then_fails_on_the_optimizer_inplace_update(cfg, tiny_data):
    # Keeping the graph only moves the error: Adam has since updated, in place, weights that graph saved.
    cfg = cfg.replace(detach=False, dtype="float32")
    state = _setup(cfg, tiny_data, torch.float32)
    model = state.model
    first, second = _train_batches(tiny_data, cfg)
    _, hidden, _ = train_step(state, model.init_hidden(cfg.batch_size), first, cfg, retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        train_step(state, hidden, second, cfg, retain_graph=True)


def _one_step(cfg, data, batch):
    state = _setup(cfg, data)
    model = state.model
    _, _, loss = train_step(state, model.init_hidden(cfg.batch_size), batch, cfg)
    return loss.item(), {k: v.clone() for k, v in model.state_dict().items()}


def test_tbptt_keeps_the_loss_and_truncates_the_gradient(cfg, tiny_data):
    batch = _train_batches(tiny_data, cfg, 1)[0]
    full_loss, full = _one_step(cfg, tiny_data, batch)
    chunk_loss, chunked = _one_step(cfg.replace(tbptt=5), tiny_data, batch)  # chunks of 5, 5, 2
    assert chunk_loss == pytest.approx(full_loss, rel=0, abs=1e-12)  # detaching does not change values
    # The gradient stops at each chunk boundary: the LSTM weights move differently ...
    assert (full["lstm.weight_hh_l0"] - chunked["lstm.weight_hh_l0"]).abs().max() > 1e-6
    # ... while the output layer, which sees only the final state (the same values), moves the same.
    torch.testing.assert_close(full["fc.bias"], chunked["fc.bias"], rtol=0, atol=1e-12)


def test_tbptt_of_the_whole_length_is_full_bptt(cfg, tiny_data):
    batch = _train_batches(tiny_data, cfg, 1)[0]
    _, full = _one_step(cfg, tiny_data, batch)
    _, chunked = _one_step(cfg.replace(tbptt=cfg.seq_len), tiny_data, batch)
    for name in full:
        assert torch.equal(full[name], chunked[name]), name


def test_packed_mode_trains_on_right_padding_and_differs_from_left(cfg, tiny_data):
    right_cfg = cfg.replace(padding="right")
    right_data = prepare_data(right_cfg)
    left_batch = _train_batches(tiny_data, cfg, 1)[0]
    right_batch = _train_batches(right_data, right_cfg, 1)[0]
    assert np.array_equal(left_batch.lengths, right_batch.lengths)  # the same texts
    left_loss, _ = _one_step(cfg, tiny_data, left_batch)
    right_loss, after = _one_step(right_cfg, right_data, right_batch)
    assert np.isfinite(right_loss)
    assert abs(left_loss - right_loss) > 1e-6  # packing skips the <pad> steps the seed feeds


def test_nonfinite_gradient_makes_the_returned_loss_nan(cfg, tiny_data):
    state = _setup(cfg, tiny_data)
    model = state.model
    model.fc.bias.register_hook(lambda grad: grad * float("inf"))
    _, _, loss = train_step(state, model.init_hidden(cfg.batch_size),
                         _train_batches(tiny_data, cfg, 1)[0], cfg)
    assert torch.isnan(loss)


def test_skip_nonfinite_changes_nothing(cfg, tiny_data):
    cfg = cfg.replace(skip_nonfinite=True)
    state = _setup(cfg, tiny_data)
    model = state.model
    model.fc.bias.register_hook(lambda grad: grad * float("inf"))  # an exploding gradient, finite loss
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hidden = tuple(t + 0.5 for t in model.init_hidden(cfg.batch_size))
    _, carried, loss = train_step(state, hidden, _train_batches(tiny_data, cfg, 1)[0], cfg)
    assert torch.isnan(loss)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert not state.optimizer.state  # Adam never stepped
    assert all(torch.equal(a, b) for a, b in zip(carried, hidden))  # the carry does not move either


def test_eval_step_sums_bce_and_counts_correct(cfg, tiny_data):
    model = _setup(cfg, tiny_data).model
    batch = next(batches(tiny_data.val, 5))
    loss_sum, correct = (float(x) for x in eval_step(model, None, batch, cfg)[1])
    probs, _ = model.eval()(torch.from_numpy(batch.tokens).long(), model.init_hidden(5))
    p, y = probs.detach().numpy(), batch.labels
    expected = -(y * np.log(p) + (1 - y) * np.log(1 - p)).sum()
    assert loss_sum == pytest.approx(expected, rel=1e-12)
    assert correct == int((np.round(p) == y).sum())


def test_evaluate_reads_every_example_once(cfg, tiny_data):
    model = _setup(cfg, tiny_data).model
    split = tiny_data.val  # 12 examples; batch 5 leaves a last batch of 2
    whole = Batch(split.tokens, split.labels, np.maximum(split.lengths, 1))
    loss_sum, correct = (float(x) for x in eval_step(model, None, whole, cfg)[1])
    twin = TorchTwin(cfg.replace(batch_size=5), len(tiny_data.vocab), torch.device("cpu"), None)
    twin.model = model
    mean_loss, accuracy = evaluate(twin, None, split, cfg.replace(batch_size=5))
    assert mean_loss == pytest.approx(loss_sum / len(split), rel=1e-12)
    assert accuracy == correct / len(split)

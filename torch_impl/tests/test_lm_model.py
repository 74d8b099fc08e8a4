"""The language model (word_language_model's RNNModel): shapes, the hidden state, the neutral parameters, tied
weights, dropout, and the loss."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from common.errors import CheckpointError, ConfigError
from common.params import init_lm_params, lm_param_shapes
from torch_impl.lm import cross_entropy, make_lm_model
from torch_impl.lm_model import RNNModel
from torch_impl.model import export_params, load_params
from torch_impl.step import repackage_hidden

V, E, H, L, T, B = 50, 16, 16, 2, 7, 3
CELLS = ["lstm", "gru"]


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, V, (T, B))).long()


@pytest.mark.parametrize("cell", CELLS)
def test_logits_cover_every_step_and_the_hidden_keeps_its_shape(cell):
    model = make_lm_model(V, E, H, L, cell).eval()
    logits, hidden = model(_tokens(), model.init_hidden(B))
    assert logits.shape == (T, B, V)
    if cell == "lstm":
        assert [tuple(t.shape) for t in hidden] == [(L, B, H), (L, B, H)]
    else:
        assert tuple(hidden.shape) == (L, B, H)


@pytest.mark.parametrize("cell", CELLS)
def test_init_hidden_is_zeros_in_the_model_dtype(cell):
    hidden = make_lm_model(V, E, H, L, cell).double().init_hidden(4)
    tensors = hidden if cell == "lstm" else (hidden,)
    assert len(tensors) == (2 if cell == "lstm" else 1)
    for t in tensors:
        assert t.dtype == torch.float64 and tuple(t.shape) == (L, 4, H) and not t.any()


def test_logits_are_the_decoder_of_the_top_layer_at_every_step():
    model = make_lm_model(V, E, H, L, "gru").eval()
    tokens, hidden = _tokens(), model.init_hidden(B)
    logits, _ = model(tokens, hidden)
    output, _ = model.rnn(model.encoder(tokens), hidden)
    assert torch.equal(logits, model.decoder(output))
    # Each step sees only its past: a change at the last step leaves the earlier logits alone.
    changed = tokens.clone()
    changed[-1] = (changed[-1] + 1) % V
    later, _ = model(changed, hidden)
    assert torch.equal(later[:-1], logits[:-1]) and not torch.equal(later[-1], logits[-1])


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("tied", [False, True])
def test_parameter_names_are_the_neutral_names_in_order(cell, tied):
    model = RNNModel(V, E, H, L, cell, tied=tied)
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == lm_param_shapes(V, E, H, L, cell, tied)
    assert list(dict(model.named_parameters())) == list(lm_param_shapes(V, E, H, L, cell, tied))


@pytest.mark.parametrize("tied", [False, True])
def test_params_round_trip_bitwise(tied):
    neutral = init_lm_params(V, E, H, L, "lstm", tied, seed=5)
    model = RNNModel(V, E, H, L, "lstm", tied=tied)
    load_params(model, neutral)
    exported = export_params(model)
    assert list(exported) == list(neutral)
    for name, value in neutral.items():
        assert exported[name].dtype == np.float32 and exported[name].tobytes() == value.tobytes(), name


def test_make_lm_model_holds_the_shared_initial_weights():
    model = make_lm_model(V, E, H, L, "gru", seed=3)
    for name, value in init_lm_params(V, E, H, L, "gru", False, seed=3).items():
        np.testing.assert_array_equal(export_params(model)[name], value, err_msg=name)


def test_tied_decoder_weight_is_the_encoder_table_and_its_gradient_reaches_the_encoder():
    model = make_lm_model(V, E, H, L, "lstm", tied=True)
    assert model.decoder.weight is model.encoder.weight
    x = torch.randint(-3, 4, (5, H), generator=torch.Generator().manual_seed(0)).float()  # small integers: exact sums
    model.decoder(x).sum().backward()  # d/dW of sum(x W^T + b): every row of W gets x summed over the rows
    torch.testing.assert_close(model.encoder.weight.grad, x.sum(0).expand(V, H), rtol=0, atol=0)


def test_load_params_refuses_an_untied_tree_for_a_tied_model():
    model = RNNModel(V, E, H, L, "lstm", tied=True)
    with pytest.raises(CheckpointError, match=r"missing \[\], unexpected \['decoder.weight'\]"):
        load_params(model, init_lm_params(V, E, H, L, "lstm", False, seed=0))


def test_load_params_refuses_a_gru_tree_for_an_lstm_model():
    with pytest.raises(CheckpointError, match=r"'rnn.weight_ih_l0' has shape \(48, 16\), the model needs \(64, 16\)"):
        load_params(RNNModel(V, E, H, L, "lstm"), init_lm_params(V, E, H, L, "gru", False, seed=0))


def test_tied_weights_with_embed_dim_not_hidden_dim_are_refused():
    with pytest.raises(ConfigError, match="tied weights need --embed-dim equal to --hidden-dim"):
        RNNModel(V, 8, H, L, "lstm", tied=True)


@pytest.mark.parametrize("cell", CELLS)
def test_dropout_acts_in_training_and_is_off_in_eval(cell):
    model = make_lm_model(V, E, H, L, cell, dropout=0.5)
    plain = make_lm_model(V, E, H, L, cell, dropout=0.0).eval()
    tokens, hidden = _tokens(), model.init_hidden(B)
    torch.manual_seed(0)
    trained, _ = model.train()(tokens, hidden)
    evaluated, _ = model.eval()(tokens, hidden)
    assert torch.equal(evaluated, plain(tokens, hidden)[0])
    assert (trained - evaluated).abs().max() > 1e-2


def test_cross_entropy_is_the_mean_over_every_token():
    logits = torch.randn(T, B, V, generator=torch.Generator().manual_seed(0))
    targets = _tokens(1)
    per_token = -torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]  # (T, B)
    torch.testing.assert_close(cross_entropy(logits, targets), per_token.mean(), rtol=1e-6, atol=0)
    # Uniform logits: every token costs log V, the perplexity is V.
    assert math.isclose(math.exp(cross_entropy(torch.zeros(T, B, V), targets).item()), V, rel_tol=1e-5)


@pytest.mark.parametrize("cell", CELLS)
def test_repackage_hidden_cuts_either_hidden_off_the_graph(cell):
    # The trainers' truncation (torch_impl.step.repackage_hidden) takes the LSTM's pair and the GRU's one tensor.
    model = make_lm_model(V, E, H, L, cell)
    _, hidden = model(_tokens(), model.init_hidden(B))
    cut = repackage_hidden(hidden)
    pairs = zip(hidden, cut) if cell == "lstm" else [(hidden, cut)]
    for before, after in pairs:
        assert before.grad_fn is not None and after.grad_fn is None and torch.equal(before, after)

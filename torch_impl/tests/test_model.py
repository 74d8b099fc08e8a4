"""The model: shapes, the carry, packed sequences, and the neutral checkpoint round trip."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from common.checkpoint import load_checkpoint, save_checkpoint
from common.params import init_params, param_shapes
from torch_impl.classifier import model_from_config
from torch_impl.model import SentimentRNN, export_params, load_params

V, E, H, L, B, T = 30, 8, 16, 2, 4, 12


def _model(dtype=torch.float32) -> SentimentRNN:
    model = SentimentRNN(V, E, H, L, dropout=0.0, fc_dropout=0.0)
    load_params(model, init_params(V, E, H, L, seed=0))
    return model.to(dtype).eval()


def _tokens(seed: int = 0, batch: int = B) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(1, V, (batch, T))).long()


def test_output_and_carry_shapes():
    model = _model()
    probs, (h, c) = model(_tokens(), model.init_hidden(B))
    assert probs.shape == (B,)
    assert h.shape == c.shape == (L, B, H)
    assert torch.all((probs > 0) & (probs < 1))


def test_init_hidden_follows_the_model_dtype():
    h, c = _model(torch.float64).init_hidden(3)
    assert h.dtype == c.dtype == torch.float64
    assert h.shape == (L, 3, H) and not h.any() and not c.any()


def test_state_dict_names_are_the_neutral_names_in_order():
    model = SentimentRNN(V, E, H, L)
    expected = param_shapes(V, E, H, L)
    assert list(model.state_dict()) == list(expected)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected


def test_model_from_config_holds_the_shared_initial_weights(tiny_cfg):
    model = model_from_config(tiny_cfg, V)
    expected = init_params(V, tiny_cfg.embed_dim, tiny_cfg.hidden_dim, tiny_cfg.layers, seed=tiny_cfg.seed)
    for name, value in export_params(model).items():
        np.testing.assert_array_equal(value, expected[name])


def test_classifier_reads_the_last_step_of_the_top_layer():
    # For left padding h_n[-1] must be the seed's lstm_out[:, -1]: the same numbers, bitwise.
    model = _model()
    tokens, hidden = _tokens(), model.init_hidden(B)
    probs, _ = model(tokens, hidden)
    lstm_out, _ = model.lstm(model.embedding(tokens), hidden)
    seed_probs = torch.sigmoid(model.fc(lstm_out[:, -1])).squeeze(-1)
    assert torch.equal(probs, seed_probs)


def test_second_batch_depends_on_the_first_batch_final_state():
    model = _model()
    _, carried = model(_tokens(0), model.init_hidden(B))
    second = _tokens(1)[:, :2]  # short, so the carry has not yet faded (an LSTM forgets over its steps)
    from_carry, _ = model(second, carried)
    from_zeros, _ = model(second, model.init_hidden(B))
    assert (from_carry - from_zeros).abs().min() > 1e-4  # float32 rounding here is ~1e-7


def test_packed_rows_equal_their_unpadded_forward():
    # float64, so the only differences are summation order: 1e-12 is far above that and far below any real bug.
    model = _model(torch.float64)
    lengths = torch.tensor([12, 1, 5, 9])
    tokens = _tokens(2)
    for i, n in enumerate(lengths.tolist()):
        tokens[i, n:] = 0  # right padding
    packed, (h, c) = model(tokens, model.init_hidden(B), lengths)
    for i, n in enumerate(lengths.tolist()):
        alone, (h_i, c_i) = model(tokens[i:i + 1, :n], model.init_hidden(1))
        torch.testing.assert_close(packed[i:i + 1], alone, rtol=0, atol=1e-12)
        torch.testing.assert_close(h[:, i:i + 1], h_i, rtol=0, atol=1e-12)
        torch.testing.assert_close(c[:, i:i + 1], c_i, rtol=0, atol=1e-12)


def test_packed_right_padding_differs_from_reading_the_left_padding():
    # Left padding feeds <pad> embeddings before the text; packing reads the text alone.
    model = _model()
    lengths = torch.tensor([3, 5, 7, 12])
    right = torch.zeros(B, T, dtype=torch.long)
    left = torch.zeros(B, T, dtype=torch.long)
    texts = _tokens(3)
    for i, n in enumerate(lengths.tolist()):
        right[i, :n] = texts[i, :n]
        left[i, T - n:] = texts[i, :n]
    packed, _ = model(right, model.init_hidden(B), lengths)
    unpacked, _ = model(left, model.init_hidden(B))
    assert (packed[:3] - unpacked[:3]).abs().min() > 1e-6  # padded rows differ
    torch.testing.assert_close(packed[3], unpacked[3], rtol=0, atol=1e-6)  # the full row is the same text


def test_params_round_trip_bitwise():
    params = init_params(V, E, H, L, seed=3)
    model = SentimentRNN(V, E, H, L)
    load_params(model, params)
    exported = export_params(model)
    assert list(exported) == list(params)
    for name in params:
        assert exported[name].dtype == np.float32
        assert exported[name].tobytes() == params[name].tobytes()


def test_neutral_checkpoint_save_and_load_bitwise(tmp_path, tiny_cfg, tiny_data):
    model = model_from_config(tiny_cfg, len(tiny_data.vocab))
    save_checkpoint(tmp_path / "ckpt", export_params(model), tiny_cfg, tiny_data.vocab, tiny_data.tokenizer)
    ckpt = load_checkpoint(tmp_path / "ckpt")
    restored = model_from_config(ckpt.config.replace(seed=99), len(ckpt.vocab))  # other initial weights
    load_params(restored, ckpt.params)
    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(a, b), name


def test_load_params_refuses_a_wrong_shape():
    from common.errors import CheckpointError
    params = init_params(V + 1, E, H, L, seed=0)
    with pytest.raises(CheckpointError, match="embedding.weight"):
        load_params(SentimentRNN(V, E, H, L), params)

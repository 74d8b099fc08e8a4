"""init_lm_params: the language model's layout (word_language_model's RNNModel) and its initial distributions."""
from __future__ import annotations

import numpy as np
import pytest

from common.errors import ConfigError
from common.params import init_lm_params, lm_param_shapes

V, E, H, L = 2000, 32, 32, 2


@pytest.fixture(scope="module")
def lstm_params():
    return init_lm_params(V, E, H, L, "lstm", tied=False, seed=0)


def test_lstm_shapes_follow_the_example_state_dict():
    assert lm_param_shapes(10, 4, 3, 2, "lstm", tied=False) == {
        "encoder.weight": (10, 4),
        "rnn.weight_ih_l0": (12, 4), "rnn.weight_hh_l0": (12, 3), "rnn.bias_ih_l0": (12,), "rnn.bias_hh_l0": (12,),
        "rnn.weight_ih_l1": (12, 3), "rnn.weight_hh_l1": (12, 3), "rnn.bias_ih_l1": (12,), "rnn.bias_hh_l1": (12,),
        "decoder.weight": (10, 3), "decoder.bias": (10,),
    }


def test_gru_weights_stack_three_gates():
    shapes = lm_param_shapes(10, 4, 3, 1, "gru", tied=False)
    assert shapes["rnn.weight_ih_l0"] == (9, 4) and shapes["rnn.weight_hh_l0"] == (9, 3)
    assert shapes["rnn.bias_ih_l0"] == shapes["rnn.bias_hh_l0"] == (9,)


def test_a_tied_tree_holds_the_encoder_table_and_no_decoder_weight():
    untied = lm_param_shapes(10, 3, 3, 2, "lstm", tied=False)
    tied = lm_param_shapes(10, 3, 3, 2, "lstm", tied=True)
    assert list(tied) == [name for name in untied if name != "decoder.weight"]
    assert tied["encoder.weight"] == (10, 3) and tied["decoder.bias"] == (10,)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("tied", [False, True])
def test_init_lm_params_has_the_shapes_in_order_in_float32(cell, tied):
    params = init_lm_params(50, 16, 16, L, cell, tied, seed=0)
    shapes = lm_param_shapes(50, 16, 16, L, cell, tied)
    assert list(params) == list(shapes)
    assert {name: (a.shape, a.dtype) for name, a in params.items()} == {n: (s, np.float32) for n, s in shapes.items()}


def test_encoder_and_decoder_weights_are_uniform_within_a_tenth(lstm_params):
    for name in ("encoder.weight", "decoder.weight"):
        w = lstm_params[name].astype(np.float64)  # 64,000 draws of U(-0.1, 0.1)
        assert np.abs(w).max() <= 0.1, name
        # Mean 0 with standard error 0.1/√3/√64000 ≈ 2.3e-4; 64,000 draws reach within 1e-3 of each end.
        assert abs(w.mean()) < 1.5e-3 and w.min() < -0.099 and w.max() > 0.099, name
        assert abs(w.std() - 0.1 / np.sqrt(3)) < 1e-3, name  # a uniform's spread, not a normal's


def test_rnn_weights_and_biases_are_uniform_within_one_over_sqrt_hidden(lstm_params):
    bound = 1 / np.sqrt(H)
    for name, w in lstm_params.items():
        if name.startswith("rnn."):
            assert np.abs(w).max() <= bound, name
            assert np.abs(w).max() > 0.9 * bound, name  # the whole range is used, not a narrower one


def test_decoder_bias_starts_at_zero(lstm_params):
    assert not lstm_params["decoder.bias"].any()


def test_draws_follow_the_state_dict_order_from_the_seed():
    # The encoder is the first draw of default_rng(seed), in float64, then rounded.
    expected = np.random.default_rng(7).uniform(-0.1, 0.1, (50, 16)).astype(np.float32)
    np.testing.assert_array_equal(init_lm_params(50, 16, 16, L, "gru", False, seed=7)["encoder.weight"], expected)
    # The decoder's weight is the last draw: tying leaves every other parameter the same numbers.
    untied = init_lm_params(50, 16, 16, L, "gru", False, seed=7)
    tied = init_lm_params(50, 16, 16, L, "gru", True, seed=7)
    for name, value in tied.items():
        np.testing.assert_array_equal(value, untied[name], err_msg=name)


def test_init_lm_params_is_deterministic_by_seed():
    a, b = (init_lm_params(50, 16, 16, L, "lstm", False, seed=3) for _ in range(2))
    c = init_lm_params(50, 16, 16, L, "lstm", False, seed=4)
    assert all(np.array_equal(a[name], b[name]) for name in a)
    assert not np.array_equal(a["rnn.weight_hh_l1"], c["rnn.weight_hh_l1"])


def test_tied_weights_with_embed_dim_not_hidden_dim_are_refused():
    with pytest.raises(ConfigError, match="tied weights need --embed-dim equal to --hidden-dim") as err:
        init_lm_params(50, 16, 32, L, "lstm", tied=True, seed=0)
    assert "got 16 and 32: set both to one size, or leave out --tied" in str(err.value)


def test_an_unknown_cell_is_refused():
    with pytest.raises(ConfigError, match="the cell must be one of lstm, gru, got 'rnn'"):
        lm_param_shapes(50, 16, 16, L, "rnn", tied=False)

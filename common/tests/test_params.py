"""init_params: PyTorch's layout and initial distributions, drawn in numpy from a seed."""
from __future__ import annotations

import numpy as np
import pytest

from common.params import init_params, param_shapes

V, E, H, L = 1000, 64, 32, 2


@pytest.fixture(scope="module")
def params():
    return init_params(V, E, H, L, seed=0)


def test_param_shapes_follow_the_pytorch_state_dict():
    assert param_shapes(10, 4, 3, 2) == {
        "embedding.weight": (10, 4),
        "lstm.weight_ih_l0": (12, 4), "lstm.weight_hh_l0": (12, 3), "lstm.bias_ih_l0": (12,), "lstm.bias_hh_l0": (12,),
        "lstm.weight_ih_l1": (12, 3), "lstm.weight_hh_l1": (12, 3), "lstm.bias_ih_l1": (12,), "lstm.bias_hh_l1": (12,),
        "fc.weight": (1, 3), "fc.bias": (1,),
    }


def test_init_params_shapes_match_param_shapes_and_are_float32(params):
    assert list(params) == list(param_shapes(V, E, H, L))
    for name, shape in param_shapes(V, E, H, L).items():
        assert params[name].shape == shape and params[name].dtype == np.float32, name


def test_embedding_is_standard_normal(params):
    emb = params["embedding.weight"].astype(np.float64)  # 64,000 draws
    # Standard error of the mean 1/√64000 ≈ 0.004 and of the std ≈ 0.003: tolerances are ~5 standard errors.
    assert abs(emb.mean()) < 0.02
    assert abs(emb.std() - 1.0) < 0.015
    assert abs(np.mean(np.abs(emb) < 1.0) - 0.6827) < 0.01  # the normal's mass within one sigma


def test_lstm_and_linear_are_uniform_within_one_over_sqrt_hidden(params):
    bound = 1.0 / np.sqrt(H)
    rest = [v for k, v in params.items() if k != "embedding.weight"]
    for arr in rest:
        assert np.all(np.abs(arr) <= np.float32(bound))
    values = np.concatenate([v.ravel() for v in rest]).astype(np.float64)  # ~21k draws
    # U(-b, b): mean 0, std b/√3, four equal quarters. Tolerances: ~5 standard errors for this many draws.
    assert abs(values.mean()) < 0.03 * bound
    assert abs(values.std() - bound / np.sqrt(3)) < 0.02 * bound
    assert values.min() < -0.99 * bound and values.max() > 0.99 * bound
    quarters = np.histogram(values, bins=4, range=(-bound, bound))[0] / values.size
    np.testing.assert_allclose(quarters, 0.25, atol=0.02)


def test_same_seed_gives_identical_parameters(params):
    again = init_params(V, E, H, L, seed=0)
    for name in params:
        np.testing.assert_array_equal(again[name].view(np.uint32), params[name].view(np.uint32), err_msg=name)


def test_different_seed_gives_different_parameters(params):
    other = init_params(V, E, H, L, seed=1)
    for name in params:
        assert not np.array_equal(other[name], params[name]), name

"""The language model in Flax (word_language_model's RNNModel): shapes, the explicit carry, PyTorch's parameter tree,
tied weights, dropout, the two implementations of each cell, and the loss."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.errors import ConfigError
from common.params import init_lm_params, lm_param_shapes
from jax_impl.lm import from_flax, make_lm_model, to_flax
from jax_impl.lm_model import RNNModel
from jax_impl.loss import cross_entropy

V, E, H, L, T, B = 50, 16, 16, 2, 7, 3
CELLS = ["lstm", "gru"]
TOKENS = np.random.default_rng(0).integers(0, V, (T, B)).astype(np.int32)
TARGETS = np.random.default_rng(1).integers(0, V, (T, B)).astype(np.int32)


def _params(cell: str, tied: bool = False, seed: int = 0) -> dict:
    return to_flax(init_lm_params(V, E, H, L, cell, tied, seed))


def _nonzero_carry(model: RNNModel, seed: int = 2):
    leaves, tree = jax.tree_util.tree_flatten(model.zero_carry(B))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree_util.tree_unflatten(tree, [jnp.tanh(jax.random.normal(k, x.shape)) for k, x in zip(keys, leaves)])


@pytest.mark.parametrize("cell", CELLS)
def test_logits_cover_every_step_and_the_carry_keeps_its_shape(cell):
    model = make_lm_model(V, E, H, L, cell)
    logits, carry = model.apply({"params": _params(cell)}, TOKENS, model.zero_carry(B))
    assert logits.shape == (T, B, V) and logits.dtype == jnp.float32
    assert len(carry) == L
    for layer in carry:
        shapes = [x.shape for x in layer] if cell == "lstm" else [layer.shape]
        assert shapes == [(B, H)] * (2 if cell == "lstm" else 1)


@pytest.mark.parametrize("cell", CELLS)
def test_zero_carry_is_one_zero_state_per_layer(cell):
    carry = make_lm_model(V, E, H, L, cell).zero_carry(4)
    expected = ((np.zeros((4, H)), np.zeros((4, H))),) * L if cell == "lstm" else (np.zeros((4, H)),) * L
    jax.tree_util.tree_map(np.testing.assert_array_equal, carry, expected)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(carry))


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("tied", [False, True])
def test_the_parameter_tree_is_pytorchs_nested_at_the_first_dot(cell, tied):
    model = make_lm_model(V, E, H, L, cell, tied=tied)
    shapes = jax.eval_shape(model.init, jax.random.key(0), TOKENS, model.zero_carry(B))["params"]
    expected = to_flax({name: np.zeros(shape) for name, shape in lm_param_shapes(V, E, H, L, cell, tied).items()})
    assert jax.tree_util.tree_map(lambda x: x.shape, shapes) == jax.tree_util.tree_map(lambda x: x.shape, expected)
    assert ("weight" in shapes["decoder"]) is not tied


@pytest.mark.slow  # compiles the initialisation: about 4 s on a shared 2-core CPU
def test_flax_init_draws_the_examples_distributions():
    model = make_lm_model(V, E, H, L, "lstm")
    params = jax.jit(model.init)(jax.random.key(0), TOKENS, model.zero_carry(B))["params"]
    assert float(jnp.abs(params["encoder"]["weight"]).max()) <= 0.1
    assert float(jnp.abs(params["decoder"]["weight"]).max()) <= 0.1
    assert not params["decoder"]["bias"].any()
    assert all(float(jnp.abs(w).max()) <= H ** -0.5 for w in params["rnn"].values())


@pytest.mark.parametrize("tied", [False, True])
def test_params_round_trip_bitwise(tied):
    neutral = init_lm_params(V, E, H, L, "gru", tied, seed=5)
    back = from_flax(jax.device_put(to_flax(neutral)))
    assert list(back) == list(neutral)
    for name, value in neutral.items():
        assert back[name].dtype == np.float32 and back[name].tobytes() == value.tobytes(), name


@pytest.mark.slow  # two compilations of a gradient: about 5 s on a shared 2-core CPU
def test_tied_encoder_gradient_sums_the_embedding_and_the_decoder_uses():
    # The tied model is the untied one whose decoder weight is the encoder table, so the tied table's gradient is
    # the untied encoder's plus the untied decoder's: the decoder's use reaches the encoder.
    untied_model, tied_model = make_lm_model(V, H, H, L, "lstm"), make_lm_model(V, H, H, L, "lstm", tied=True)
    tied = _params("lstm", tied=True)
    untied = {**tied, "decoder": {"weight": tied["encoder"]["weight"], "bias": tied["decoder"]["bias"]}}

    def loss(model, params):
        return cross_entropy(model.apply({"params": params}, TOKENS, model.zero_carry(B))[0], TARGETS)

    g_tied = jax.jit(jax.grad(lambda p: loss(tied_model, p)))(tied)
    g_untied = jax.jit(jax.grad(lambda p: loss(untied_model, p)))(untied)
    assert float(jnp.abs(g_untied["decoder"]["weight"]).max()) > 1e-3  # the decoder's use is not negligible
    np.testing.assert_allclose(g_tied["encoder"]["weight"],
                               g_untied["encoder"]["weight"] + g_untied["decoder"]["weight"], rtol=1e-6, atol=1e-9)


def test_tied_weights_with_embed_dim_not_hidden_dim_are_refused():
    with pytest.raises(ConfigError, match="tied weights need --embed-dim equal to --hidden-dim"):
        RNNModel(V, 8, H, L, "lstm", tied=True)


def test_a_recurrence_without_the_cell_is_refused():
    with pytest.raises(ConfigError, match="the language model's gru recurrence is one of scan, flax, got 'fused'"):
        make_lm_model(V, E, H, L, "gru", impl="fused")


@pytest.mark.parametrize("cell", CELLS)
def test_dropout_acts_in_training_and_is_off_in_eval(cell):
    model, plain = make_lm_model(V, E, H, L, cell, dropout=0.5), make_lm_model(V, E, H, L, cell, dropout=0.0)
    params, carry = _params(cell), model.zero_carry(B)
    evaluated, _ = model.apply({"params": params}, TOKENS, carry, train=False)
    trained, _ = model.apply({"params": params}, TOKENS, carry, train=True, rngs={"dropout": jax.random.key(0)})
    np.testing.assert_array_equal(evaluated, plain.apply({"params": params}, TOKENS, carry)[0])
    assert float(jnp.abs(trained - evaluated).max()) > 1e-2


@pytest.mark.parametrize("cell", CELLS)
def test_the_carry_passed_on_continues_the_sequence(cell):
    # Three steps then four, the carry handed over, are the seven steps at once.
    model, params = make_lm_model(V, E, H, L, cell), _params(cell)
    carry0 = _nonzero_carry(model)
    whole, final = model.apply({"params": params}, TOKENS, carry0)
    first, carry = model.apply({"params": params}, TOKENS[:3], carry0)
    second, carry = model.apply({"params": params}, TOKENS[3:], carry)
    np.testing.assert_allclose(jnp.concatenate([first, second]), whole, rtol=0, atol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), carry, final)
    from_zero, _ = model.apply({"params": params}, TOKENS, model.zero_carry(B))
    assert float(jnp.abs(from_zero - whole).max()) > 1e-3  # the incoming carry matters


@pytest.mark.parametrize("cell", CELLS)
def test_scan_and_flax_compute_the_same_function(cell):
    # Flax's stock cells fed PyTorch's weights are PyTorch's cells: the same logits and carry up to float32 rounding
    # of differently ordered sums (measured ≤ 6e-8).
    params = _params(cell)
    scan, flax = (make_lm_model(V, E, H, L, cell, impl=impl) for impl in ("scan", "flax"))
    carry0 = _nonzero_carry(scan)
    (logits_s, carry_s), (logits_f, carry_f) = (m.apply({"params": params}, TOKENS, carry0) for m in (scan, flax))
    np.testing.assert_allclose(logits_f, logits_s, rtol=0, atol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), carry_f, carry_s)


def test_cross_entropy_is_the_mean_over_every_token():
    logits = jax.random.normal(jax.random.key(0), (T, B, V))
    per_token = -jnp.take_along_axis(jax.nn.log_softmax(logits), TARGETS[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(cross_entropy(logits, TARGETS), per_token.mean(), rtol=1e-6)
    # Uniform logits: every token costs log V, the perplexity is V.
    assert math.isclose(math.exp(float(cross_entropy(jnp.zeros((T, B, V)), TARGETS))), V, rel_tol=1e-5)


def test_cross_entropy_of_bfloat16_logits_is_computed_in_float32():
    logits = jax.random.normal(jax.random.key(0), (T, B, V)).astype(jnp.bfloat16)
    loss = cross_entropy(logits, TARGETS)
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(loss, cross_entropy(logits.astype(jnp.float32), TARGETS), rtol=0, atol=0)


@pytest.mark.parametrize("impl", ["scan", "flax"])
@pytest.mark.parametrize("precision", [jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT], ids=lambda p: p.name)
def test_every_matmul_forward_and_backward_runs_at_the_models_precision(impl, precision):
    model = make_lm_model(V, E, H, L, "gru", tied=True, impl=impl, precision=precision)

    def loss(params):
        return cross_entropy(model.apply({"params": params}, TOKENS, model.zero_carry(B))[0], TARGETS)

    jaxpr = str(jax.make_jaxpr(jax.grad(loss))(_params("gru", tied=True)))
    name = precision.name
    assert jaxpr.count("dot_general") >= 10  # the input projections, the recurrences, the decoder, and gradients
    assert jaxpr.count("dot_general") == jaxpr.count(f"precision=(Precision.{name}, Precision.{name})")

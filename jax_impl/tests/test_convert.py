"""Neutral ⇄ Flax conversion: transposes only, bitwise round trips, and the neutral checkpoint."""
import jax
import jax.numpy as jnp
import numpy as np

from common.checkpoint import load_checkpoint, save_checkpoint
from common.params import init_params, param_shapes
from jax_impl.convert import from_flax, to_flax


def test_round_trip_is_bitwise():
    neutral = init_params(13, 6, 5, 3, seed=4)
    back = from_flax(to_flax(neutral))
    assert list(back) == list(param_shapes(13, 6, 5, 3))  # state-dict order
    for name, arr in neutral.items():
        assert back[name].dtype == np.float32 and np.array_equal(back[name], arr), name


def test_round_trip_through_device_arrays_is_bitwise():
    neutral = init_params(13, 6, 5, 2, seed=4)
    on_device = jax.tree_util.tree_map(jnp.asarray, to_flax(neutral))
    back = from_flax(on_device)
    assert all(np.array_equal(back[k], v) for k, v in neutral.items())


def test_lstm_weights_keep_pytorchs_names_and_layout_and_the_dense_kernel_is_transposed():
    neutral = init_params(13, 6, 5, 2, seed=4)
    params = to_flax(neutral)
    assert np.array_equal(params["lstm"]["weight_ih_l1"], neutral["lstm.weight_ih_l1"])
    assert np.array_equal(params["lstm"]["weight_hh_l0"], neutral["lstm.weight_hh_l0"])
    assert np.array_equal(params["lstm"]["bias_hh_l0"], neutral["lstm.bias_hh_l0"])
    assert np.array_equal(params["fc"]["kernel"], neutral["fc.weight"].T)
    assert np.array_equal(params["embedding"]["embedding"], neutral["embedding.weight"])


def test_neutral_checkpoint_round_trip_is_bitwise(tiny, tmp_path):
    params = to_flax(tiny.neutral)
    save_checkpoint(tmp_path / "ckpt", from_flax(params), tiny.cfg, tiny.data.vocab, tiny.data.tokenizer)
    ckpt = load_checkpoint(tmp_path / "ckpt", tiny.cfg)
    reloaded = to_flax(ckpt.params)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(reloaded)):
        assert np.array_equal(a, b)
    assert ckpt.vocab == tiny.data.vocab and ckpt.tokenizer == tiny.data.tokenizer

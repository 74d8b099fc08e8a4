"""Converting the neutral parameters into either framework and back loses nothing, bit for bit,
also through a neutral checkpoint on disk; and the Flax tree built is the one the JAX model expects."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.checkpoint import load_checkpoint, save_checkpoint
from common.params import Params
from jax_impl import convert
from parity_tests import report
from parity_tests.twins import jax_carry, flax_module, stacked_from_jax, torch_module
from torch_impl.classifier import model_from_config
from torch_impl.model import export_params, load_params


def assert_bitwise(check: str, original: Params, returned: Params, ordered: bool = True) -> None:
    """Same names (in the same order, where the converter promises state-dict order), float32, same shapes,
    same bytes (a conversion has nothing to round)."""
    if ordered:
        assert list(returned) == list(original), f"{check}: names or order differ"
    assert sorted(returned) == sorted(original), f"{check}: names differ"
    differing = 0
    for name, arr in original.items():
        back = returned[name]
        assert back.dtype == np.float32, f"{check}: {name} came back as {back.dtype}"
        assert back.shape == arr.shape, f"{check}: {name} came back with shape {back.shape}"
        differing += int(np.count_nonzero(arr.view(np.uint32) != back.view(np.uint32)))
    # Tolerance 0: a conversion is copies and transposes only, so every bit must survive.
    report.within(f"{check} (differing float32 words)", differing, 0)


def other_torch_model(seed_setup):
    """A PyTorch model holding other numbers (seed 1), so that loading into it has something to overwrite."""
    model = model_from_config(seed_setup.cfg.replace(seed=1), seed_setup.vocab_size)
    assert not np.array_equal(export_params(model)["fc.weight"], seed_setup.neutral["fc.weight"])
    return model


@pytest.fixture(scope="module")
def checkpoint_dir(seed_setup, tmp_path_factory):
    folder = tmp_path_factory.mktemp("neutral") / "ckpt"
    save_checkpoint(folder, seed_setup.neutral, seed_setup.cfg, seed_setup.left.vocab, seed_setup.left.tokenizer)
    return folder


def test_neutral_to_flax_and_back_is_bitwise(seed_setup):
    flax = convert.to_flax(seed_setup.neutral)
    assert_bitwise("convert: neutral -> Flax -> neutral", seed_setup.neutral, convert.from_flax(flax))


def test_neutral_to_torch_and_back_is_bitwise(seed_setup):
    model = other_torch_model(seed_setup)
    load_params(model, seed_setup.neutral)
    assert_bitwise("convert: neutral -> torch -> neutral", seed_setup.neutral, export_params(model))


def test_flax_tree_is_the_tree_the_jax_model_initialises(seed_setup):
    """to_flax must produce exactly the parameter tree (paths, shapes, dtypes) that model.init creates, or
    the bitwise round trip above would prove nothing about the model."""
    cfg = seed_setup.cfg
    model = flax_module(cfg, seed_setup.vocab_size)
    carry = tuple((jnp.zeros((2, cfg.hidden_dim)),) * 2 for _ in range(cfg.layers))
    expected = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((2, 3), jnp.int32), carry))["params"]
    built = convert.to_flax(seed_setup.neutral)

    def signature(tree):
        return {jax.tree_util.keystr(path): (tuple(leaf.shape), np.dtype(leaf.dtype))
                for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

    assert signature(built) == signature(expected)


def test_conversion_through_a_saved_checkpoint_is_bitwise(seed_setup, checkpoint_dir):
    loaded = load_checkpoint(checkpoint_dir).params
    # safetensors hands tensors back sorted by name: the order of a file's dict carries no meaning.
    assert_bitwise("checkpoint: save -> load", seed_setup.neutral, loaded, ordered=False)
    assert_bitwise("checkpoint: load -> Flax -> neutral", seed_setup.neutral,
                   convert.from_flax(convert.to_flax(loaded)))
    model = other_torch_model(seed_setup)
    load_params(model, loaded)
    assert_bitwise("checkpoint: load -> torch -> neutral", seed_setup.neutral, export_params(model))


def test_torch_export_to_flax_and_back_into_torch_is_bitwise(seed_setup):
    """The cross path a trained model takes: torch state dict → Flax → neutral → torch state dict."""
    model = torch_module(seed_setup.cfg, seed_setup.neutral, seed_setup.vocab_size)
    via_flax = convert.from_flax(convert.to_flax(export_params(model)))
    other = other_torch_model(seed_setup)
    load_params(other, via_flax)
    assert_bitwise("convert: torch -> Flax -> torch", seed_setup.neutral, export_params(other))


def test_a_carry_round_trips_between_the_twins_layouts():
    rng = np.random.default_rng(0)
    stacked = tuple(rng.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(2))  # (h, c), (L, B, H)
    carry = jax_carry(stacked)
    assert len(carry) == 3 and carry[1][0].shape == (4, 5)
    assert np.array_equal(carry[1][0], stacked[0][1]) and np.array_equal(carry[2][1], stacked[1][2])
    assert all(np.array_equal(a, b) for a, b in zip(stacked_from_jax(carry), stacked))

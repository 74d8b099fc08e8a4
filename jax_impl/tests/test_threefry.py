"""The written-out threefry rounds draw JAX's threefry bits: Random123's known answers, JAX's own hash over many
counters and keys, and the random bits, masks and uniforms that JAX's default keys draw."""
from functools import partial

import jax
import numpy as np
import pytest
from jax.extend import random as jex_random

from jax_impl import threefry

u32 = partial(np.array, dtype=np.uint32)


@pytest.mark.parametrize("key,count,expected", [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
])
def test_the_written_out_rounds_give_random123s_known_answers(key, count, expected):
    got = jax.jit(threefry._hash)(*u32(key), *u32(count))
    assert [int(v) for v in got] == list(expected)


def test_the_written_out_rounds_give_jaxs_hash_over_many_counters_and_keys():
    rng = np.random.default_rng(0)
    for _ in range(4):
        key, count = u32(rng.integers(0, 2**32, 2)), u32(rng.integers(0, 2**32, (2, 4096)))
        ours = jax.jit(threefry._hash)(key[0], key[1], count[0], count[1])
        jaxs = jex_random.threefry_2x32(key, count.ravel()).reshape(2, 4096)  # the hash of the pair (x1, x2)
        assert np.array_equal(np.stack(ours), jaxs)


DRAWS = {"bits": lambda key, shape: jax.random.bits(key, shape),
         "uint8 bits": lambda key, shape: jax.random.bits(key, shape, np.uint8),
         "dropout mask": lambda key, shape: jax.random.bernoulli(key, 0.5, shape),
         "uniform": lambda key, shape: jax.random.uniform(key, shape)}


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (4, 3, 8), (200, 50, 256)])
@pytest.mark.parametrize("draw", list(DRAWS))
def test_unrolled_keys_draw_the_bits_of_jaxs_default_keys(draw, shape):
    for seed, step in ((0, 0), (3, 1), (12345, 77), (2**31 - 1, 4000)):
        default = jax.random.fold_in(jax.random.key(seed), step)  # a step's dropout key, as the twin makes it
        unrolled = jax.random.fold_in(threefry.key(seed, "cpu"), step)
        drawn = [np.asarray(jax.jit(DRAWS[draw], static_argnums=1)(k, shape)) for k in (default, unrolled)]
        assert np.array_equal(*drawn), (seed, step)


def test_a_dropout_mask_is_a_real_mask():
    keep = jax.random.bernoulli(threefry.key(3, "cpu"), 0.5, (200, 50, 256))
    assert abs(np.asarray(keep).mean() - 0.5) < 0.001


def test_keys_use_the_written_out_rounds_only_on_the_cpu():
    assert jax.random.key_impl(threefry.key(0, "cpu")) == jax.random.key_impl(jax.random.key(0, impl=threefry.UNROLLED))
    assert jax.random.key_impl(threefry.key(0, "gpu")) == jax.random.key_impl(jax.random.key(0))

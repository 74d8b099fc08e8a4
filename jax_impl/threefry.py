"""JAX's threefry2x32 keys whose random bits hash with the 20 rounds written out rather than in a loop: the same bits,
through a PRNG implementation of its own (JAX's public ``jax.extend.random``), for the keys made with it only.

JAX lowers the threefry hash on the CPU as a loop of five passes, which XLA:CPU runs pass after pass over the whole
array; written out, the rounds fuse into one pass over it. Seeding, splitting and folding in are JAX's threefry's.

    UNROLLED                 # the implementation: jax.random.key(seed, impl=UNROLLED)
    key(seed, platform)      # JAX's default key's bits: UNROLLED on the CPU, JAX's own key elsewhere
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax import lax
from jax.extend import random as jex_random

_THREEFRY = jex_random.threefry_prng_impl
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _hash(k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Random123's threefry2x32 with 20 rounds: uint32 key words ``k1, k2`` (scalars), counters ``x1, x2`` (any shape,
    the same) → two uint32 arrays of that shape; JAX's own rounds, in its order."""
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = x1 ^ (lax.shift_left(x2, np.uint32(r)) | lax.shift_right_logical(x2, np.uint32(32 - r)))
        x1, x2 = x1 + ks[(i + 1) % 3], x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def _random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    """JAX's partitionable threefry random bits: the counters are the element's flat index (high, low words)."""
    size = math.prod(shape)
    if not jax.config.jax_threefry_partitionable or size >= 2**32 or bit_width == 64:
        return _THREEFRY.random_bits(key, bit_width, shape)  # JAX's own, for what the written-out rounds skip
    low = lax.iota(np.uint32, size).reshape(shape)
    bits1, bits2 = _hash(key[0], key[1], lax.full_like(low, 0), low)
    bits = bits1 ^ bits2
    return bits if bit_width == 32 else lax.convert_element_type(bits, np.dtype(f"uint{bit_width}"))


UNROLLED = jex_random.define_prng_impl(key_shape=(2,), seed=_THREEFRY.seed, split=_THREEFRY.split,
                                       random_bits=_random_bits, fold_in=_THREEFRY.fold_in,
                                       name="threefry2x32_unrolled", tag="fry_unrolled")


def unrolled(platform: str) -> bool:
    """Whether :func:`key` draws with the written-out rounds on ``platform``: on the CPU, where JAX loops, when JAX's
    default implementation is threefry."""
    return platform == "cpu" and jax.config.jax_default_prng_impl == "threefry2x32"


def key(seed: int, platform: str) -> jax.Array:
    """``jax.random.key(seed)``'s bits, drawn with the written-out rounds where :func:`unrolled` says."""
    return jax.random.key(seed, impl=UNROLLED if unrolled(platform) else None)

"""JAX's threefry lowered unrolled on the CPU draws the bits the rolled lowering draws: Random123's known answers, and
the rolled and unrolled rounds over many counters and keys, and a dropout mask as the model draws it."""
import subprocess
import sys
from functools import partial

import jax
import numpy as np
import pytest

from jax_impl import rng_lowering

threefry2x32 = pytest.importorskip("jax._src.random.threefry2x32", reason="this JAX keeps threefry elsewhere")
u32 = partial(np.array, dtype=np.uint32)


def test_the_unrolled_lowering_is_registered_for_the_cpu():
    assert rng_lowering.unroll_threefry_on_cpu() is True
    assert rng_lowering.unroll_threefry_on_cpu() is True  # idempotent


@pytest.mark.parametrize("key,count,expected", [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
])
def test_threefry_on_the_cpu_gives_random123s_known_answers(key, count, expected):
    rng_lowering.unroll_threefry_on_cpu()
    got = jax.jit(threefry2x32.threefry_2x32)(u32(key), u32(count))
    assert [int(v) for v in got] == list(expected)


def test_the_unrolled_rounds_give_the_rolled_rounds_bits():
    rng = np.random.default_rng(0)
    k1, k2 = u32(rng.integers(0, 2**32, 2))
    x1, x2 = u32(rng.integers(0, 2**32, 4096)), u32(rng.integers(0, 2**32, 4096))
    rolled, unrolled = (jax.jit(partial(threefry2x32._threefry2x32_lowering, use_rolled_loops=rolled))(k1, k2, x1, x2)
                        for rolled in (True, False))
    assert all(np.array_equal(a, b) for a, b in zip(rolled, unrolled))


MASK = ("import jax, numpy as np; keep = jax.jit(lambda key: jax.random.bernoulli(key, 0.5, (200, 50, 256)))("
        "jax.random.key(3)); print(np.packbits(np.asarray(keep)).tobytes().hex())")


def test_a_dropout_mask_is_the_one_jaxs_rolled_lowering_draws():
    # The seed's mask between the layers, drawn by a fresh process with JAX's own CPU lowering, and here unrolled.
    rolled = subprocess.run([sys.executable, "-c", MASK], capture_output=True, text=True, check=True).stdout.strip()
    rng_lowering.unroll_threefry_on_cpu()
    keep = jax.jit(lambda key: jax.random.bernoulli(key, 0.5, (200, 50, 256)))(jax.random.key(3))
    assert np.packbits(np.asarray(keep)).tobytes().hex() == rolled
    assert abs(np.asarray(keep).mean() - 0.5) < 0.001  # a real mask, not an empty one

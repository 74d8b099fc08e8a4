"""JAX's threefry random bits lowered unrolled on the CPU, as JAX lowers them on every other platform: the same bits,
faster.

On the CPU, JAX lowers its threefry2x32 hash as a loop of five passes (a smaller program, compiled sooner), and
XLA:CPU runs that loop pass after pass over the whole array, writing it out after each. Unrolled, XLA fuses the 20
rounds into one pass. The seed's dropout mask between the layers, (T, B, H) = (200, 50, 256), takes 20.2 ms rolled
and 4.1 ms unrolled (``python -m benchmarks.rng_cost``). The rounds are the same 32-bit additions, rotations and xors in
the same order, so the bits are the same (``test_rng_lowering``: against the rolled lowering and Random123's known
answers). The rule is JAX's own (its GPU and TPU lowering), reached through ``jax._src``: where a JAX release moves
it, the rolled lowering stays and :func:`unroll_threefry_on_cpu` says so.

    unroll_threefry_on_cpu() -> bool    # idempotent: True where the CPU lowers threefry unrolled from now on
"""
from __future__ import annotations

import functools


@functools.cache
def unroll_threefry_on_cpu() -> bool:
    """Registers JAX's unrolled threefry lowering for the CPU, for every function lowered from now on (a lowering
    rule is process-wide by nature); False, and nothing changed, where this JAX does not have it."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32
        rule, primitive = threefry2x32._threefry2x32_lowering_rule, threefry2x32.threefry2x32_p
    except (ImportError, AttributeError):
        return False
    mlir.register_lowering(primitive, rule, platform="cpu")
    return True

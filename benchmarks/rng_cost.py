"""What JAX's threefry costs on the CPU, rolled (JAX's default there) and unrolled (the JAX twin's,
``jax_impl.rng_lowering``): ``python -m benchmarks.rng_cost [--rounds N] [--batch B] [--steps T] [--hidden H]``.

One dropout mask as the model draws it between the layers, (T, B, H) at keep 0.5, applied to an input: the same
jitted function lowered twice, before and after the unrolled lowering is registered, the two run in turn in each round
(a fresh key each round). Each figure is a median over the rounds with a 95% percentile-bootstrap interval; the two
masks are checked bit for bit.
"""
import sys
import time

from common import interrupts

interrupts.exit_on_ctrl_c(__name__)  # first: Ctrl-C while the imports below load is one line and exit 130

import numpy as np  # noqa: E402

from jax_impl import xla_env  # noqa: E402

xla_env.configure()  # before JAX's backend starts

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.stats import median_ci  # noqa: E402
from common.config import Parser  # noqa: E402
from common.errors import cli_main  # noqa: E402
from jax_impl import rng_lowering  # noqa: E402

PROG = "python -m benchmarks.rng_cost"


def dropout(key, x):
    keep = jax.random.bernoulli(key, 0.5, x.shape)
    return jnp.where(keep, x / 0.5, 0.0)


def measure(rounds: int, shape: tuple[int, ...]) -> dict:
    """{"rolled": ..., "unrolled": ...} (median ms and interval), and whether the two drew the same masks."""
    x = jnp.ones(shape, jnp.float32)
    rolled = jax.jit(dropout).lower(jax.random.key(0), x).compile()
    if not rng_lowering.unroll_threefry_on_cpu():
        raise SystemExit("this JAX has no unrolled threefry lowering to register")
    unrolled = jax.jit(lambda key, x: dropout(key, x)).lower(jax.random.key(0), x).compile()  # lowered anew
    times, same = {"rolled": [], "unrolled": []}, True
    for r in range(rounds + 1):  # round 0 warms both up, untimed
        key, outs = jax.random.key(r), []
        for name, fn in (("rolled", rolled), ("unrolled", unrolled)):
            start = time.perf_counter()
            outs.append(jax.block_until_ready(fn(key, x)))
            if r:
                times[name].append(time.perf_counter() - start)
        same = same and bool(jnp.array_equal(*outs))
    rng = np.random.default_rng(0)
    return {**{k: median_ci(np.asarray(v), rng) for k, v in times.items()}, "same_bits": same}


@cli_main
def main(argv: list[str]) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    for flag, default in (("--rounds", 30), ("--batch", 50), ("--steps", 200), ("--hidden", 256)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args(argv)
    if min(args.rounds, args.batch, args.steps, args.hidden) < 1:
        parser.error("--rounds, --batch, --steps and --hidden must be positive")
    doc = measure(args.rounds, (args.steps, args.batch, args.hidden))
    print(f"dropout mask (T, B, H) = ({args.steps}, {args.batch}, {args.hidden}), {args.rounds} rounds; median ms "
          f"[95% interval]")
    for name in ("rolled", "unrolled"):
        print(f"  {name:9s} {doc[name]['ms']:7.2f} [{doc[name]['ci95_ms'][0]:.2f}–{doc[name]['ci95_ms'][1]:.2f}]")
    print(f"  same bits: {'yes' if doc['same_bits'] else 'NO'}")
    return 0 if doc["same_bits"] else 1


if __name__ == "__main__":
    interrupts.exit_process(main(sys.argv[1:]))

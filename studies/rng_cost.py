"""What JAX's threefry costs on the CPU, rolled (JAX's default there) and with its rounds written out (the JAX twin's
keys there, ``jax_impl.threefry``): ``python -m studies.rng_cost [--rounds N] [--batch B] [--steps T] [--hidden H]``.

One dropout mask as the model draws it between the layers, (T, B, H) at keep 0.5, applied to an input: one jitted
function, given a key of JAX's default implementation and one of ``jax_impl.threefry``'s, the two run in turn in each
round (a fresh seed each round). Each figure is a median over the rounds with a 95% percentile-bootstrap interval; the
two masks are checked bit for bit.
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.stats import median_ci
from common import interrupts
from common.config import Parser
from common.errors import cli_main
from jax_impl import threefry, xla_env

PROG = "python -m studies.rng_cost"


def dropout(key, x):
    keep = jax.random.bernoulli(key, 0.5, x.shape)
    return jnp.where(keep, x / 0.5, 0.0)


def measure(rounds: int, shape: tuple[int, ...]) -> dict:
    """{"rolled": ..., "unrolled": ...} (median ms and interval), and whether the two drew the same masks."""
    x, step = jnp.ones(shape, jnp.float32), jax.jit(dropout)
    keys = {"rolled": jax.random.key, "unrolled": lambda seed: threefry.key(seed, "cpu")}
    times, same = {name: [] for name in keys}, True
    for r in range(rounds + 1):  # round 0 compiles and warms both up, untimed
        outs = []
        for name, make_key in keys.items():
            key = make_key(r)
            start = time.perf_counter()
            outs.append(jax.block_until_ready(step(key, x)))
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
    xla_env.configure()  # XLA_FLAGS: read once, when the first backend starts
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

"""Both twins' training trajectories in float64, in a process of its own (JAX's x64 mode is process-global):

    python -m parity_tests.float64_run [--steps 50] [--modes "stateful (seed),padding right"]

prints one JSON object: for each mode the two loss lists and the dtypes each twin actually computed in.
``test_float64.py`` runs it; nothing else imports it.
"""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)  # before any JAX array exists

import json  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common.config import Parser, int_at_least  # noqa: E402
from common.data import prepare_data  # noqa: E402
from common.errors import cli_main  # noqa: E402
from common.params import init_params  # noqa: E402
from parity_tests.configs import FLOAT64_STEPS, TRAJECTORY_CFG, TRAJECTORY_MODES  # noqa: E402
from parity_tests.twins import make_twin, trajectory  # noqa: E402


def run(modes: list[str], steps: int) -> dict:
    torch.set_num_threads(1)
    base = TRAJECTORY_CFG.replace(dtype="float64")
    data = {padding: prepare_data(base.replace(padding=padding)) for padding in ("left", "right")}
    vocab_size = len(data["left"].vocab)
    neutral = init_params(vocab_size, base.embed_dim, base.hidden_dim, base.layers, seed=base.seed)
    out = {"jax_x64": bool(jax.config.jax_enable_x64), "modes": {}}
    for mode in modes:
        cfg = base.replace(**TRAJECTORY_MODES[mode])
        losses_t, state_t = trajectory(make_twin("torch", cfg, vocab_size), cfg, data[cfg.padding], neutral, steps)
        losses_j, state_j = trajectory(make_twin("jax", cfg, vocab_size), cfg, data[cfg.padding], neutral, steps)
        out["modes"][mode] = {"torch": losses_t, "jax": losses_j,  # and the dtypes the trained weights are in
                              "torch_dtype": str(state_t.model.fc.weight.dtype),
                              "jax_dtype": str(np.dtype(jax.tree_util.tree_leaves(state_j.params)[0].dtype))}
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m parity_tests.float64_run", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int_at_least(1), default=FLOAT64_STEPS, help="training steps per trajectory")
    parser.add_argument("--modes", default=",".join(TRAJECTORY_MODES), help="comma list of trajectory modes")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [mode for mode in modes if mode not in TRAJECTORY_MODES]
    if unknown:
        parser.error(f"--modes: unknown mode {unknown[0]!r} (modes: {', '.join(TRAJECTORY_MODES)})")
    json.dump(run(modes, args.steps), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where XLA's time goes in one LSTM layer's recurrence, beside PyTorch's: ``python -m studies.loop_cost
[--rounds N] [--batch B] [--steps T] [--hidden H] [--input D] [--out FILE.json [--overwrite]]``.

Forward only (inference), float32, full-precision matmuls, one process: each piece below runs once per round, the
pieces interleaved, so that the differences are paired by round. Every figure is a median over the rounds with a 95%
percentile-bootstrap interval (the rounds resampled; a difference is resampled as per-round differences).

XLA pieces (each jitted; T steps of a ``lax.scan`` unless said):
- ``dots``: the recurrent matmul alone, (B, H)·(H, 4H) each step, its output feeding the next;
- ``gate math``: the cell's activations and state update from given gates, no matmul;
- ``gate math at once``: the same arithmetic over all T steps in one elementwise pass, no loop;
- ``empty loop``: a loop that only reads its step's gate row and adds it to the carry;
- ``fused recurrence``: the model's kernel (``jax_impl.recurrences.fused``), matmul and gate math in one loop;
- ``projection``: the layer's input projection, one (T·B, D)·(D, 4H) GEMM, as the model computes it;
- ``onednn`` (where built): oneDNN's LSTM primitive through XLA's FFI, the input projection included;
- ``kernel`` (where built): our recurrence kernel through XLA's FFI (``--lstm-impl kernel``), from given gates as
  ``fused recurrence``.
PyTorch pieces (eager): ``dots`` (the same chain of ``torch.mm``), ``nn.LSTM`` (oneDNN, the input projection
included) and ``projection`` (that input projection alone: one (T·B, D)·(D, 4H) GEMM).
"""
import json
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from benchmarks.stats import median_ci
from tools.views import loop_cost_lines
from common import interrupts
from common.config import Parser
from common.errors import ConfigError, cli_main
from common.memory import available_bytes, human
from jax_impl import xla_env
from jax_impl.recurrences import fused, kernel, native, onednn
from jax_impl.numerics import PRECISION, dot

PROG = "python -m studies.loop_cost"
# What a measurement holds at once, in float32 values: per step and batch row (T·B of them), arrays the size of the
# gates (4H: the given gates, both frameworks' input projections, the gate math's temporaries; measured, the peak
# resident memory grew by four gates' arrays from T·B·4H = 10^7 to 2·10^8) and the input, JAX's and PyTorch's (D
# each); and the layer's weights, 4H·(H + D): JAX's, nn.LSTM's and its transposed copies.
GATE_ARRAYS, INPUT_ARRAYS, WEIGHT_COPIES = 5, 2, 3
# A pause after each framework's pieces: OpenMP's threads spin-wait for work after PyTorch's ops, which would take
# the cores from XLA's pieces that follow.
SETTLE_S = 0.05


def jax_pieces(b: int, t: int, h: int, d: int) -> dict[str, Callable[[], object]]:
    """The XLA pieces at (B, T, H, D), each a no-argument call that returns what to wait for."""
    k = iter(jax.random.split(jax.random.PRNGKey(0), 6))
    gates = jax.random.normal(next(k), (t, b, 4 * h), jnp.float32)
    x = jax.random.normal(next(k), (t, b, d), jnp.float32)
    w_hh, w_ih = (0.06 * jax.random.normal(next(k), shape, jnp.float32) for shape in ((4 * h, h), (4 * h, d)))
    bias = jnp.zeros((4 * h,), jnp.float32)
    zeros = jnp.zeros((b, h), jnp.float32)

    def cell(z, c):  # the fused recurrence's arithmetic: one tanh per element for every gate
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c = (0.5 * jnp.tanh(0.5 * f) + 0.5) * c + (0.5 * jnp.tanh(0.5 * i) + 0.5) * jnp.tanh(g)
        return (0.5 * jnp.tanh(0.5 * o) + 0.5) * jnp.tanh(c), c

    @jax.jit
    def dots(h0, w):
        return lax.scan(lambda hh, _: (dot(hh, w.T, PRECISION)[:, :h], None), h0, None, length=t)[0]

    @jax.jit
    def gate_math(z):
        return lax.scan(lambda hc, zt: (cell(zt, hc[1]), None), (zeros, zeros), z)[0]

    @jax.jit
    def gate_math_at_once(z):
        return cell(z, jnp.broadcast_to(zeros, z.shape[:2] + (h,)))

    @jax.jit
    def empty_loop(z):
        return lax.scan(lambda hh, zt: (hh + zt[:, :h], None), zeros, z)[0]

    @jax.jit
    def projection(x, w):
        return fused._project(x, w, bias, bias, PRECISION)

    @jax.jit
    def fused_recurrence(z, w):  # not `fused`: that is the module, which projection() reads too
        return fused._recurrence(z, w, zeros, zeros, None, PRECISION)[1]  # the model's layer kernel

    pieces = {"xla: dots": lambda: dots(zeros, w_hh), "xla: gate math": lambda: gate_math(gates),
              "xla: gate math at once": lambda: gate_math_at_once(gates), "xla: empty loop": lambda: empty_loop(gates),
              "xla: fused recurrence": lambda: fused_recurrence(gates, w_hh),
              "xla: projection": lambda: projection(x, w_ih)}
    if native.unavailable(onednn.NAME) is None:
        layer = jax.jit(onednn.lstm_call)
        pieces["xla: onednn (FFI)"] = lambda: layer(x, w_ih, w_hh, bias, bias, zeros, zeros)[1]
    if native.unavailable(kernel.NAME) is None:
        ours = jax.jit(lambda z, w: kernel.gates_layer(z, w, zeros, zeros)[1])
        pieces["xla: kernel (FFI)"] = lambda: ours(gates, w_hh)
    return pieces


def torch_pieces(b: int, t: int, h: int, d: int) -> dict[str, Callable[[], object]]:
    gen = torch.Generator().manual_seed(0)
    lstm = torch.nn.LSTM(d, h)
    x = torch.randn(t, b, d, generator=gen)
    w_hh_t, w_ih_t = lstm.weight_hh_l0.detach().T.contiguous(), lstm.weight_ih_l0.detach().T.contiguous()

    def dots():
        hh = torch.zeros(b, h)
        for _ in range(t):
            hh = torch.mm(hh, w_hh_t)[:, :h]
        return hh

    return {"torch: dots": dots, "torch: nn.LSTM": lambda: lstm(x)[1],
            "torch: projection": lambda: torch.addmm(lstm.bias_ih_l0, x.reshape(t * b, d), w_ih_t)}


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


# Differences of pieces (paired by round): what each says about the loop.
DIFFERENCES = {
    "the loop's cost to the gate math (in a loop − at once)": ("xla: gate math", "xla: gate math at once"),
    "fused recurrence beyond its dots": ("xla: fused recurrence", "xla: dots"),
    "fused recurrence beyond dots + gate math at once": ("xla: fused recurrence", "xla: dots",
                                                         "xla: gate math at once"),
    "XLA's layer (projection + fused recurrence) − nn.LSTM": ("xla: fused recurrence", "-xla: projection",
                                                              "torch: nn.LSTM"),
    "XLA's projection − PyTorch's": ("xla: projection", "torch: projection"),
    "XLA's dots − eager PyTorch's dots": ("xla: dots", "torch: dots"),
}


def difference(seconds: dict[str, np.ndarray], terms: tuple[str, ...]) -> np.ndarray:
    """The first term less the others (a leading ``-`` adds that term back), per round."""
    out = seconds[terms[0]].copy()
    for term in terms[1:]:
        out = out + seconds[term[1:]] if term.startswith("-") else out - seconds[term]
    return out


def measure(rounds: int, b: int, t: int, h: int, d: int) -> dict:
    pieces = {**jax_pieces(b, t, h, d), **torch_pieces(b, t, h, d)}
    with torch.no_grad():
        for fn in pieces.values():  # compile and warm up
            timed(fn), timed(fn)
        seconds: dict[str, list[float]] = {name: [] for name in pieces}
        groups = [[n for n in pieces if n.startswith(prefix)] for prefix in ("xla", "torch")]
        for r in range(rounds):  # each round rotates the order within each framework and alternates the two
            for group in groups[r % 2:] + groups[:r % 2]:
                for name in group[r % len(group):] + group[:r % len(group)]:
                    seconds[name].append(timed(pieces[name]))
                time.sleep(SETTLE_S)
    arrays = {k: np.asarray(v) for k, v in seconds.items()}
    rng = np.random.default_rng(0)
    flop = 2 * b * h * 4 * h * t
    out = {"shape": {"batch": b, "steps": t, "hidden": h, "input": d}, "rounds": rounds,
           "torch_threads": torch.get_num_threads(),
           "pieces": {k: median_ci(v, rng) for k, v in arrays.items()},
           "differences": {name: median_ci(difference(arrays, terms), rng) for name, terms in DIFFERENCES.items()
                           if all(t.lstrip("-") in arrays for t in terms)}}
    for name in ("xla: dots", "torch: dots"):
        out["pieces"][name]["gflop_s"] = flop / (out["pieces"][name]["ms"] * 1e-3) / 1e9
    return out


def needed_bytes(b: int, t: int, h: int, d: int) -> int:
    """About the most memory a measurement at (B, T, H, D) holds at once: :data:`GATE_ARRAYS` and the rest."""
    return 4 * (t * b * (GATE_ARRAYS * 4 * h + INPUT_ARRAYS * d) + WEIGHT_COPIES * 4 * h * (h + d))


def check_fits(b: int, t: int, h: int, d: int) -> None:
    """Refuse, as one :class:`ConfigError`, sizes whose arrays would not fit in the memory this process can have
    (:func:`common.memory.available_bytes`): beyond it PyTorch's allocator raises and XLA aborts the process."""
    need, have = needed_bytes(b, t, h, d), available_bytes()
    if need > have:
        raise ConfigError(f"--batch {b}, --steps {t}, --hidden {h} and --input {d} need about {human(need)} of memory "
                          f"(the gates, inputs and projections of T·B steps in both frameworks, and the weights), more "
                          f"than the {human(have)} this process can have; make the largest of them smaller")


def render(doc: dict) -> str:
    """The report of a measurement, in the lines the docs quote it by (:func:`tools.views.loop_cost_lines`)."""
    return "\n".join(loop_cost_lines(doc))


@cli_main
def main(argv: list[str]) -> int:
    from common.files import Output, atomic_file, check_outputs

    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    for flag, default in (("--rounds", 15), ("--batch", 50), ("--steps", 200), ("--hidden", 256), ("--input", 256)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    args = parser.parse_args(argv)
    xla_env.configure()  # XLA_FLAGS: read once, when the first backend starts
    if min(args.rounds, args.batch, args.steps, args.hidden, args.input) < 1:
        parser.error("--rounds, --batch, --steps, --hidden and --input must be positive")
    check_fits(args.batch, args.steps, args.hidden, args.input)
    if args.out:  # before the minutes of measuring
        check_outputs([Output("--out", args.out, directory=False, contents="the figures")], args.overwrite)
    doc = measure(args.rounds, args.batch, args.steps, args.hidden, args.input)
    print(render(doc))
    if args.out:
        atomic_file(args.out, lambda tmp: tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8"))
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main(sys.argv[1:]))

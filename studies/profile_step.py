"""Where the JAX twin's training step spends its time, op by op: ``python -m studies.profile_step [--steps N]
[Config flags, e.g. --no-embed-fold]``.

Builds the twin as ``jax_impl.train`` does, warms it up, traces ``--steps`` training steps with ``jax.profiler``
(Perfetto's trace, read back here: no TensorBoard needed) and prints the milliseconds per step of each compiled op
(XLA:CPU's fusions and library calls: ``ynn_fusion`` is a matmul on YNNPACK), its calls per step, and the share of
the step. Ops of one step may run side by side on the CPU's threads, so the column can sum to more than the step.
"""
import gzip
import itertools
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import jax

from common import interrupts
from common.config import (Parser, config_from_namespace, field_names, int_at_least, make_parser,
                           parse_with_workload)
from common.errors import cli_main
from common.loop import load_run, train_steps
from jax_impl import xla_env
from jax_impl.train import twin_maker

PROG = "python -m studies.profile_step"
# Host-side frames and waits that enclose the ops rather than being ops.
ENCLOSING = ("ThunkExecutor", "PjitFunction", "PjRt", "$", "np.asarray", "SlinkyThreadPool", "Execute")
WARMUP_STEPS = 3  # compile and warm up, untraced
# Config flags this command does not act on (it runs --steps steps, logs nothing and writes no file), refused as
# unknown arguments rather than accepted and ignored. --init-from stays: the steps run from its weights and vocabulary.
NOT_HONOURED = ("epochs", "max_steps", "log_every", "progress",
                *(name for name in field_names("files") if name != "init_from"))


def build_parser() -> Parser:
    parser = make_parser(PROG, __doc__.split("\n\n")[0], exclude=NOT_HONOURED)
    parser.add_argument_group("profile").add_argument(
        "--steps", type=int_at_least(1), default=3,
        help=f"training steps traced, after {WARMUP_STEPS} untraced ones that compile and warm up")
    return parser


@cli_main
def main(argv: list[str] | None = None) -> int:
    ns = parse_with_workload(build_parser(), argv)  # --workload lm: the language model's defaults
    xla_env.configure()  # XLA_FLAGS: read once, when the first backend starts
    cfg, data, params = load_run(config_from_namespace(ns))  # as jax_impl.train loads them
    steps = ns.steps
    with twin_maker(cfg) as make_twin, tempfile.TemporaryDirectory() as trace:
        twin = make_twin(cfg, len(data.vocab))
        run = train_steps(twin, twin.init_state(params), data.train, cfg)
        for _ in itertools.islice(run, WARMUP_STEPS):
            pass
        jax.profiler.start_trace(trace, create_perfetto_trace=True)
        start = time.perf_counter()
        for _ in itertools.islice(run, steps):
            pass
        wall_ms = (time.perf_counter() - start) / steps * 1e3
        jax.profiler.stop_trace()
        events = json.load(gzip.open(next(Path(trace).rglob("*.trace.json.gz"))))["traceEvents"]
    total, calls = Counter(), Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(ENCLOSING):
            total[e["name"]] += e["dur"] / 1e3 / steps
            calls[e["name"]] += 1 / steps
    length = f"bptt {cfg.bptt}, V {len(data.vocab)}" if cfg.workload == "lm" else f"T {cfg.seq_len}"
    print(f"JAX training step ({twin.record['lstm_impl']}, B {cfg.batch_size}, {length}, H {cfg.hidden_dim}): "
          f"{wall_ms:.1f} ms per step over {steps} traced steps; ops above 1% of it:")
    print(f"{'ms/step':>9}  {'calls':>6}  {'share':>6}  op")
    for name, ms in total.most_common():
        if ms >= 0.01 * wall_ms:
            print(f"{ms:9.1f}  {calls[name]:6.0f}  {ms / wall_ms:6.1%}  {name}")
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main(sys.argv[1:]))

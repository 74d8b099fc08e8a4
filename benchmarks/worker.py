"""A persistent benchmark worker, ``python -m benchmarks.worker torch|jax``: one per variant (per rank under DDP).

One JSON request per line on stdin, one ``@@ {json}`` answer per line on stdout: ``load`` (the data and the twin),
``setup`` (compile, first step, warm-up, provenance; the NNX twin's graph traversal apart), ``steps`` (time ``n``
steps of one kind), ``parity`` (losses with dropout 0), ``gemm`` (the float32 matmul rate), ``train`` (convergence
mode: the trainer's whole run), ``quit``. The steps are the twins' own ``train_step`` and ``eval_step``, each ending
in the host sync the trainers do, on the real batches of either workload (:mod:`common.workloads`: the classifier's
texts, the language model's windows, its evaluation carry going on from window to window).
"""
import itertools
import json
import os
import resource
import sys
import time
import traceback
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from benchmarks.processes import REPLY_TAG
from benchmarks.results import LM_PARITY_LR
from benchmarks.sides import JaxSide, NnxSide, TorchSide, gemm_gflop_s
from common import interrupts
from common.batches import mean_distinct_tokens
from common.config import Config
from common.errors import UnsupportedError, UserError, cli_main
from common.loop import load_run, train_steps
from common.workloads import workload_of


def is_full(batch: Any, cfg: Config) -> bool:
    """Whether an evaluation batch has the shape most of them have: --batch-size texts (the classifier), --bptt rows
    (the LM's window; the last of a split can be shorter)."""
    return batch.inputs.shape[0] == cfg.bptt if cfg.workload == "lm" else batch.size == cfg.batch_size


def side_class(framework: str, cfg: Config) -> type:
    """The framework's side of a worker: torch's, JAX's, or for the JAX twin written in Flax NNX, NNX's."""
    if framework == "torch":
        return TorchSide
    return NnxSide if cfg.flax_api == "nnx" else JaxSide


def reset_peak_rss() -> None:
    """Start the process's peak resident memory afresh where Linux allows it (``/proc/self/clear_refs``)."""
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


def peak_rss_mb() -> float:
    """The process's peak resident memory, MB: since :func:`reset_peak_rss` (``VmHWM``), else since it started."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024  # kB
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class PartsTimed:
    """A twin whose ``train_step`` times its parts (its ``train_step_parts``, on the framework side's clock) while
    ``timing`` is set, so that the training steps of every round, whole or in parts, are one trajectory through
    ``train_steps``."""

    def __init__(self, twin, side):
        self.twin, self.side, self.timing, self.parts = twin, side, False, None

    def __getattr__(self, name: str):
        return getattr(self.twin, name)

    def train_step(self, state, carry, batch):
        if not self.timing:
            return self.twin.train_step(state, carry, batch)
        state, carry, loss, self.parts = self.twin.train_step_parts(state, carry, batch, self.side.clock())
        return state, carry, loss


class Bench:
    """One variant of one twin, built by its trainer's own ``twin_maker`` and stepped through the Twin protocol: its
    training steps by :func:`common.loop.train_steps` (the loop's order and carry policy), on the real batches."""

    def __init__(self, framework: str):
        self.framework, self.side, self.make_twin, self.exits = framework, None, None, ExitStack()

    def build(self, cfg: Config):
        """``(twin, state, its training steps)``: a twin made as its trainer makes it (the trainer's set-up entered
        once), its state from the shared initial weights."""
        twin = PartsTimed(self.make_twin(cfg, len(self.data.vocab)), self.side)
        state = twin.init_state(self.params)
        return twin, state, train_steps(twin, state, self.data.train, cfg)

    def load(self, msg: dict) -> dict:
        """The data and the twin, nothing timed: the harness has the workers load side by side (its load lanes)."""
        cfg = Config(**msg["config"])
        # The trainer's set-up first, as the trainers enter it: a variant it refuses is refused before the corpus
        # is read (the bench passes no --init-from, so loading cannot change the Config it was given).
        self.make_twin = self.exits.enter_context(self.side.trainer.twin_maker(cfg))
        self.cfg, self.data, self.params = load_run(cfg)  # as the trainers load them
        cfg, data, workload = self.cfg, self.data, workload_of(self.cfg)
        # One shape to time: the full evaluation batches (else the first training batch).
        full = [b for b in workload.eval_batches(data.val, cfg) if is_full(b, cfg)]
        self.eval = full or list(itertools.islice(workload.train_batches(data.train, cfg, 0, 0), 1))
        self.twin, self.state, self.train = self.build(cfg)  # evaluation reads the latest state
        self.first = next(workload.train_batches(data.train, cfg, 0, 0))  # the shapes to compile for
        # the embedding rows a batch reads, for the FLOPs of a fold over those rows only (benchmarks.flops)
        self.distinct_tokens = None if cfg.workload == "lm" else {
            "train": mean_distinct_tokens(workload.train_batches(data.train, cfg, 0, 0)),
            "eval": mean_distinct_tokens(self.eval)}
        self.side.adopt(self.twin, cfg)
        self.evals = self.eval_stream()  # the evaluation batches, round after round
        if msg.get("parts"):  # untimed and unreported
            self.side.compile_parts(self.twin, self.state, self.first)
        for dtype in msg.get("parity_dtypes", []):  # into the compile cache, which the parity run then reads
            twin, state, _ = self.build(self.parity_config(dtype))
            self.side.compile(twin, state, "train", self.first)
        return {"loaded": True}

    def eval_stream(self) -> Iterator[Any]:
        """The evaluation batches over and over, as :func:`common.loop.evaluate` steps through a split: a zero
        ``eval_carry`` at each pass's start, then the one the previous step returned (the LM's carry goes on from
        window to window; the classifier's passes through unused)."""
        while True:
            self.eval_carry = self.twin.init_carry(self.eval[0].size)  # the LM's 10 columns, the classifier's B
            yield from self.eval

    def setup(self, msg: dict) -> dict:
        """Compile, the first step, warm-up and provenance, each step kind in turn (one worker at a time); after the
        training step's, what the framework's machinery costs a step measured apart (:meth:`NnxSide.overheads`)."""
        reset_peak_rss()  # the peaks below are the set-up's and the steps', not the load's compiles
        out = {"vocab_size": len(self.data.vocab), "info": self.side.info(), "phases": {},
               "distinct_tokens": self.distinct_tokens,
               "record": {**{k: v for k, v in self.twin.record.items() if isinstance(v, (str, int, float, bool))},
                          **self.side.trainers_default(self.twin, self.cfg)}}
        for kind in msg["phases"]:  # inference first: its peak memory is read before training raises it
            if kind == "parts":  # compiled, and stepped once, while loading: the warm-up
                self.steps("parts", msg["warmup"])
                continue
            phase = self.side.compile(self.twin, self.state, kind, self.eval[0] if kind == "eval" else self.first)
            hlo = phase.pop("hlo", None)
            phase["first_step_s"] = self.steps(kind, 1)[0]
            if self.cfg.torch_compile:
                phase["compile_s"] = phase["first_step_s"]  # Dynamo and Inductor work inside the first call
            self.steps(kind, msg["warmup"])
            out["phases"][kind] = {**phase, "peak_device_mb": self.side.peak_device_mb(),
                                   "peak_rss_mb": peak_rss_mb()}
            if kind == "train":  # what ran the LSTM, read once it is warm, and the float rules it ran under
                out["provenance"] = {**self.side.provenance(self, hlo), "precision": out["info"]["precision"],
                                     **{k: self.twin.record[k] for k in ("flush_denormal", "lstm_kernel", "bfloat16")
                                        if k in self.twin.record}}  # what ran in bfloat16, by the twin's rules
                if self.cfg.torch_compile and "dynamo:lstm" not in out["provenance"]["kernels"]:
                    return {**out, "not_applicable": out["provenance"]["dynamo"]["reason"]}
                if msg.get("overheads"):  # the first worker's: the row reports its set-up
                    out["phases"]["train"].update(self.side.overheads(self))  # on a state of its own
        return out

    def steps(self, kind: str, n: int) -> list:
        """Seconds of each of ``n`` steps (a GPU synchronised before the clock stops); ``parts``: training steps,
        each as the seconds of its parts."""
        out = []
        for _ in range(n):
            batch = next(self.evals) if kind == "eval" else None  # (a pass's zero carry made before the clock starts)
            start = time.perf_counter()
            if kind == "eval":
                self.eval_carry, sums = self.twin.eval_step(self.state, self.eval_carry, batch)
                float(sums[0])  # what evaluate() reads
            else:
                self.twin.timing = kind == "parts"
                self.state = next(self.train).state
            self.side.sync()
            out.append(self.twin.parts if kind == "parts" else time.perf_counter() - start)
        return out

    def parity(self, n: int, dtype: str | None = None) -> list[float]:
        """Losses of ``n`` training steps from the shared weights with dropout 0, in a twin of their own (in ``dtype``
        if given: the baseline's float32 reference of a bfloat16 run); the language model's at its parity learning
        rate, :data:`benchmarks.results.LM_PARITY_LR`."""
        _, _, steps = self.build(self.parity_config(dtype))
        return [s.loss for s in itertools.islice(steps, n)]

    def parity_config(self, dtype: str | None) -> Config:
        """The Config of the parity run in ``dtype`` (None: the run's): dropout 0; the language model's learning rate
        :data:`benchmarks.results.LM_PARITY_LR`."""
        off = ({"dropout": 0.0, "lr": LM_PARITY_LR} if self.cfg.workload == "lm"
               else {"dropout": 0.0, "fc_dropout": 0.0})  # each workload's own fields
        return self.cfg.replace(**off, dtype=dtype or self.cfg.dtype)

    def handle(self, msg: dict) -> dict:
        op, n = msg["op"], msg.get("n")
        if op in ("load", "train") and self.side is None:  # the first request: the framework's threads and dtype mode
            cfg = Config(**msg["config"])  # set before anything runs, as a trainer's main() sets them
            self.side = side_class(self.framework, cfg)(msg["threads"])
            self.side.use_dtype(cfg.dtype)
        if op == "load":
            return self.load(msg)
        if op == "setup":
            return self.setup(msg)
        if op == "train":  # convergence mode: the trainer's whole run
            self.side.trainer.train(Config(**msg["config"]))
            return {"trained": True}
        if op == "steps":
            return {"step_s": self.steps(msg["kind"], n)}  # parts: a dict of seconds per step
        if op == "parity":
            return {"losses": self.parity(n, msg.get("dtype"))}
        if op == "gemm":
            device = self.side.info()["device"]
            rates = {self.framework: self.side.gemm(n)}
            if device == "cpu":  # numpy's BLAS as a third opinion of the CPU's peak
                a, b = (np.random.default_rng(i).standard_normal((n, n), dtype=np.float32) for i in (0, 1))
                rates["numpy"] = {"gflop_s": gemm_gflop_s(np.matmul, a, b), "precision": "float32"}
            return {"gemm": {library: {**rate, "n": n, "device": device} for library, rate in rates.items()}}
        return {}  # quit


def main(framework: str) -> int:
    if hasattr(os, "sched_setaffinity") and os.environ.get("BENCH_THREADS"):
        # XLA sizes its CPU pool from the affinity: pin before JAX is imported.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:int(os.environ["BENCH_THREADS"])])
    bench, replies = Bench(framework), sys.stdout
    sys.stdout = sys.stderr  # what libraries print must not mix with the replies
    with bench.exits:  # a torch rank leaves its process group at the end
        for line in sys.stdin:
            msg = json.loads(line)
            try:
                reply = bench.handle(msg)
            except UnsupportedError as err:  # the library cannot compute this variant: a result, with its reason
                reply = {"not_applicable": str(err)}
            except UserError as err:
                reply = {"user_error": str(err)}
            except Exception as err:  # a variant that fails is a result, not a crash
                first = (str(err).strip().splitlines() or [""])[0]
                reply = {"error": f"{type(err).__name__}: {first}", "traceback": traceback.format_exc()[-3000:]}
            print(REPLY_TAG + json.dumps(reply), file=replies, flush=True)
            if msg["op"] == "quit":
                break
    return 0


if __name__ == "__main__":
    interrupts.exit_process(cli_main(main)(sys.argv[1]))

"""A persistent benchmark worker, ``python -m benchmarks.worker torch|jax``: one per variant (per rank under DDP).

One JSON request per line on stdin, one ``@@ {json}`` answer per line on stdout: ``load`` (the data and the twin),
``setup`` (compile, first step, warm-up, provenance), ``steps`` (time ``n``
steps of one kind), ``parity`` (losses with dropout 0), ``gemm`` (the float32 matmul rate), ``train`` (convergence
mode: the trainer's whole run), ``quit``. The steps are the twins' own ``train_step`` and ``eval_step``, each ending
in the host sync the trainers do, on the real batches.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import resource
import sys
import time
import traceback
from collections import Counter
from contextlib import ExitStack

import numpy as np

from benchmarks.harness import REPLY_TAG, usable_cpus
from common.batches import batches
from common.config import Config
from common.data import prepare_data
from common.errors import UnsupportedError, UserError
from common.loop import train_steps
from common.params import init_params


def gemm_gflop_s(matmul, a, b, sync=lambda x: x, repeats: int = 8) -> float:
    """The one peak timer: best of ``repeats`` float32 ``(n, n) @ (n, n)`` products, GFLOP/s."""
    sync(matmul(a, b))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        sync(matmul(a, b))
        best = min(best, time.perf_counter() - start)
    return 2 * a.shape[0] ** 3 / best / 1e9


class TorchSide:
    """What timing the PyTorch twin needs beyond the twin: threads, the GPU sync, the device, the GEMM rate."""

    def __init__(self, threads: int):
        import torch
        from torch_impl import train
        torch.set_num_threads(threads)
        self.torch, self.trainer = torch, train

    def adopt(self, twin, cfg: Config) -> None:
        self.device = self.torch.device(twin.record["device"])

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def info(self) -> dict:
        t, gpu = self.torch, self.device.type == "cuda"
        return {"device": "cuda" if gpu else "cpu",
                "device_name": t.cuda.get_device_name(self.device) if gpu else "cpu",
                "threads": {"torch_intra_op": t.get_num_threads(), "torch_inter_op": t.get_num_interop_threads()},
                "precision": {"float32_matmul_precision": t.get_float32_matmul_precision(),
                              "cuda_matmul_allow_tf32": t.backends.cuda.matmul.allow_tf32,
                              "cudnn_allow_tf32": t.backends.cudnn.allow_tf32}}

    def peak_device_mb(self) -> float | None:
        return self.torch.cuda.max_memory_allocated() / 2**20 if self.device.type == "cuda" else None

    def gemm(self, n: int) -> dict:
        """The float32 GEMM rate at the precision the twin runs (TF32 only under --allow-tf32, on a GPU)."""
        gen = self.torch.Generator().manual_seed(0)
        a, b = (self.torch.randn(n, n, generator=gen).to(self.device) for _ in range(2))
        tf32 = self.device.type == "cuda" and self.torch.backends.cuda.matmul.allow_tf32
        return {"gflop_s": gemm_gflop_s(self.torch.matmul, a, b, lambda x: self.sync()),
                "precision": "tf32" if tf32 else "float32"}

    def provenance(self, bench, hlo: str | None) -> dict:
        """The ops that ran the LSTM in one training step (``torch.profiler``) and the dtypes they computed in
        (:func:`lstm_op_dtypes`), the oneDNN and cuDNN versions, and under --torch-compile what Dynamo made of the
        first call (``dynamo:lstm`` among the kernels when it compiled the LSTM)."""
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with profile(activities=activities, record_shapes=True) as prof:
            bench.steps("train", 1)
        events = [e for e in prof.events() if not e.name.startswith("autograd::engine")]
        ops = sorted({e.name for e in events if re.search("rnn|lstm", e.name, re.I)})
        onednn = re.search(r"(?:MKL-DNN|oneDNN) v(\S+)", self.torch.__config__.show())
        out = {"kernels": ops, "kernel_dtypes": lstm_op_dtypes(events), "onednn": onednn and onednn[1],
               "cudnn": self.torch.backends.cudnn.version() if self.device.type == "cuda" else None}
        if bench.cfg.torch_compile:
            out["dynamo"] = dynamo = self.compile_counters()
            if dynamo["unique_graphs"] and not any(re.search("lstm|rnn", r, re.I) for r in dynamo["unimplemented"]):
                out["kernels"].append("dynamo:lstm")
        return out

    def compile_counters(self) -> dict:
        """What Dynamo did: frames traced, graphs, graph breaks, what it refused (each reason's first line), and
        the first refusal as ``reason``."""
        from torch._dynamo.utils import counters
        refused: Counter = Counter()
        for reason, n in counters.get("unimplemented", {}).items():
            refused[(reason.strip().splitlines() or ["?"])[0][:160]] += n
        return {"frames_total": counters["frames"].get("total", 0), "frames_ok": counters["frames"].get("ok", 0),
                "unique_graphs": counters["stats"].get("unique_graphs", 0),
                "graph_breaks": sum(counters["graph_break"].values()), "unimplemented": dict(refused),
                "reason": "Dynamo: " + (next(iter(refused), None) or "no graph compiled")}


DTYPE_NAMES = {"float": "f32", "double": "f64", "c10::BFloat16": "bf16", "c10::Half": "f16"}


def lstm_op_dtypes(events) -> dict[str, list[str]]:
    """Each LSTM op of a profiled step (an RNN op, or a matmul that ``aten::lstm`` runs itself: its ATen cell) → the
    dtypes of the floating-point tensors it received, in its innermost call (autocast calls an op again, on the cast
    inputs)."""
    def inside_lstm(e) -> bool:
        while e is not None:
            if e.name == "aten::lstm":
                return True
            e = e.cpu_parent
        return False

    out: dict[str, set[str]] = {}
    for e in events:
        own = re.search("rnn|lstm", e.name, re.I) and e.name != "aten::lstm"
        cell = e.name in ("aten::mm", "aten::addmm") and inside_lstm(e)
        if (own or cell) and not any(c.name == e.name for c in e.cpu_children):
            out.setdefault(e.name, set()).update(DTYPE_NAMES[d] for d in e.input_dtypes if d in DTYPE_NAMES)
    return {k: sorted(v) for k, v in sorted(out.items())}


class JaxSide:
    """The same for the JAX twin."""

    def __init__(self, threads: int):
        from jax_impl import xla_env
        xla_env.configure()  # XLA settings that must precede the backend's start
        import jax
        from jax_impl import step, train
        self.jax, self.xla_env, self.step_module, self.trainer = jax, xla_env, step, train

    def adopt(self, twin, cfg: Config) -> None:
        self.device, self.precision = self.step_module.resolve_device(cfg.device), twin.record["matmul_precision"]

    def sync(self) -> None:
        pass  # every step driven here ends by reading a number from the device

    def provenance(self, bench, hlo: str) -> dict:
        """The implementation that ran and what the compiled training step holds (:func:`hlo_summary`)."""
        summary = hlo_summary(hlo)
        return {"kernels": [f"impl:{bench.twin.record['lstm_impl']}", *summary["custom_calls"]], **summary}

    def info(self) -> dict:
        d = self.device
        return {"device": "cuda" if d.platform == "gpu" else d.platform,
                "device_name": d.device_kind if d.platform != "cpu" else "cpu", "xla_env": self.xla_env.record(),
                "threads": {"xla_cpu_pool": usable_cpus(), "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")},
                "precision": {"jax_default_matmul_precision": str(self.jax.config.jax_default_matmul_precision),
                              "jax_impl_precision": self.precision}}

    def peak_device_mb(self) -> float | None:
        stats = self.device.memory_stats() or {}
        return stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None

    def gemm(self, n: int) -> dict:
        """The float32 GEMM rate at the twin's matmul precision: HIGHEST (full float32) unless --allow-tf32."""
        import jax.numpy as jnp
        precision = self.jax.lax.Precision[self.precision.upper()]
        a, b = (self.jax.device_put(self.jax.random.normal(k, (n, n), jnp.float32), self.device)
                for k in self.jax.random.split(self.jax.random.PRNGKey(0)))
        matmul = self.jax.jit(lambda x, y: jnp.matmul(x, y, precision=precision))
        return {"gflop_s": gemm_gflop_s(matmul, a, b, self.jax.block_until_ready), "precision": self.precision}


class PartsTimed:
    """A twin whose ``train_step`` times its parts (``train_step_parts``) while ``timing`` is set, so that the
    training steps of every round, whole or in parts, are one trajectory through ``train_steps``."""

    def __init__(self, twin, sync):
        self.twin, self.sync, self.timing, self.parts = twin, sync, False, None

    def __getattr__(self, name: str):
        return getattr(self.twin, name)

    def train_step(self, state, carry, batch):
        if not self.timing:
            return self.twin.train_step(state, carry, batch)
        state, carry, loss, self.parts = self.twin.train_step_parts(state, carry, batch, self.sync)
        return state, carry, loss


def hlo_summary(hlo: str) -> dict:
    """What a compiled XLA module holds: its while loops (those carrying floating-point arrays: the recurrences;
    the others are the dropout key's bit generator) and its custom calls (cuDNN's LSTM is ``cudnn_rnn_ffi``)."""
    loops = [line.split(" while(")[0] for line in hlo.splitlines() if " while(" in line]
    floats = sum(bool(re.search(r"\b(f32|f64|bf16)\[", x)) for x in loops)
    return {"while_loops": len(loops), "float_while_loops": floats,
            "custom_calls": sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))}


class Bench:
    """One variant of one twin, built by its trainer's own ``twin_maker`` and stepped through the Twin protocol: its
    training steps by :func:`common.loop.train_steps` (the loop's order and carry policy), on the real batches."""

    def __init__(self, framework: str):
        self.framework, self.side, self.make_twin, self.exits = framework, None, None, ExitStack()

    def build(self, cfg: Config):
        """``(twin, state, its training steps)``: a twin made as its trainer makes it (the trainer's set-up entered
        once), its state from the shared initial weights."""
        self.make_twin = self.make_twin or self.exits.enter_context(self.side.trainer.twin_maker(cfg))
        twin = PartsTimed(self.make_twin(cfg, len(self.data.vocab)), self.side.sync)
        state = twin.init_state(self.params)
        return twin, state, train_steps(twin, state, self.data.train, cfg)

    def load(self, msg: dict) -> dict:
        """The data and the twin, nothing timed: the harness has every worker load at once."""
        self.cfg = cfg = Config(**msg["config"])
        self.data = prepare_data(cfg)
        full = [b for b in batches(self.data.val, cfg.batch_size) if b.size == cfg.batch_size]  # one shape to time
        self.eval = full or list(itertools.islice(batches(self.data.train, cfg.batch_size, shuffle_seed=0), 1))
        self.params = init_params(len(self.data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)
        self.twin, self.state, self.train = self.build(cfg)  # evaluation reads the latest state
        self.side.adopt(self.twin, cfg)
        self.evals = 0
        return {"loaded": True}

    def setup(self, msg: dict) -> dict:
        """Compile, the first step, warm-up and provenance, each step kind in turn (one worker at a time)."""
        cfg = self.cfg
        first = next(batches(self.data.train, cfg.batch_size, shuffle_seed=cfg.seed))
        out = {"vocab_size": len(self.data.vocab), "info": self.side.info(), "phases": {},
               "record": {k: v for k, v in self.twin.record.items() if isinstance(v, (str, int, float, bool))}}
        for kind in msg["phases"]:  # inference first: its peak memory is read before training raises it
            if kind == "parts":  # the parts' own functions compile in their first call: warmed, not reported
                self.steps("parts", 1 + msg["warmup"])
                continue
            phase = self.twin.compile(self.state, "eval" if kind == "eval" else "train",
                                      self.eval[0] if kind == "eval" else first)
            hlo = phase.pop("hlo", None)
            phase["first_step_s"] = self.steps(kind, 1)[0]
            if cfg.torch_compile:
                phase["compile_s"] = phase["first_step_s"]  # Dynamo and Inductor work inside the first call
            self.steps(kind, msg["warmup"])
            out["phases"][kind] = {**phase, "peak_device_mb": self.side.peak_device_mb(),
                                   "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB
            if kind == "train":  # what ran the LSTM, read once it is warm, and the float rules it ran under
                out["provenance"] = {**self.side.provenance(self, hlo), "precision": out["info"]["precision"],
                                     "flush_denormal": self.twin.record["flush_denormal"],
                                     **{k: self.twin.record[k] for k in ("lstm_kernel", "bfloat16")
                                        if k in self.twin.record}}  # what ran in bfloat16, by the twin's rules
                if cfg.torch_compile and "dynamo:lstm" not in out["provenance"]["kernels"]:
                    return {**out, "not_applicable": out["provenance"]["dynamo"]["reason"]}
        return out

    def steps(self, kind: str, n: int) -> list:
        """Seconds of each of ``n`` steps (a GPU synchronised before the clock stops); ``parts``: training steps,
        each as the seconds of its parts."""
        out = []
        for _ in range(n):
            start = time.perf_counter()
            if kind == "eval":
                batch, self.evals = self.eval[self.evals % len(self.eval)], self.evals + 1
                float(self.twin.eval_step(self.state, batch)[0])  # what evaluate() reads
            else:
                self.twin.timing = kind == "parts"
                self.state = next(self.train).state
            self.side.sync()
            out.append(self.twin.parts if kind == "parts" else time.perf_counter() - start)
        return out

    def parity(self, n: int, dtype: str | None = None) -> list[float]:
        """Losses of ``n`` training steps from the shared weights with dropout 0, in a twin of their own (in ``dtype``
        if given: the baseline's float32 reference of a bfloat16 run)."""
        _, _, steps = self.build(self.cfg.replace(dropout=0.0, fc_dropout=0.0, dtype=dtype or self.cfg.dtype))
        return [s.loss for s in itertools.islice(steps, n)]

    def handle(self, msg: dict) -> dict:
        op, n = msg["op"], msg.get("n")
        if op in ("load", "train"):  # the first request: it sets the framework's threads before anything runs
            self.side = self.side or (TorchSide if self.framework == "torch" else JaxSide)(msg["threads"])
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
            rates = {self.framework: {**self.side.gemm(n), "n": n, "device": device}}
            if device == "cpu":  # numpy's BLAS as a third opinion of the CPU's peak
                a, b = (np.random.default_rng(i).standard_normal((n, n), dtype=np.float32) for i in (0, 1))
                rates["numpy"] = {"gflop_s": gemm_gflop_s(np.matmul, a, b), "precision": "float32", "n": n,
                                  "device": "cpu"}
            return {"gemm": rates}
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
            replies.write(REPLY_TAG + json.dumps(reply) + "\n")
            replies.flush()
            if msg["op"] == "quit":
                break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

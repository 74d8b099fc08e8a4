"""A persistent benchmark worker, ``python -m benchmarks.worker torch|jax``: one per variant (per rank under DDP).

One JSON request per line on stdin, one ``@@ {json}`` answer per line on stdout: ``setup``, ``steps`` (time ``n``
steps of one kind), ``parity`` (losses with dropout 0), ``gemm`` (the float32 matmul rate), ``train`` (convergence
mode: the trainer's whole run), ``quit``. The steps are the twins' own ``train_step`` and ``eval_step``, each ending
in the host sync the trainers do, on the real batches.
"""
from __future__ import annotations

import itertools
import json
import os
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
from common.errors import UserError
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

    def adopt(self, twin, params, hooks: dict):
        """The twin's state from ``params``, and the benchmark-only ``hooks`` applied to it."""
        self.device, state = twin.device, twin.init_state(params)
        if hooks.get("compile_model"):
            twin.model = state.model = self.torch.compile(state.model)
        return state

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

    def compile(self, twin, state, kind: str, batch) -> dict:
        return {}  # eager: nothing ahead of the first call

    def gemm(self, n: int) -> dict:
        """The float32 GEMM rate at the precision the twin runs (TF32 only under --allow-tf32, on a GPU)."""
        gen = self.torch.Generator().manual_seed(0)
        a, b = (self.torch.randn(n, n, generator=gen).to(self.device) for _ in range(2))
        tf32 = self.device.type == "cuda" and self.torch.backends.cuda.matmul.allow_tf32
        return {"gflop_s": gemm_gflop_s(self.torch.matmul, a, b, lambda x: self.sync()),
                "precision": "tf32" if tf32 else "float32"}

    def compile_counters(self) -> dict:
        """What Dynamo did: frames traced, graphs, graph breaks, and what it refused (each reason's first line)."""
        from torch._dynamo.utils import counters
        refused: Counter = Counter()
        for reason, n in counters.get("unimplemented", {}).items():
            refused[(reason.strip().splitlines() or ["?"])[0][:160]] += n
        return {"frames_total": counters["frames"].get("total", 0), "frames_ok": counters["frames"].get("ok", 0),
                "unique_graphs": counters["stats"].get("unique_graphs", 0),
                "graph_breaks": sum(counters["graph_break"].values()), "unimplemented": dict(refused)}


class JaxSide:
    """The same for the JAX twin, and its compilation ahead of the first call."""

    def __init__(self, threads: int):
        from jax_impl import xla_env
        xla_env.configure()  # XLA settings that must precede the backend's start
        import jax
        from jax_impl import step, train
        self.jax, self.xla_env, self.step_module, self.trainer = jax, xla_env, step, train

    def adopt(self, twin, params, hooks: dict):
        st = self.step_module
        self.device, self.precision = st.resolve_device(twin.cfg.device), twin.record["matmul_precision"]
        if hooks.get("unroll"):  # the reference scan, its loop unrolled
            twin.model = twin.model.clone(unroll=hooks["unroll"])
            twin.step, twin.evaluate = st.make_train_step(twin.model, twin.cfg), st.make_eval_step(twin.model, twin.cfg)
        return twin.init_state(params)

    def compile(self, twin, state, kind: str, batch) -> dict:
        """``lower_s`` and ``compile_s`` (lowering included) of the jitted step; its first call reuses the result."""
        st, t0 = self.step_module, time.perf_counter()
        lowered = (twin.step.lower(state, twin.init_carry(), st.batch_to_device(batch, twin.place.data), twin.key)
                   if kind == "train" else
                   twin.evaluate.lower(state.params, st.padded_eval_batch(batch, twin.cfg.batch_size, twin.place.data)))
        lower_s = time.perf_counter() - t0
        lowered.compile()
        return {"lower_s": lower_s, "compile_s": time.perf_counter() - t0}

    def sync(self) -> None:
        pass  # every step driven here ends by reading a number from the device

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


class Bench:
    """One variant of one twin: its batches, state and carry, driven step by step."""

    def __init__(self, framework: str):
        self.framework, self.side, self.make_twin, self.exits = framework, None, None, ExitStack()

    def build(self, cfg: Config, hooks: dict):
        """``(twin, state)``: a twin made as its trainer makes it (the trainer's set-up entered once, left at exit)."""
        self.make_twin = self.make_twin or self.exits.enter_context(self.side.trainer.twin_maker(cfg))
        twin = self.make_twin(cfg, self.vocab_size)
        return twin, self.side.adopt(twin, self.params, hooks)

    def setup(self, msg: dict) -> dict:
        cfg, hooks = Config(**msg["config"]), msg["hooks"]
        data, self.cfg = prepare_data(cfg), cfg
        epochs = (enumerate(batches(data.train, cfg.batch_size, shuffle_seed=cfg.seed, epoch=epoch))
                  for epoch in range(msg["n_train"]))  # consecutive epochs' shuffled batches, as many as the run takes
        taken = list(itertools.islice(itertools.chain.from_iterable(epochs), msg["n_train"]))
        self.train, self.new_epoch = [b for _, b in taken], [i == 0 for i, _ in taken]
        full = [b for b in batches(data.val, cfg.batch_size) if b.size == cfg.batch_size]  # one shape to time
        self.eval, self.vocab_size = full or self.train[:1], len(data.vocab)
        self.params = init_params(self.vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)
        self.twin, self.state = self.build(cfg, hooks)
        self.carry, self.index = None, {"train": 0, "eval": 0}
        out = {"vocab_size": self.vocab_size, "info": self.side.info(), "phases": {},
               "record": {k: v for k, v in self.twin.record.items() if isinstance(v, (str, int, float, bool))}}
        for kind in msg["phases"]:  # inference first: its peak memory is read before training raises it
            phase = self.side.compile(self.twin, self.state, kind, (self.train if kind == "train" else self.eval)[0])
            phase["first_step_s"] = self.steps(kind, 1)[0]
            if hooks.get("compile_model"):
                phase["compile_s"] = phase["first_step_s"]  # Dynamo and Inductor work inside the first call
            self.steps(kind, msg["warmup"])
            out["phases"][kind] = {**phase, "peak_device_mb": self.side.peak_device_mb(),
                                   "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB
        if hooks.get("compile_model"):
            out["compile_info"] = self.side.compile_counters()
        return out

    def train_step(self, twin, state, carry, k: int):
        """Training step ``k`` (of the run's batches), the carry reset to zeros where the trainers reset it."""
        if carry is None or self.new_epoch[k] or self.cfg.carry == "reset":
            carry = twin.init_carry()
        return twin.train_step(state, carry, self.train[k])

    def steps(self, kind: str, n: int) -> list[float]:
        """Seconds of each of ``n`` steps (a GPU synchronised before the clock stops)."""
        out = []
        for _ in range(n):
            start, i = time.perf_counter(), self.index[kind]
            self.index[kind] += 1
            if kind == "eval":
                float(self.twin.eval_step(self.state, self.eval[i % len(self.eval)])[0])  # what evaluate() reads
            else:
                self.state, self.carry, _ = self.train_step(self.twin, self.state, self.carry, i % len(self.train))
            self.side.sync()
            out.append(time.perf_counter() - start)
        return out

    def parity(self, n: int) -> list[float]:
        """Losses of ``n`` training steps from the shared weights with dropout 0, in a twin of their own."""
        cfg = self.cfg.replace(dropout=0.0, fc_dropout=0.0)
        (twin, state), carry, losses = self.build(cfg, {}), None, []
        for k in range(n):
            state, carry, loss = self.train_step(twin, state, carry, k)
            losses.append(loss)
        return losses

    def handle(self, msg: dict) -> dict:
        op, n = msg["op"], msg.get("n")
        if op in ("setup", "train"):  # the first request: it sets the framework's threads before anything runs
            self.side = self.side or (TorchSide if self.framework == "torch" else JaxSide)(msg["threads"])
        if op == "setup":
            return self.setup(msg)
        if op == "train":  # convergence mode: the trainer's whole run
            self.side.trainer.train(Config(**msg["config"]))
            return {"trained": True}
        if op == "steps":
            return {"step_s": self.steps(msg["kind"], n)}
        if op == "parity":
            return {"losses": self.parity(n)}
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

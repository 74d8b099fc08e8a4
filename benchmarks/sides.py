"""Each framework's side of a benchmark worker: what timing a twin needs beyond the Twin protocol, whose ``lower`` and
``train_step_parts`` it calls (threads, the device sync and the clock, ahead-of-time compilation, the GEMM rate, what
the framework's own machinery costs a step apart from it) and what ran it (provenance: the LSTM ops PyTorch's profiler
saw, or what XLA's compiled step holds). Sides: :class:`TorchSide`, :class:`JaxSide`, and :class:`NnxSide` for the
JAX twin in Flax NNX."""
import os
import re
import time
from collections import Counter
from typing import Any, Callable

import numpy as np

from benchmarks.processes import usable_cpus
from common.config import Config

DISPATCH_CALLS = 50  # NnxSide.overheads: the calls of each kind whose median it reports, alternated


class Clock:
    """Seconds between successive :meth:`lap` calls, each read once ``wait(outputs)`` returns."""

    def __init__(self, wait: Callable[[Any], Any]):
        self.wait, self.last = wait, time.perf_counter()

    def lap(self, *outputs) -> float:
        self.wait(outputs)
        previous, self.last = self.last, time.perf_counter()
        return self.last - previous


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

    def use_dtype(self, name: str) -> None:
        """Nothing to switch: a torch twin computes in the dtype its model is cast to."""

    def trainers_default(self, twin, cfg: Config) -> dict:
        """Nothing to choose: PyTorch's trainer runs nn.LSTM (or nn.GRU)."""
        return {}

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def clock(self) -> Clock:
        """The clock of the twin's ``train_step_parts``: each lap read after a device sync."""
        return Clock(lambda outputs: self.sync())

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
        ops = sorted({e.name for e in events if re.search(RECURRENT_OPS, e.name, re.I)})
        onednn = re.search(r"(?:MKL-DNN|oneDNN) v(\S+)", self.torch.__config__.show())
        out = {"kernels": ops, "kernel_dtypes": lstm_op_dtypes(events), "onednn": onednn and onednn[1],
               "cudnn": self.torch.backends.cudnn.version() if self.device.type == "cuda" else None}
        if bench.cfg.torch_compile:
            out["dynamo"] = dynamo = self.compile_counters()
            if dynamo["unique_graphs"] and not any(re.search("lstm|rnn", r, re.I) for r in dynamo["unimplemented"]):
                out["kernels"].append("dynamo:lstm")
        return out

    def compile(self, twin, state, kind: str, batch) -> dict:
        """Nothing is compiled ahead of the first call (under --torch-compile, Dynamo works inside it)."""
        return {}

    def compile_parts(self, twin, state, batch) -> None:
        """Nothing to compile for the part-timed step."""

    def overheads(self, bench) -> dict:
        """Nothing measured apart: the step is what the trainer runs."""
        return {}

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
RECURRENT_OPS = "rnn|lstm|gru"  # the ops that run a recurrence: aten::lstm, aten::gru, mkldnn_rnn_layer, _cudnn_rnn


def lstm_op_dtypes(events) -> dict[str, list[str]]:
    """Each LSTM op of a profiled step (an RNN op, or a matmul that ``aten::lstm`` runs itself: its ATen cell) → the
    dtypes of the floating-point tensors it received, in its innermost call (autocast calls an op again, on the cast
    inputs)."""
    def inside_lstm(e) -> bool:
        return e is not None and (e.name == "aten::lstm" or inside_lstm(e.cpu_parent))

    out: dict[str, set[str]] = {}
    for e in events:
        own = re.search(RECURRENT_OPS, e.name, re.I) and e.name != "aten::lstm"
        cell = e.name in ("aten::mm", "aten::addmm") and inside_lstm(e)
        if (own or cell) and not any(c.name == e.name for c in e.cpu_children):
            # torch 2.2's profiler records the inputs' shapes but not their dtypes: none are named there.
            dtypes = getattr(e, "input_dtypes", None) or ()
            out.setdefault(e.name, set()).update(DTYPE_NAMES[d] for d in dtypes if d in DTYPE_NAMES)
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

    def trainers_default(self, twin, cfg: Config) -> dict:
        """What ``jax_impl.train`` runs for ``cfg`` under its default, ``--lstm-impl auto``, here, and why:
        choice.auto's answer (``lstm_impl_default``, ``lstm_impl_default_why``), whatever ``--lstm-impl`` this variant
        names."""
        from jax_impl.recurrences import choice
        impl, why = choice.auto(choice.Run.of(cfg, self.device.platform, twin.record["devices"]))
        return {"lstm_impl_default": impl, "lstm_impl_default_why": why}

    def use_dtype(self, name: str) -> None:
        """What ``jax_impl.train``'s ``main`` does where it starts for ``--dtype name``, before any array: float64
        switches on JAX's x64 mode (the process's)."""
        if name == "float64":
            self.jax.config.update("jax_enable_x64", True)

    def sync(self) -> None:
        pass  # every step driven here ends by reading a number from the device

    def clock(self) -> Clock:
        """The clock of the twin's ``train_step_parts``: each lap read once the outputs it is given are computed."""
        return Clock(self.jax.block_until_ready)

    def provenance(self, bench, hlo: str) -> dict:
        """The implementation that ran and what the compiled training step holds: its while loops (those carrying
        floating-point arrays: the recurrences; the others are the dropout key's bit generator) and its custom calls
        (cuDNN's LSTM is ``cudnn_rnn_ffi``, oneDNN's ``onednn_lstm_forward`` and ``onednn_lstm_backward``, our
        kernel's ``lstm_kernel_forward`` and ``lstm_kernel_backward``), with a native kernel's library."""
        record = bench.twin.record
        loops = [line.split(" while(")[0] for line in hlo.splitlines() if " while(" in line]
        calls = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))
        library = {k: record[k] for k in ("onednn", "onednn_threads", "gemm", "kernel_threads", "gate_math")
                   if k in record}  # a native kernel's library
        api = "nnx." if record.get("flax_api") == "nnx" else ""  # the NNX model (--flax-api nnx) over that cell
        return {"kernels": [f"impl:{api}{record['lstm_impl']}", *calls], "while_loops": len(loops),
                "float_while_loops": sum(bool(re.search(r"\b(f32|f64|bf16)\[", x)) for x in loops),
                "custom_calls": calls, **library}

    def compile(self, twin, state, kind: str, batch) -> dict:
        """Lower and compile the twin's jitted ``kind`` ("train" or "eval") step for ``batch``'s shapes ahead of its
        first call, which then reuses the executable: ``lower_s``, ``compile_s`` (lowering included), and ``hlo``, the
        compiled module's text."""
        start = time.perf_counter()
        lowered = twin.lower(kind, state, twin.init_carry(batch.size if kind == "eval" else None), batch)
        lower_s = time.perf_counter() - start
        compiled = lowered.compile()
        return {"lower_s": lower_s, "compile_s": time.perf_counter() - start, "hlo": compiled.as_text()}

    def compile_parts(self, twin, state, batch) -> None:
        """Compile the twin's ``train_step_parts`` functions by one call on ``batch``, on a copy of ``state`` (the NNX
        twin's parts update the state they are given), its results discarded: their compile time is reported nowhere,
        so it can overlap the other workers' loading instead of adding to the one-at-a-time set-up."""
        self.jax.block_until_ready(twin.train_step_parts(state.replace(), twin.init_carry(), batch, self.clock())[:2])

    def overheads(self, bench) -> dict:
        """Nothing measured apart: the jitted step is what the trainer runs."""
        return {}

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


class NnxSide(JaxSide):
    """The same for the JAX twin written in Flax NNX (``--flax-api nnx``, :class:`jax_impl.train.NnxTwin`), whose set-up
    measures apart what ``nnx.jit``'s traversal of its model and optimizer costs a step (:meth:`overheads`)."""

    def __init__(self, threads: int):
        super().__init__(threads)
        from flax import nnx
        self.nnx = nnx

    def overheads(self, bench) -> dict:
        """What ``nnx.jit``'s graph traversal costs a call on this twin's model and optimizer, measured apart from the
        step: before each call ``nnx.jit`` walks their object graph to split it into arrays, and after it merges the
        results back, where ``nnx.cached_partial`` (Flax's performance guide's remedy) walks it once and reuses that.
        Both call one function of the model and the optimizer that computes nothing, :data:`DISPATCH_CALLS` times
        each, alternated, each waited for: ``nnx_dispatch_ms``, each one's median ms from call to return, and
        ``nnx_overhead_ms``, their difference, what the training step's call pays too (its arguments are the same
        objects). Around a whole training step, a second of work would bury those milliseconds in its noise."""
        jax, nnx = self.jax, self.nnx
        state = bench.twin.init_state(bench.params)  # a state of its own
        touch = nnx.jit(lambda model, optimizer: None)
        cached = nnx.cached_partial(touch, state.model, state.optimizer)
        calls = {"nnx.jit": lambda: touch(state.model, state.optimizer), "nnx.cached_partial": cached}
        seconds: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(1 + DISPATCH_CALLS):  # the first round compiles what it must, and is not counted
            for name, call in calls.items():
                start = time.perf_counter()
                jax.block_until_ready(call())
                seconds[name].append(time.perf_counter() - start)
        ms = {name: float(np.median(times[1:])) * 1e3 for name, times in seconds.items()}
        return {"nnx_dispatch_ms": ms, "nnx_overhead_ms": ms["nnx.jit"] - ms["nnx.cached_partial"]}

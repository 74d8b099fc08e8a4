"""Each framework's side of a benchmark worker: what timing a twin needs beyond the Twin protocol (threads, the device
sync, ahead-of-time compilation, the training step timed part by part, the GEMM rate, what the framework's own
machinery costs a step apart from it) and what ran it (provenance: the LSTM ops PyTorch's profiler saw, or what XLA's
compiled step holds). Sides: :class:`TorchSide`, :class:`JaxSide`, and :class:`NnxSide` for the JAX twin in Flax NNX."""
import math
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
        from torch_impl import lm_step, step, train
        torch.set_num_threads(threads)
        self.torch, self.trainer, self.step_module, self.lm_step = torch, train, step, lm_step
        self.decoder_input = None  # the decoder part's input, made once (train_step_parts)

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

    def train_step_parts(self, twin, state, carry, batch) -> tuple[Any, Any, float, dict[str, float]]:
        """The twin's training step as its trainer runs it, from the step's public parts
        (:func:`torch_impl.step.train_step`'s ``forward``, ``backward`` and ``update``), a clock read after each
        (after a device sync): ``(state, carry, loss, seconds per part)``."""
        step, clock = self.step_module, Clock(lambda outputs: self.sync())
        forward_of = self.lm_step.forward if twin.lm else step.forward  # the language model's: its own loss
        loss, new_carry, finite = forward_of(state.model, carry, batch, twin.cfg)
        forward = clock.lap()
        step.backward(state.model, loss)
        backward = clock.lap()
        state, carry, loss = step.update(state, carry, new_carry, loss, finite, twin.cfg)
        parts = {"forward": forward, "backward": backward, "optimizer": clock.lap()}
        if twin.lm:
            parts["decoder"] = self.decoder_part(twin, batch, clock)
        return state, carry, loss.item(), parts

    def decoder_part(self, twin, window, clock: Clock) -> float:
        """Seconds of the language model's decoder and loss alone, forward and backward, on ``window``'s shapes: the
        twin's own ``decoder`` (its parameters' gradients and the input's) and cross-entropy on a fixed (t, B, H)
        input in the LSTM's output range. Its gradients are discarded: the next step's backward sets them afresh."""
        from torch_impl.lm_model import cross_entropy
        torch, model = self.torch, twin.model
        inputs, targets = self.lm_step.to_device(window, model)
        shape = (*inputs.shape, model.hidden_dim)
        if self.decoder_input is None or self.decoder_input.shape != shape:
            gen = torch.Generator().manual_seed(0)
            x = torch.tanh(torch.randn(shape, generator=gen)).to(device=inputs.device, dtype=model.decoder.bias.dtype)
            self.decoder_input = x.requires_grad_()
        x = self.decoder_input
        clock.lap()
        x.grad = None
        cross_entropy(model.decoder(x), targets).backward()
        return clock.lap()

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
            out.setdefault(e.name, set()).update(DTYPE_NAMES[d] for d in e.input_dtypes if d in DTYPE_NAMES)
    return {k: sorted(v) for k, v in sorted(out.items())}


class JaxSide:
    """The same for the JAX twin."""

    def __init__(self, threads: int):
        from jax_impl import xla_env
        xla_env.configure()  # XLA settings that must precede the backend's start
        import jax
        from jax_impl import lm_step, step, train
        self.jax, self.xla_env, self.step_module, self.lm_step, self.trainer = jax, xla_env, step, lm_step, train
        self.parts = None  # the step's three jitted parts (train_step_parts)
        self.decoder = None  # the language model's decoder part: its jitted function and input (decoder_part)

    def adopt(self, twin, cfg: Config) -> None:
        self.device, self.precision = self.step_module.resolve_device(cfg.device), twin.record["matmul_precision"]

    def trainers_default(self, twin, cfg: Config) -> dict:
        """What ``jax_impl.train`` runs for ``cfg`` under its default, ``--lstm-impl auto``, here, and why:
        choice.auto's answer (``lstm_impl_default``, ``lstm_impl_default_why``), whatever ``--lstm-impl`` this variant
        names."""
        from jax_impl.recurrences import choice
        impl, why = choice.auto(choice.Run.of(cfg, self.device.platform, twin.place.devices))
        return {"lstm_impl_default": impl, "lstm_impl_default_why": why}

    def use_dtype(self, name: str) -> None:
        """What the trainer's set-up does for ``--dtype name`` before a twin computes in it: float64 switches on JAX's
        x64 mode (for good, in this process)."""
        self.step_module.resolve_dtype(name)

    def sync(self) -> None:
        pass  # every step driven here ends by reading a number from the device

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
        lowered = self.lower(twin, state, kind, batch)
        lower_s = time.perf_counter() - start
        compiled = lowered.compile()
        return {"lower_s": lower_s, "compile_s": time.perf_counter() - start, "hlo": compiled.as_text()}

    def lower(self, twin, state, kind: str, batch) -> Any:
        """The twin's jitted ``kind`` step lowered for ``batch``'s shapes, with the arguments its trainer passes."""
        if kind == "train":
            return twin.step.lower(state, twin.init_carry(), self.to_device(twin, batch), twin.key)
        if twin.lm:  # the window's carry goes in and out
            return twin.evaluate.lower(state.params, twin.init_carry(batch.size), self.to_device(twin, batch))
        return twin.evaluate.lower(state.params, self.step_module.padded_eval_batch(batch, twin.cfg.batch_size,
                                                                                   twin.place.data))

    def to_device(self, twin, batch) -> dict:
        """A training batch (the classifier's ``Batch``, the LM's ``Window``) on the twin's device, as its step reads
        it."""
        if twin.lm:
            return self.lm_step.window_to_device(batch, twin.place.data)
        return self.step_module.batch_to_device(batch, twin.place.data)

    def compile_parts(self, twin, state, batch) -> None:
        """Compile :meth:`train_step_parts`'s functions by one call on ``batch``, its results discarded: their
        compile time is reported nowhere, so it can overlap the other workers' loading instead of adding to the
        one-at-a-time set-up."""
        self.jax.block_until_ready(self.train_step_parts(twin, state, twin.init_carry(), batch)[:2])

    def overheads(self, bench) -> dict:
        """Nothing measured apart: the jitted step is what the trainer runs."""
        return {}

    def train_step_parts(self, twin, state, carry, batch) -> tuple[Any, Any, float, dict[str, float]]:
        """The twin's training step as three jitted functions (:meth:`part_functions`), each waited for: ``forward``
        (the loss), ``backward`` (the loss and its gradient, less the forward's time) and ``optimizer`` (the update).
        Together they compute the twin's step; XLA fuses the whole step across the parts, so their times add up to a
        little more than the step's."""
        jax = self.jax
        if self.parts is None:  # compiled in their first call
            self.parts = self.part_functions(twin)
        loss_of, grads_of, update = self.parts
        device_batch, key = self.to_device(twin, batch), jax.random.fold_in(twin.key, state.step)
        clock = Clock(jax.block_until_ready)  # the device sync is the wait
        forward = clock.lap(loss_of(state, carry, device_batch, key))
        (loss, new_carry), grads = out = grads_of(state, carry, device_batch, key)
        backward = clock.lap(out) - forward
        state, carry, metrics = out = update(state, grads, loss, carry, new_carry)
        parts = {"forward": forward, "backward": backward, "optimizer": clock.lap(out)}
        if twin.lm:
            parts["decoder"] = self.decoder_part(twin, state, device_batch, clock)
        loss, finite = jax.device_get((metrics.loss, metrics.finite))
        return state, carry, float(loss) if finite else math.nan, parts

    def part_functions(self, twin) -> tuple[Callable, Callable, Callable]:
        """:meth:`train_step_parts`'s jitted ``loss_of(state, carry, batch, key)``, ``grads_of`` (the same, with the
        gradient) and ``update(state, grads, loss, carry, new_carry) -> (state, carry, metrics)``, from
        :mod:`jax_impl.step` (``make_loss_fn``, ``make_update``)."""
        jax, step = self.jax, self.step_module
        loss_fn = (self.lm_step.make_lm_loss_fn if twin.lm else step.make_loss_fn)(twin.model, twin.cfg)
        loss_of, grads_of = jax.jit(loss_fn), jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
        return (lambda state, *rest: loss_of(state.params, *rest), lambda state, *rest: grads_of(state.params, *rest),
                jax.jit(step.make_update(twin.cfg)))

    def decoder_part(self, twin, state, window: dict, clock: Clock) -> float:
        """Seconds of the language model's decoder and loss alone, forward and backward, on ``window``'s shapes, one
        jitted function: the model's own ``Decoder`` and ``cross_entropy`` on a fixed (t, B, H) input in the LSTM's
        output range, differentiated for the decoder's parameters (the encoder's table when tied) and the input."""
        jax, jnp = self.jax, self.jax.numpy
        from jax_impl.lm_model import Decoder, cross_entropy
        targets, model = window["targets"], twin.model
        shape = (*targets.shape, model.hidden_dim)
        if self.decoder is None or self.decoder[1].shape != shape:
            decoder = Decoder(model.vocab_size, model.dtype, model.precision)

            def loss(params: dict, x: jax.Array, targets: jax.Array) -> jax.Array:
                tied = params["encoder"]["weight"] if "encoder" in params else None
                return cross_entropy(decoder.apply({"params": params["decoder"]}, x, tied), targets)

            x = jnp.tanh(jax.random.normal(jax.random.key(0), shape, model.dtype))
            self.decoder = (jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), jax.device_put(x, twin.place.data))
            jax.block_until_ready(self.decoder[0](self.decoder_params(twin, state), self.decoder[1], targets))
        grads_of, x = self.decoder
        params = self.decoder_params(twin, state)
        clock.lap()
        return clock.lap(grads_of(params, x, targets))

    @staticmethod
    def decoder_params(twin, state) -> dict:
        """The decoder's parameters in the state: its own, and the encoder's table when ``--tied``."""
        return {k: state.params[k] for k in (("decoder", "encoder") if twin.model.tied else ("decoder",))}

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
    """The same for the JAX twin written in Flax NNX (``--flax-api nnx``, :class:`jax_impl.train.NnxTwin`): its steps
    take the model and its optimizer, which they update in place, and its set-up measures apart what ``nnx.jit``'s
    traversal of them costs a step (:meth:`overheads`)."""

    def __init__(self, threads: int):
        super().__init__(threads)
        from flax import nnx
        from jax_impl import nnx_step
        self.nnx, self.nnx_step = nnx, nnx_step

    def lower(self, twin, state, kind: str, batch) -> Any:
        """``nnx.jit``'s own ``lower``, on the model and optimizer its trainer passes."""
        if kind == "train":
            return twin.step.lower(state.model, state.optimizer, twin.init_carry(), self.to_device(twin, batch),
                                   twin.key)
        return twin.evaluate.lower(state.model, self.step_module.padded_eval_batch(batch, twin.cfg.batch_size,
                                                                                  twin.place.data))

    def compile_parts(self, twin, state, batch) -> None:
        """As the linen twin's, on a copy of the state: the NNX parts update the model they are given."""
        copy = self.nnx_step.TrainState(self.nnx.clone(state.model), self.nnx.clone(state.optimizer))
        super().compile_parts(twin, copy, batch)

    def part_functions(self, twin) -> tuple[Callable, Callable, Callable]:
        """:meth:`JaxSide.part_functions` as three ``nnx.jit`` functions of :mod:`jax_impl.nnx_step`: the loss and
        ``nnx.value_and_grad``'s gradient of the model, and ``make_update``, which updates the model and the optimizer
        in place (so the state it returns is the one it was given)."""
        nnx = self.nnx
        loss_fn = self.nnx_step.make_loss_fn(twin.cfg)
        loss_of, grads_of = nnx.jit(loss_fn), nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))
        update_in_place = nnx.jit(self.nnx_step.make_update(twin.cfg))

        def update(state, grads, loss, carry, new_carry):
            return state, *update_in_place(state.model, state.optimizer, grads, loss, carry, new_carry)

        return (lambda state, *rest: loss_of(state.model, *rest), lambda state, *rest: grads_of(state.model, *rest),
                update)

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

"""The PyTorch twin, timed through the functions its trainer uses.

``torch_impl.model.model_from_config`` / ``load_params`` build the model from the shared initial weights,
placed as the trainer places it (``resolve_device`` / ``resolve_dtype``); ``torch_impl.step.make_optimizer``
/ ``train_step`` / ``eval_step`` are timed as they are (no copy). ``train_step`` converts the numpy batch
to tensors on the device itself, so that conversion is part of every timed step; ``eval_step`` returns
Python numbers, so every inference step ends with a host synchronisation (as in the trainer).
Variants:

- ``eager``: ``nn.LSTM`` as the trainer runs it (oneDNN kernels on the CPU, cuDNN on a GPU).
- ``compile``: the same model wrapped in ``torch.compile`` with default settings (what a user gets
  from one line). Dynamo's counters are reported: by default it does not trace ``nn.LSTM``.
- ``compile-rnn``: ``torch.compile`` with ``torch._dynamo.config.allow_rnn = True`` (experimental: the
  LSTM is unrolled over time into the graph, which makes compilation very slow).
- ``compile-step``: ``torch.compile`` of the trainer's ``train_step`` / ``eval_step`` functions themselves
  (loss, backward, clipping and the Adam update included, where Dynamo can trace them).
"""
from __future__ import annotations

import time
from typing import Any

from benchmarks.measure import current_rss_mb, measure_phase, peak_rss_mb
from benchmarks.workload import Workload
from common.errors import ConfigError

VARIANTS = ("eager", "compile", "compile-rnn", "compile-step")


def _import():
    import torch  # noqa: F401  (imported here so the bench runs without PyTorch when it is not asked for)
    from torch_impl import model as tmodel, step as ttrain
    return torch, tmodel, ttrain


def setup(device: str, threads: int, allow_tf32: bool) -> dict:
    """Fix threads and matmul precision; resolve the device. Returns what was set, for the report."""
    torch, _, ttrain = _import()
    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    use_cuda = ttrain.resolve_device(device).type == "cuda"  # the trainer's rule; ConfigError without a GPU
    name = torch.cuda.get_device_name(0) if use_cuda else "cpu"
    return {"device": "cuda" if use_cuda else "cpu", "device_name": name,
            "threads": {"torch_intra_op": torch.get_num_threads(), "torch_inter_op": torch.get_num_interop_threads()},
            "precision": {"float32_matmul_precision": torch.get_float32_matmul_precision(),
                          "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                          "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                          "mkldnn_enabled": torch.backends.mkldnn.is_available()}}


def _sync_for(device: str):
    torch, _, _ = _import()
    if device == "cuda":
        return lambda outputs: torch.cuda.synchronize()
    return lambda outputs: None  # CPU kernels have finished when the Python call returns


def _build(cfg, wl: Workload, device: str, variant: str):
    """``(model, train, evaluate)``: ``train(hidden, batch) -> (loss, hidden)`` and ``evaluate(batch)`` call
    the trainer's ``train_step`` / ``eval_step`` on the variant's model (or the compiled step itself)."""
    torch, tmodel, ttrain = _import()
    model = tmodel.model_from_config(cfg, wl.vocab_size)
    tmodel.load_params(model, wl.params())
    model.to(device=device, dtype=ttrain.resolve_dtype(cfg.dtype))
    optimizer = ttrain.make_optimizer(model, cfg)
    torch.manual_seed(cfg.seed)  # dropout's stream, as the trainer seeds it
    packed = cfg.padding == "right"
    train_step, eval_step, runnable = ttrain.train_step, ttrain.eval_step, model
    if variant in ("compile", "compile-rnn"):
        torch._dynamo.config.allow_rnn = variant == "compile-rnn"
        runnable = torch.compile(model)
    elif variant == "compile-step":
        train_step, eval_step = torch.compile(ttrain.train_step), torch.compile(ttrain.eval_step)
    elif variant != "eager":
        raise ConfigError(f"unknown PyTorch variant {variant!r} (known: {', '.join(VARIANTS)})")
    return (model, lambda hidden, batch: train_step(runnable, optimizer, hidden, batch, cfg),
            lambda batch: eval_step(runnable, batch, packed=packed))


def _dynamo_counters() -> dict:
    """What Dynamo did in this process: frames seen and traced, graphs captured, graph breaks by reason,
    and what it refused to trace ("unimplemented", e.g. ``nn.LSTM``), each reason's first line."""
    from torch._dynamo.utils import counters

    def by_reason(group: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for reason, n in counters.get(group, {}).items():
            key = reason.strip().splitlines()[0][:160] if reason.strip() else "?"
            out[key] = out.get(key, 0) + n
        return out

    return {"frames_total": counters["frames"].get("total", 0), "frames_ok": counters["frames"].get("ok", 0),
            "unique_graphs": counters["stats"].get("unique_graphs", 0),
            "graph_breaks": sum(counters["graph_break"].values()),
            "graph_break_reasons": by_reason("graph_break"), "unimplemented": by_reason("unimplemented")}


def run_variant(cfg, wl: Workload, info: dict, variant: str, *, warmup: int, steps: int, block: int,
                phases: tuple[str, ...] = ("eval", "train")) -> dict:
    """Time ``phases`` (inference first: its peak memory is read before training raises it)."""
    torch, _, _ = _import()
    device = info["device"]
    sync = _sync_for(device)
    t0 = time.perf_counter()
    model, train, evaluate = _build(cfg, wl, device, variant)
    out: dict[str, Any] = {"build_s": time.perf_counter() - t0, "baseline_rss_mb": current_rss_mb(),
                           "lstm_impl": "nn.LSTM"}
    for phase in phases:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            if phase == "eval":
                batches = wl.eval

                def step(i):
                    return evaluate(batches[(i + 1) % len(batches)])

                first = lambda: evaluate(batches[0])  # noqa: E731
            else:
                batches, starts = wl.train, wl.new_epoch
                hidden = [None]

                def step(i):
                    k = (i + 1) % len(batches)
                    if starts[k]:  # zeros at each epoch's start, as the trainer does
                        hidden[0] = model.init_hidden(cfg.batch_size)
                    loss, hidden[0] = train(hidden[0], batches[k])
                    return loss

                def first():
                    hidden[0] = model.init_hidden(cfg.batch_size)
                    loss, hidden[0] = train(hidden[0], batches[0])
                    return loss

            result = measure_phase(first, step, sync, warmup=warmup, steps=steps, block=block)
            result["peak_rss_mb"] = peak_rss_mb()
            if device == "cuda":
                result["peak_device_mb"] = torch.cuda.max_memory_allocated() / 2**20
            if variant != "eager":
                result["compile_s"] = result["first_step_s"]  # Dynamo/Inductor compile inside the first call
        except Exception as err:  # a variant that fails is a result, not a crash
            result = {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"}
        out[phase] = result
    if variant != "eager":
        out["compile_info"] = _dynamo_counters()
    return out


def parity_losses(cfg, wl: Workload, info: dict, steps: int) -> list[float]:
    """Losses of ``steps`` training steps from the shared initial weights with dropout 0 (eager)."""
    torch, tmodel, ttrain = _import()
    cfg0 = cfg.replace(dropout=0.0, fc_dropout=0.0)
    model = tmodel.model_from_config(cfg0, wl.vocab_size)
    tmodel.load_params(model, wl.params())
    model.to(device=info["device"], dtype=ttrain.resolve_dtype(cfg0.dtype))
    optimizer = ttrain.make_optimizer(model, cfg0)
    losses = []
    hidden = None
    for k in range(steps):
        if wl.new_epoch[k]:
            hidden = model.init_hidden(cfg0.batch_size)
        loss, hidden = ttrain.train_step(model, optimizer, hidden, wl.train[k], cfg0)
        losses.append(float(loss))
    return losses


def gemm_gflop_s(info: dict, n: int, repeats: int) -> float:
    """Best float32 ``(n, n) @ (n, n)`` rate of ``torch.matmul`` on the benchmark device, GFLOP/s."""
    torch, _, _ = _import()
    device = info["device"]
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)
    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    torch.matmul(a, b)
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9

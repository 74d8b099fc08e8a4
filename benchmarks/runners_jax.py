"""The JAX/Flax twin, timed through the functions its trainer uses.

``jax_impl.model.model_from_config`` builds the model; ``jax_impl.step.create_train_state`` starts from the
shared initial weights; the jitted functions from ``make_train_step`` / ``make_eval_step`` are timed as
the trainer calls them: ``train_step(state, zero_carry/carry, batch_to_device(batch, device), base_key)``
and ``eval_step(params, padded_eval_batch(batch, B, device))``, the host-to-device copy of each batch
inside the timed step (as ``torch_impl.step.train_step`` converts its batch too). Compilation is timed
explicitly and apart: ``jitted.lower(...)`` then ``.compile()``; the first call after it (which reuses that
executable) is reported as the first step.

Variants: ``jit`` (the model as the trainer builds it); ``unroll-K`` (the time-step scan unrolled K
steps per loop iteration) where ``jax_impl.model.SentimentRNN`` has an ``unroll`` field.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from benchmarks.measure import current_rss_mb, measure_phase, peak_rss_mb
from benchmarks.workload import Workload
from common.errors import ConfigError


def _import():
    import jax  # noqa: F401  (imported here so the bench runs without JAX when it is not asked for)
    from jax_impl import model as jmodel, step as jstep
    return jax, jmodel, jstep


def unroll_of(variant: str) -> int | None:
    """``'jit'`` → None (the model as the trainer builds it: the fast recurrence); ``'scan'`` → 1 and
    ``'unroll-8'`` → 8 (the reference ``nn.RNN`` scan path, its loop unrolled that many steps)."""
    if variant == "jit":
        return None
    if variant == "scan":
        return 1
    k = variant[len("unroll-"):]
    if variant.startswith("unroll-") and k.isdigit() and int(k) > 0:
        return int(k)
    raise ConfigError(f"unknown JAX variant {variant!r} (known: jit, scan, unroll-K with K >= 1)")


def setup(device: str, threads: int, allow_tf32: bool) -> dict:
    """Fix the default matmul precision and pick the device as the trainer does (``resolve_device``).

    Threads: XLA's CPU client sizes its intra-op pool from the CPUs the process may run on; the worker
    pins itself to ``threads`` CPUs before importing JAX (jax has no direct setting)."""
    jax, jmodel, jstep = _import()
    jax.config.update("jax_default_matmul_precision", "tensorfloat32" if allow_tf32 else "highest")
    dev = jstep.resolve_device(device)  # ConfigError when JAX cannot see that platform
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"device": "cuda" if dev.platform == "gpu" else dev.platform,
            "device_name": dev.device_kind if dev.platform != "cpu" else "cpu", "jax_device": dev,
            "threads": {"xla_cpu_pool": affinity, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")},
            "precision": {"jax_default_matmul_precision": str(jax.config.jax_default_matmul_precision),
                          "jax_impl_dense_precision": str(getattr(jmodel, "PRECISION", None))}}


def _model(cfg, vocab_size: int, unroll: int | None):
    _, jmodel, _ = _import()
    model = jmodel.model_from_config(cfg, vocab_size)
    if unroll is not None:
        if "unroll" not in {f.name for f in dataclasses.fields(jmodel.SentimentRNN)}:
            raise ConfigError("unavailable: jax_impl.model.SentimentRNN has no 'unroll' field")
        model = model.clone(unroll=unroll, lstm_impl="scan")  # the reference nn.RNN scan path
    return model


def run_variant(cfg, wl: Workload, info: dict, variant: str, *, warmup: int, steps: int, block: int,
                phases: tuple[str, ...] = ("eval", "train")) -> dict:
    """Time ``phases`` (inference first: its peak memory is read before training raises it)."""
    jax, _, jstep = _import()
    device = info["jax_device"]
    jstep.resolve_dtype(cfg.dtype)
    with jax.default_device(device):
        return _run(jax, jstep, cfg, wl, device, variant, warmup=warmup, steps=steps, block=block, phases=phases)


def _run(jax, jstep, cfg, wl, device, variant, *, warmup, steps, block, phases) -> dict:
    sync = jax.block_until_ready
    t0 = time.perf_counter()
    model = _model(cfg, wl.vocab_size, unroll_of(variant))
    state = jstep.create_train_state(model, cfg, wl.params(), device)
    base_key = jax.device_put(jax.random.key(cfg.seed), device)
    jax.block_until_ready(state)
    out: dict[str, Any] = {"build_s": time.perf_counter() - t0, "baseline_rss_mb": current_rss_mb(),
                           "lstm_impl": model.lstm_impl}
    box = {"state": state, "carry": None}
    B = cfg.batch_size
    for phase in phases:
        try:
            if phase == "eval":
                eval_step = jstep.make_eval_step(model, cfg)
                batches = wl.eval
                params = box["state"].params
                t = time.perf_counter()
                lowered = eval_step.lower(params, jstep.padded_eval_batch(batches[0], B, device))
                lower_s = time.perf_counter() - t
                lowered.compile()
                compile_s = time.perf_counter() - t

                def step(i):
                    return eval_step(params, jstep.padded_eval_batch(batches[(i + 1) % len(batches)], B, device))

                first = lambda: eval_step(params, jstep.padded_eval_batch(batches[0], B, device))  # noqa: E731
            else:
                train_step = jstep.make_train_step(model, cfg)
                batches, starts = wl.train, wl.new_epoch
                t = time.perf_counter()
                lowered = train_step.lower(box["state"], jstep.zero_carry(model, B, device),
                                           jstep.batch_to_device(batches[0], device), base_key)
                lower_s = time.perf_counter() - t
                lowered.compile()
                compile_s = time.perf_counter() - t

                def run(k):
                    # Zeros at each epoch's start, and at every batch with --carry reset, as the trainer does.
                    if box["carry"] is None or starts[k] or cfg.carry == "reset":
                        box["carry"] = jstep.zero_carry(model, B, device)
                    box["state"], box["carry"], metrics = train_step(
                        box["state"], box["carry"], jstep.batch_to_device(batches[k], device), base_key)
                    return metrics  # one executable: its outputs are ready together

                def step(i):
                    return run((i + 1) % len(batches))

                def first():
                    box["carry"] = None
                    return run(0)

            result = measure_phase(first, step, sync, warmup=warmup, steps=steps, block=block)
            result.update(compile_s=compile_s, lower_s=lower_s, peak_rss_mb=peak_rss_mb())
            stats = device.memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                result["peak_device_mb"] = stats["peak_bytes_in_use"] / 2**20
        except ConfigError as err:
            result = {"error": str(err)}
        except Exception as err:  # a variant that fails is a result, not a crash
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
            result = {"error": f"{type(err).__name__}: {first_line}"}
        out[phase] = result
    return out


def parity_losses(cfg, wl: Workload, info: dict, steps: int) -> list[float]:
    """Losses of ``steps`` training steps from the shared initial weights with dropout 0."""
    jax, _, jstep = _import()
    device = info["jax_device"]
    cfg0 = cfg.replace(dropout=0.0, fc_dropout=0.0)
    with jax.default_device(device):
        model = _model(cfg0, wl.vocab_size, None)
        state = jstep.create_train_state(model, cfg0, wl.params(), device)
        train_step = jstep.make_train_step(model, cfg0)
        base_key = jax.device_put(jax.random.key(cfg0.seed), device)
        losses, carry = [], None
        for k in range(steps):
            if carry is None or wl.new_epoch[k] or cfg0.carry == "reset":
                carry = jstep.zero_carry(model, cfg0.batch_size, device)
            state, carry, metrics = train_step(state, carry, jstep.batch_to_device(wl.train[k], device), base_key)
            losses.append(float(metrics.loss))
    return losses


def gemm_gflop_s(info: dict, n: int, repeats: int) -> float:
    """Best float32 ``(n, n) @ (n, n)`` rate of a jitted ``jnp.matmul`` (precision as set), GFLOP/s."""
    jax, _, _ = _import()
    import jax.numpy as jnp
    device = info["jax_device"]
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.device_put(jax.random.normal(ka, (n, n), jnp.float32), device)
    b = jax.device_put(jax.random.normal(kb, (n, n), jnp.float32), device)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9

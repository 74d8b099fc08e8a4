"""Data-parallel scaling: each twin's training throughput on 1, 2, ... devices, at a fixed global batch.

    rows = measure_scaling(["jax", "torch"], [1, 2], cfg, steps=20)   # one fresh process (group) per point
    print(scaling_table(rows))
    scaling_plot(rows, Path("scaling.png"))

Each point runs the twins' own training step, as their trainers call it, in fresh processes:

- JAX: one process, ``jax_impl.step.make_train_step`` on ``jax_impl.distributed.placement`` with
  ``--devices N``; ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` gives the CPU N simulated devices
  (on a GPU or TPU host the real devices are used and the flag changes nothing).
- PyTorch: N processes started as torchrun starts them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``), each running ``torch_impl.step.train_step`` through
  DistributedDataParallel (gloo on the CPU, NCCL on GPUs) on its slice of every global batch, plus the
  all-reduce of the loss the trainer does; N = 1 is the plain single process.

A step's time is from handing the batch over to having the loss on the host (the trainer's one sync per
step); the median over ``steps`` timed steps, after ``warmup`` untimed ones (compilation, allocator
warm-up). Strong scaling: the global batch stays ``cfg.batch_size``, so the ideal is N times the 1-device
throughput, and ``efficiency`` = throughput / (N x the smallest count's throughput per device).
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from common.config import Config

REPO_ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("jax", "torch")


# ---------------------------------------------------------------- the parent side


def measure_scaling(frameworks: Sequence[str], device_counts: Sequence[int], cfg: Config, steps: int = 20,
                    warmup: int = 3, threads: int | None = None, timeout_s: float = 1800) -> list[dict]:
    """One row per (framework, device count): ``framework``, ``devices``, ``status`` ('ok', 'failed' or
    'skipped'), ``step_ms`` (median), ``samples_per_s`` (global batch / median step), ``efficiency``,
    ``platform``, ``batch_size``, ``steps``, ``threads``; ``error`` when not ok.

    ``threads``: CPU threads of each PyTorch process (and the *_NUM_THREADS of every worker); default the
    usable CPUs divided by N, so every point has the same cores in total."""
    rows = []
    for framework in frameworks:
        if framework not in FRAMEWORKS:
            raise ValueError(f"unknown framework {framework!r} (expected one of {FRAMEWORKS})")
        for n in device_counts:
            row = {"framework": framework, "devices": n, "batch_size": cfg.batch_size, "steps": steps,
                   "threads": threads or max(1, _usable_cpus() // max(n, 1))}
            if n < 1 or cfg.batch_size % n:
                rows.append({**row, "status": "skipped",
                             "error": f"global batch {cfg.batch_size} does not split over {n} devices"})
                continue
            job = {"framework": framework, "devices": n, "config": cfg.replace(devices=n).to_dict(), "steps": steps,
                   "warmup": warmup, "threads": row["threads"]}
            result = _run_point(job, timeout_s)
            if "error" in result:
                rows.append({**row, "status": "failed", "error": result["error"]})
                continue
            step_s = statistics.median(result["step_s"])
            rows.append({**row, "status": "ok", "platform": result["platform"], "step_ms": 1e3 * step_s,
                         "samples_per_s": cfg.batch_size / step_s})
    _add_efficiency(rows)
    return rows


def _add_efficiency(rows: list[dict]) -> None:
    """Throughput per device relative to the smallest measured count of the same framework (1 = linear)."""
    for framework in {r["framework"] for r in rows}:
        ok = sorted((r for r in rows if r["framework"] == framework and r["status"] == "ok"),
                    key=lambda r: r["devices"])
        if not ok:
            continue
        base = ok[0]["samples_per_s"] / ok[0]["devices"]
        for r in ok:
            r["efficiency"] = r["samples_per_s"] / (r["devices"] * base)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(job: dict) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(job["threads"])
    if job["framework"] == "jax":
        # Only the host (CPU) platform reads it; a GPU/TPU host's real devices are unaffected.
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            f" --xla_force_host_platform_device_count={job['devices']}").strip()
    return env


def _run_point(job: dict, timeout_s: float) -> dict:
    """Run one measurement: one JAX process, or N PyTorch ranks. The worker's result, or {"error": ...}."""
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        job_file, result_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps(job), encoding="utf-8")
        command = [sys.executable, "-m", "benchmarks.scaling", "--worker", str(job_file), str(result_file)]
        env = _environment(job)
        ranks = job["devices"] if job["framework"] == "torch" and job["devices"] > 1 else 0
        if ranks:  # torchrun's contract, without the launcher
            rendezvous = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": str(_free_port())}
            envs = [{**env, **rendezvous, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(ranks)]
        else:
            envs = [env]
        logs = [open(Path(tmp) / f"stderr-{i}.txt", "w+", encoding="utf-8") for i in range(len(envs))]
        procs = [subprocess.Popen(command, cwd=REPO_ROOT, env=e, stdout=subprocess.DEVNULL, stderr=log)
                 for e, log in zip(envs, logs)]
        deadline = time.monotonic() + timeout_s
        try:
            for proc in procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f}s"}
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            tails = []
            for log in logs:
                log.seek(0)
                tails.append(log.read().strip().splitlines()[-5:])
                log.close()
        failed = [i for i, p in enumerate(procs) if p.returncode != 0]
        if failed or not result_file.exists():
            detail = " | ".join(tails[failed[0] if failed else 0]) or "no result written"
            return {"error": f"exit status {procs[failed[0]].returncode if failed else 0}: {detail}"}
        return json.loads(result_file.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- the worker side


def _training_batches(cfg: Config, n: int):
    """The first ``n`` training batches in training order (epoch 0's, cycled if it has fewer), and the data."""
    from common.batches import batches
    from common.data import prepare_data

    data = prepare_data(cfg)
    epoch = list(batches(data.train, cfg.batch_size, shuffle_seed=cfg.seed, epoch=0))
    if not epoch:
        raise ValueError(f"the training split has fewer than {cfg.batch_size} examples")
    return data, [epoch[i % len(epoch)] for i in range(n)]


def _time_jax(cfg: Config, steps: int, warmup: int) -> dict:
    import jax

    from common.params import init_params
    from jax_impl.distributed import placement
    from jax_impl.model import model_from_config
    from jax_impl.step import (batch_to_device, create_train_state, make_train_step, resolve_device, resolve_dtype,
                               zero_carry)

    resolve_dtype(cfg.dtype)
    device = resolve_device(cfg.device)
    data, train_batches = _training_batches(cfg, warmup + steps)
    place = placement(cfg, device)
    model = model_from_config(cfg, len(data.vocab))
    neutral = init_params(len(data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=cfg.seed)
    train_step = make_train_step(model, cfg)
    state = create_train_state(model, cfg, neutral, place.replicated)
    carry = zero_carry(model, cfg.batch_size, place.data)
    key = jax.device_put(jax.random.key(cfg.seed), place.replicated)
    times = []
    for batch in train_batches:
        tic = time.perf_counter()
        state, carry, metrics = train_step(state, carry, batch_to_device(batch, place.data), key)
        float(metrics.loss)  # the trainer's one host sync per step
        times.append(time.perf_counter() - tic)
    return {"step_s": times[warmup:], "platform": device.platform, "devices": place.devices}


def _time_torch(cfg: Config, steps: int, warmup: int) -> dict | None:
    import torch
    import torch.distributed as dist

    from torch_impl.distributed import join_process_group, leave_process_group, world_from_environment, wrap
    from torch_impl.model import model_from_config
    from torch_impl.step import make_optimizer, resolve_device, resolve_dtype, train_step

    world = world_from_environment()
    device = resolve_device(cfg.device)
    if world is not None:
        device = join_process_group(world, device)
    try:
        data, train_batches = _training_batches(cfg, warmup + steps)
        model = model_from_config(cfg, len(data.vocab)).to(device=device, dtype=resolve_dtype(cfg.dtype))
        optimizer = make_optimizer(model, cfg)
        trained = model if world is None else wrap(model)
        hidden = model.init_hidden(cfg.batch_size // (world.size if world else 1))
        torch.manual_seed(cfg.seed)
        if world is not None:
            dist.barrier()  # start the clock together
        times = []
        for batch in train_batches:
            if world is not None:
                batch = world.part(batch)
            tic = time.perf_counter()
            loss, hidden = train_step(trained, optimizer, hidden, batch, cfg)
            (loss if world is None else world.mean(loss)).item()  # the trainer's one host sync per step
            times.append(time.perf_counter() - tic)
    finally:
        if world is not None:
            leave_process_group()
    if world is not None and not world.is_main:
        return None
    return {"step_s": times[warmup:], "platform": device.type, "devices": world.size if world else 1}


def _worker(job_file: str, result_file: str) -> int:
    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    cfg = Config(**job["config"])
    if job["framework"] == "jax":
        result = _time_jax(cfg, job["steps"], job["warmup"])
    else:
        import torch

        torch.set_num_threads(job["threads"])
        result = _time_torch(cfg, job["steps"], job["warmup"])
    if result is not None:
        Path(result_file).write_text(json.dumps(result), encoding="utf-8")
    return 0


# ---------------------------------------------------------------- table and plot


def scaling_caption(rows: Sequence[dict]) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    batch = ok[0]["batch_size"] if ok else (rows[0]["batch_size"] if rows else "?")
    text = (f"Data-parallel scaling at a fixed global batch of {batch} (strong scaling): training samples per "
            f"second (global batch / median step time) and efficiency = throughput / (N x the 1-device "
            f"throughput); 1.0 is linear speed-up. Threads: the CPU threads of each PyTorch process (the usable "
            f"cores / N unless set; JAX's CPU client sizes its own pool).")
    if any(r.get("platform") == "cpu" for r in ok):
        text += (f" Measured on a CPU ({_usable_cpus()} cores): the N 'devices' (JAX: simulated with "
                 "--xla_force_host_platform_device_count; PyTorch: N gloo processes) share those same cores, so "
                 "this measures the overhead of data parallelism (splitting the batch, the gradient all-reduce), "
                 "not a speed-up.")
    return text


def scaling_table(rows: Sequence[dict]) -> str:
    """A Markdown table (caption first): one line per framework and device count."""
    lines = [f"*{scaling_caption(rows)}*", "",
             "| framework | devices | threads | step (ms) | samples/s | efficiency |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["status"] == "ok":
            lines.append(f"| {r['framework']} | {r['devices']} | {r['threads']} | {r['step_ms']:.1f} | "
                         f"{r['samples_per_s']:.0f} | {r['efficiency']:.2f} |")
        else:
            lines.append(f"| {r['framework']} | {r['devices']} | {r['threads']} | {r['status']}: "
                         f"{r.get('error', '')} | | |")
    return "\n".join(lines)


def scaling_plot(rows: Sequence[dict], path: Path) -> Path | None:
    """Throughput against device count per framework (dashed: linear from the smallest count), and efficiency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return None
    colors = {"torch": "#ee4c2c", "jax": "#3d7ebf"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for framework in sorted({r["framework"] for r in ok}):
        own = sorted((r for r in ok if r["framework"] == framework), key=lambda r: r["devices"])
        n = [r["devices"] for r in own]
        color = colors.get(framework)
        left.plot(n, [r["samples_per_s"] for r in own], "o-", color=color, label=framework)
        left.plot(n, [own[0]["samples_per_s"] * d / own[0]["devices"] for d in n], "--", color=color, alpha=0.5)
        right.plot(n, [r["efficiency"] for r in own], "o-", color=color, label=framework)
    left.set(xlabel="devices", ylabel="samples / s", title="throughput (dashed: linear)")
    right.set(xlabel="devices", ylabel="efficiency", title="efficiency (1 = linear)",
              ylim=(0, max(1.1, 1.05 * max(r["efficiency"] for r in ok))))
    for ax in (left, right):
        ax.set_xticks(sorted({r["devices"] for r in ok}))
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle("data-parallel scaling" + (" (CPU: overhead, not speed-up)" if any(
        r.get("platform") == "cpu" for r in ok) else ""))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python -m benchmarks.scaling --worker JOB.json RESULT.json (called by measure_scaling)")

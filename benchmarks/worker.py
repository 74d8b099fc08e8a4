"""One benchmark job in a fresh process: ``python -m benchmarks.worker JOB.json RESULT.json``.

A fresh process per (framework, variant, configuration) makes each variant's peak memory its own and keeps
compiled code, caches and global switches (``torch._dynamo.config``) from leaking between variants. The
job is a JSON object (see ``benchmarks.plan.Job``); the result is written as JSON; progress lines
(``@@progress N``) go to stdout for the parent's progress bar.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from common.config import Config
from common.errors import UserError


def _pin_cpus(threads: int) -> None:
    """Restrict this process to ``threads`` CPUs: XLA sizes its CPU thread pool from the affinity."""
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[:threads])


def run_job(job: dict) -> dict:
    from benchmarks import peak
    from benchmarks.workload import load_workload

    _pin_cpus(job["threads"])
    framework = job["framework"]
    if framework == "torch":
        from benchmarks import runners_torch as runner
    else:
        from benchmarks import runners_jax as runner
    t0 = time.perf_counter()
    info = runner.setup(job["device"], job["threads"], job["allow_tf32"])
    info["import_s"] = time.perf_counter() - t0
    cfg = Config(**job["config"])
    steps, warmup = job["steps"], job["warmup"]
    # Distinct batches for the first step, warm-up and timed steps, and for the parity run; the timed
    # loop cycles through them when whole blocks need a few more.
    n_train = max(1 + warmup + steps, job["parity_steps"])
    wl = load_workload(cfg, n_train, min(n_train, 1 + warmup + steps))
    result = {"info": {k: v for k, v in info.items() if k != "jax_device"}, "vocab_size": wl.vocab_size}
    result.update(runner.run_variant(cfg, wl, info, job["variant"], warmup=warmup, steps=steps,
                                     block=job["block"], phases=tuple(job["phases"])))
    if job["parity_steps"]:
        try:
            result["parity_losses"] = runner.parity_losses(cfg, wl, info, job["parity_steps"])
        except Exception as err:
            result["parity_error"] = f"{type(err).__name__}: {err}"
    if job["gemm"]:
        n = peak.gemm_size(info["device"], job["quick"])
        gemm = {framework: {"gflop_s": runner.gemm_gflop_s(info, n, peak.GEMM_REPEATS), "n": n,
                            "device": info["device"]}}
        n_host = peak.gemm_size("cpu", job["quick"])
        gemm["numpy"] = {"gflop_s": peak.numpy_gemm_gflop_s(n_host), "n": n_host, "device": "cpu"}
        result["gemm"] = gemm
    return result


def main(argv: list[str]) -> int:
    job_path, result_path = Path(argv[0]), Path(argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    try:
        result = run_job(job)
    except UserError as err:
        result = {"user_error": str(err)}
    except ImportError as err:
        result = {"error": f"ImportError: {err}"}
    except Exception as err:
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
    result_path.write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

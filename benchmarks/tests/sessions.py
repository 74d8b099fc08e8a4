"""Synthetic sessions for the results and reports tests, built in code: a baseline (torch:eager, 0.2 s a training
step), jax:jit at twice its speed, and jax:cudnn skipped as on a CPU; no worker runs."""
from __future__ import annotations

from dataclasses import asdict

from benchmarks import results
from benchmarks.schema import EntryResult, Round, Session, Setup
from common.config import Config

CFG = Config(batch_size=4, seq_len=10, embed_dim=8, hidden_dim=16, layers=2).to_dict()
KERNELS = {"nn.LSTM": ["aten::lstm", "aten::mkldnn_rnn_layer"], "fused": ["impl:fused"], "scan": ["impl:scan"],
           "flax": ["impl:flax"]}


def entry(label, train_s, eval_s, lstm_impl="nn.LSTM", flush=True, replicate=1, device="cpu",
          kernels=None) -> EntryResult:
    """One replicate that ran: ``train_s`` and ``eval_s`` its seconds per round."""
    setup = Setup(vocab_size=30, record={"lstm_impl": lstm_impl, "flush_denormal": flush, "allow_tf32": False},
                  info={"device": device, "device_name": device},
                  phases={k: {"first_step_s": 0.5, "peak_rss_mb": 300.0} for k in ("train", "eval")},
                  provenance={"kernels": KERNELS[lstm_impl] if kernels is None else kernels, "float_while_loops": 2,
                              "custom_calls": []})
    return EntryResult(label, replicate, "ok", None, setup, {"train": train_s, "eval": eval_s},
                       {"train": 3, "eval": 5})


def nnx_entry(train_s, eval_s, overhead_ms: float = 0.75) -> EntryResult:
    """jax:nnx as its worker reports it: Flax's cell through the NNX API, and nnx.jit's overhead measured apart (a
    call under nnx.jit taking twice the ``overhead_ms`` one through nnx.cached_partial takes)."""
    e = entry("jax:nnx", train_s, eval_s, "flax", kernels=["impl:nnx.flax"])
    e.setup.record["flax_api"] = "nnx"
    e.setup.phases["train"].update(nnx_dispatch_ms={"nnx.jit": 2 * overhead_ms, "nnx.cached_partial": overhead_ms},
                                   nnx_overhead_ms=overhead_ms)
    return e


def session(n=5, **entries: EntryResult) -> Session:
    """The baseline, jax:jit and a skipped jax:cudnn over ``n`` rounds (the fifth busy), and ``entries`` besides."""
    rounds = [Round([], 0.1 * i, i == 4) for i in range(n)]
    base = [entry("torch:eager", [0.2] * n, [0.10] * n),
            entry("jax:jit", [0.1] * n, [0.05, 0.10, 0.05, 0.10, 0.05][:n], "fused"),
            EntryResult("jax:cudnn", 1, "skipped", "cudnn LSTM needs a CUDA GPU; this backend is cpu")]
    by_key = {f"{e.label}#{e.replicate}": e for e in [*base, *entries.values()]}
    return Session(by_key, {"eval": rounds, "train": rounds})


def configs(s: Session) -> dict:
    """Every variant of ``s`` at :data:`CFG`."""
    return {e.label: CFG for e in s.entries.values()}


def results_doc(s: Session, sweep=None) -> dict:
    """The part of a results document that the reports and the cross-run tools read: rows, comparisons, environment."""
    rows = results.rows_for(s, configs(s), sweep, None)
    return {"results": [asdict(r) for r in rows], "comparisons": [asdict(c) for c in
                                                                 results.comparisons_for(s, sweep)],
            "environment": {"date": "d", "cpu_model": "AMD EPYC", "devices": {"torch": "cpu"}}}

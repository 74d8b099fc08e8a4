"""Result rows, the GEMM peak and the parity summary, from synthetic worker results (no worker runs)."""
import pytest

from benchmarks import plan, report
from benchmarks.peak import combine
from common.config import Config

CFG = Config(batch_size=4, seq_len=10, embed_dim=8, hidden_dim=16, layers=2)


def _job(framework="torch", variant="eager", parity_steps=0):
    return plan.Job(framework, variant, CFG.to_dict(), steps=20, warmup=2, block=0, parity_steps=parity_steps,
                    gemm=False, quick=False, device="cpu", threads=2, allow_tf32=False)


def _phase(median):
    return {"first_step_s": 0.5, "step_s": {"median": median, "p25": median * 0.9, "p75": median * 1.1},
            "steps": 20, "block": 1, "peak_rss_mb": 300.0}


def test_row_derives_throughput_flops_and_utilisation_from_the_median():
    result = {"info": {"device": "cpu"}, "train": _phase(0.02), "eval": _phase(0.01)}
    row = report._row(_job(), result, "train", peak_gflop_s=10.0)
    gflop = 3 * (2 * 4 * 10 * 64 * (8 + 16) + 2 * 4 * 10 * 64 * (16 + 16) + 2 * 4 * 16) / 1e9
    assert row["gflop_per_step"] == pytest.approx(gflop, rel=1e-12)
    assert row["samples_per_s"] == pytest.approx(4 / 0.02)
    assert row["tokens_per_s"] == pytest.approx(40 / 0.02)
    assert row["achieved_gflop_s"] == pytest.approx(gflop / 0.02)
    assert row["utilisation"] == pytest.approx(gflop / 0.02 / 10.0)
    assert (row["peak_mem_mb"], row["mem_kind"], row["status"]) == (300.0, "process peak RSS", "ok")


def test_failed_phase_becomes_a_row_with_its_reason_and_no_numbers():
    result = {"info": {"device": "cpu"}, "train": {"error": "RuntimeError: boom"}, "eval": _phase(0.01)}
    row = report._row(_job(variant="compile"), result, "train", peak_gflop_s=10.0)
    assert (row["status"], row["error"], row["step_s"], row["utilisation"]) == ("failed", "RuntimeError: boom",
                                                                             None, None)
    timed_out = report._row(_job(), {"error": "timeout: stopped after 9 s", "timed_out": True}, "eval", 10.0)
    assert timed_out["status"] == "timeout"


def test_gemm_peak_is_the_best_measurement_on_the_benchmark_device():
    measured = {"torch": {"gflop_s": 90.0, "n": 8, "device": "cuda"},
                "numpy": {"gflop_s": 120.0, "n": 8, "device": "cpu"},  # the host: not the GPU's peak
                "jax": {"gflop_s": 95.0, "n": 8, "device": "cuda"}}
    assert combine(measured, "cuda")["gflop_s"] == 95.0 and combine(measured, "cuda")["backend"] == "jax"
    assert combine(measured, "cpu")["backend"] == "numpy"


def test_parity_reports_the_largest_loss_difference():
    jobs = [_job("torch", "eager", parity_steps=3), _job("jax", "jit", parity_steps=3)]
    results = [{"parity_losses": [0.7, 0.6, 0.5]}, {"parity_losses": [0.7, 0.6000004, 0.4999999]}]
    out = report.parity(jobs, results, 3, ["torch", "jax"])
    assert out["status"] == "ok"
    assert out["max_abs_dloss"] == pytest.approx(4e-7, rel=1e-3)
    assert report.parity(jobs[:1], results[:1], 3, ["torch"])["status"].startswith("skipped")


def _sweep_doc():
    """A results document as build_document makes it, for a base run and one sweep point per twin."""
    def row(framework, variant, hidden, sweep, median):
        cfg = {"batch_size": 4, "seq_len": 10, "embed_dim": 8, "hidden_dim": hidden, "layers": 2}
        return {"framework": framework, "variant": variant, "step": "train", "config": cfg, "sweep": sweep,
                "status": "ok", "error": None, "step_s": {"median": median, "p25": median, "p75": median},
                "samples_per_s": 4 / median, "gflop_per_step": 1.0, "achieved_gflop_s": 1.0 / median,
                "utilisation": 0.1}
    return {"base_config": CFG.to_dict(), "gemm_peak_gflop_s": 10.0,
            "variants": {"torch:eager": "", "jax:jit": ""},
            "settings": {"sweeps": [{"field": "hidden_dim", "values": [8, 16]}]},
            "results": [row("torch", "eager", 16, None, 0.02), row("jax", "jit", 16, None, 0.01),
                        row("torch", "eager", 8, {"field": "hidden_dim", "value": 8}, 0.015),
                        row("jax", "jit", 8, {"field": "hidden_dim", "value": 8}, 0.008)]}


def test_sweep_table_takes_the_base_value_from_the_base_run(tmp_path):
    rows = report.sweep_tables(_sweep_doc())["hidden_dim"]
    assert [(r[0], r[1], r[3]) for r in rows] == [("8", "torch", "15.0"), ("8", "jax", "8.0"),
                                                  ("16", "torch", "20.0"), ("16", "jax", "10.0")]
    from benchmarks.plots import sweep_chart
    path = sweep_chart(_sweep_doc(), "hidden_dim", tmp_path / "sweep.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_warnings_flag_a_busy_machine_mixed_devices_and_utilisation_above_the_peak():
    environment = {"usable_cpus": 2, "load_average_start": 3.5, "load_average_end": 0.2}
    out = report.warnings(environment, {"torch": "cpu", "jax": "NVIDIA H200"}, [{"utilisation": 1.2}])
    assert len(out) == 3
    assert "different devices" in out[0]
    assert "exceeds the measured GEMM peak" in out[1]
    assert "busy at the start" in out[2]
    assert report.warnings({"usable_cpus": 2, "load_average_start": 0.3}, {"torch": "cpu", "jax": "cpu"},
                           [{"utilisation": 0.4}]) == []

"""A worker that runs past its limit is stopped and becomes a result, not a crash."""
from benchmarks import launch, plan
from common.config import Config


def test_a_worker_past_its_timeout_becomes_a_timeout_result(tmp_path):
    job = plan.Job("torch", "eager", Config(batch_size=4, seq_len=8, embed_dim=4, hidden_dim=4).to_dict(),
                   steps=5, warmup=1, block=0, parity_steps=0, gemm=False, quick=True, device="cpu", threads=1,
                   allow_tf32=False, timeout_s=0.2)  # far less than importing a framework takes
    result = launch.run_job(job, tmp_path)
    assert result["timed_out"] and result["error"] == "timeout: stopped after 0.2 s"
    assert result["wall_s"] < 10

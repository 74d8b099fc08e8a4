"""Sweeps, variant selection and the job list (no worker is started)."""
import pytest

from benchmarks import plan
from common.config import Config
from common.errors import ConfigError


def test_parse_sweep_reads_a_field_with_dashes_and_typed_values():
    sweep = plan.parse_sweep("batch-size=16,50,128", Config())
    assert sweep == plan.Sweep("batch_size", (16, 50, 128))


@pytest.mark.parametrize("spec", ["nonexistent_field=1", "batch_size", "batch_size=", "batch_size=0",
                                  "hidden_dim=big", "padding=diagonal"])
def test_parse_sweep_refuses_bad_specs(spec):
    with pytest.raises(ConfigError, match="--sweep"):
        plan.parse_sweep(spec, Config())


def test_select_variants_default_all_and_named():
    both = ["torch", "jax"]
    assert [v.label for v in plan.select_variants("default", both)] == ["torch:eager", "torch:compile", "jax:jit",
                                                                           "jax:scan"]
    assert len(plan.select_variants("all", both)) == len(plan.VARIANTS)
    assert [v.label for v in plan.select_variants("jit,torch:eager", both)] == ["jax:jit", "torch:eager"]
    with pytest.raises(ConfigError, match="unknown variant"):
        plan.select_variants("torch:fast", both)
    with pytest.raises(ConfigError, match="not among --frameworks"):
        plan.select_variants("torch:eager", ["jax"])


def _settings(**changes):
    base = dict(steps=20, warmup=2, block=0, parity_steps=20, device="cpu", threads=2, allow_tf32=False,
                quick=False, timeout_s=60.0, sweeps=())
    return plan.Settings(**{**base, **changes})


def test_make_jobs_runs_parity_in_main_variants_and_skips_the_base_point_of_a_sweep():
    cfg = Config()
    sweeps = (plan.Sweep("hidden_dim", (128, 256)),)  # 256 is the base: measured by the base run
    variants = plan.select_variants("default", ["torch", "jax"])
    jobs = plan.make_jobs(cfg, variants, ["torch", "jax"], _settings(sweeps=sweeps))
    assert [j.label for j in jobs] == ["torch:eager", "torch:compile", "jax:jit", "jax:scan",
                                       "torch:eager hidden_dim=128", "jax:jit hidden_dim=128"]
    assert [j.parity_steps > 0 for j in jobs] == [True, False, True, False, False, False]
    assert all(j.gemm for j in jobs)  # every job measures the peak; the run keeps the best
    assert jobs[4].config["hidden_dim"] == 128


def test_parse_frameworks_refuses_unknown_names():
    assert plan.parse_frameworks("jax, torch") == ["jax", "torch"]
    with pytest.raises(ConfigError, match="unknown framework 'foo'"):
        plan.parse_frameworks("foo")

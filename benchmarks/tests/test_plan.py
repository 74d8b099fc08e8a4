"""Sweeps and variant selection (no worker is started)."""
import pytest

from benchmarks import bench, plan
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


@pytest.mark.parametrize("spec, message", [
    ("seq_len=10,,20", "--sweep seq_len=10,,20: an empty value in '10,,20'; give a comma list of values"),
    ("seq_len=10,20,", "--sweep seq_len=10,20,: an empty value in '10,20,'; give a comma list of values"),
    ("seq_len=", "--sweep seq_len=: empty; give a comma list of values"),
    ("=1", "--sweep =1: no field named before '='; expected FIELD=V1,V2,... (e.g. batch_size=16,50,128)"),
])
def test_parse_sweep_refuses_an_empty_field_or_value_rather_than_dropping_it(spec, message):
    with pytest.raises(ConfigError) as err:
        plan.parse_sweep(spec, Config())
    assert str(err.value) == message


@pytest.mark.parametrize("spec, message", [
    ("", "--seeds: empty; give a comma list of values"),
    (" , ", "--seeds: an empty value in ' , '; give a comma list of values"),
    ("1,,2", "--seeds: an empty value in '1,,2'; give a comma list of values"),
])
def test_int_list_refuses_an_empty_list_or_value(spec, message):
    with pytest.raises(ConfigError) as err:
        plan.int_list(spec, "--seeds", 0)
    assert str(err.value) == message


def test_comma_list_strips_each_value():
    assert plan.comma_list(" jax , torch ", "--frameworks") == ["jax", "torch"]


def test_select_variants_default_all_and_named():
    both = ["torch", "jax"]
    assert [v.label for v in plan.select_variants("default", both)] == [
        "torch:eager", "torch:compile", "jax:flax", "jax:nnx", "jax:nofold", "jax:fused", "jax:jit", "jax:onednn"]
    assert len(plan.select_variants("all", both)) == len(plan.VARIANTS)
    assert [v.label for v in plan.select_variants("jit,torch:eager", both)] == ["jax:jit", "torch:eager"]
    with pytest.raises(ConfigError, match="unknown variant"):
        plan.select_variants("torch:fast", both)
    with pytest.raises(ConfigError, match="not among --frameworks"):
        plan.select_variants("torch:eager", ["jax"])


def test_each_device_default_holds_its_own_vendor_kernel_row():
    assert [v.label for v in plan.select_variants("default", ["torch", "jax"], "gpu")] == [
        "torch:eager", "torch:compile", "jax:flax", "jax:nnx", "jax:scan", "jax:nofold", "jax:jit", "jax:cudnn"]


def test_every_tier_has_a_row_and_each_label_promises_its_kernel():
    tiers = {v.label: v.tier for v in plan.VARIANTS}
    assert set(tiers.values()) == set(plan.TIERS)
    assert (tiers["torch:eager"], tiers["jax:flax"], tiers["jax:nnx"], tiers["jax:scan"], tiers["jax:jit"],
            tiers["jax:cudnn"]) == ("stock", "stock", "stock", "stock", "tuned", "vendor")
    # The NNX row promises its own provenance tag: a linen run's impl:flax would be a fallback there.
    assert plan.variant("jax:nnx").kernel == {"cpu": "impl:nnx.flax", "gpu": "impl:nnx.flax"}
    assert plan.variant("jax:cudnn").kernel == {"gpu": "dnn_rnn"}  # cuDNN's custom call in the compiled step
    assert plan.variant("torch:eager").kernel == {"gpu": "_cudnn_rnn"}  # nn.LSTM on cuDNN, on a GPU


def test_variants_are_trainer_configs_with_the_stated_change():
    # The bench times only what the trainers run: each row differs from the base Config by named fields.
    assert plan.variant("torch:eager-defaults").changes == {"flush_denormal": False}
    assert plan.variant("jax:nofold").changes == {"lstm_impl": "fused", "embed_fold": False}
    assert plan.variant("jax:fused").changes == {"lstm_impl": "fused"}
    assert plan.variant("torch:compile").changes == {"torch_compile": True}
    assert plan.variant("jax:cudnn").changes == {"lstm_impl": "cudnn"}
    assert plan.variant("jax:flax").changes == {"lstm_impl": "flax"}
    assert plan.variant("jax:nnx").changes == {"flax_api": "nnx"}  # python -m jax_impl.train --flax-api nnx
    assert plan.variant("torch:eager").changes == {} and plan.variant("jax:jit").changes == {}
    assert plan.BASELINE == "torch:eager"


def test_resolve_frameworks_refuses_unknown_names():
    assert bench.resolve_frameworks("jax, torch") == ["jax", "torch"]
    with pytest.raises(ConfigError, match="unknown framework 'foo'"):
        bench.resolve_frameworks("foo")


def test_resolve_frameworks_refuses_an_empty_list_as_variants_does():
    with pytest.raises(ConfigError, match="^--frameworks: empty; give a comma list of values$"):
        bench.resolve_frameworks("")
    with pytest.raises(ConfigError, match="^--variants: empty; give a comma list of values$"):
        plan.select_variants("", ["torch", "jax"])


def test_the_variant_table_says_which_headline_comparisons_each_variant_takes_part_in():
    taking = {key: [v.label for v in plan.VARIANTS if key in v.headline] for key in plan.HEADLINES}
    assert taking == {"stock": ["jax:flax", "jax:nnx", "jax:scan"],
                      "best tuned": ["jax:nofold", "jax:fused", "jax:jit"],
                      "same algorithm": ["jax:nofold"], "vendor kernel": ["jax:cudnn", "jax:onednn"],
                      "compiled": ["torch:compile"], "kernel": ["jax:jit", "jax:kernel"]}
    # A variant is named in a comparison only where its row ran in that comparison's tier.
    assert {k: h.tier for k, h in plan.HEADLINES.items()} == {
        "stock": "stock", "best tuned": "tuned", "same algorithm": "tuned", "vendor kernel": "vendor",
        "compiled": "compiled", "kernel": "kernel"}


def test_every_headline_a_variant_names_has_a_sentence_and_the_wording_its_phrase_asks_for():
    for v in plan.VARIANTS:
        assert set(v.headline) <= set(plan.HEADLINES), v.label
        assert all(v.wording for key in v.headline if "{wording}" in plan.HEADLINES[key].member), v.label


def test_lm_default_holds_the_stock_rows_and_those_it_reports_as_not_serving_it():
    both = ["torch", "jax"]
    assert [v.label for v in plan.select_variants("default", both, "cpu", "lm")] == [
        "torch:eager", "torch:compile", "jax:flax", "jax:scan", "jax:fused", "jax:cudnn", "jax:onednn", "jax:kernel"]
    # --quick leaves out torch:compile (Inductor's compile of the graphs around the recurrence: ~25 s of ~35 s).
    assert "torch:compile" not in [v.label for v in plan.select_variants("default", both, "cpu", "lm", quick=True)]
    assert [v.label for v in plan.select_variants("default", both, "cpu", "classifier", quick=True)] == [
        v.label for v in plan.select_variants("default", both)]  # the classifier's quick run is unchanged
    assert [v.label for v in plan.main_variants(plan.select_variants("default", both, "cpu", "lm"), both, "lm")] == [
        "torch:eager", "jax:flax", "jax:scan"]

"""The one owner of --lstm-impl for both workloads: what the language model may run, and how a refusal reads."""
import pytest

from common.errors import UnsupportedError
from jax_impl.recurrences import choice
from jax_impl.recurrences.choice import Run, auto, obstacle, resolve
from jax_impl.recurrences.layers import LAYERS


def test_the_language_model_runs_every_layer_of_the_interface_and_the_gru_only_the_flax_ones():
    assert choice.IMPLS["lm"] == ("scan", "flax", "fused", "onednn", "kernel")
    assert [impl for impl in LAYERS if "gru" in LAYERS[impl]] == ["scan", "flax"]


@pytest.mark.parametrize("impl", ["fused", "onednn", "kernel"])
def test_a_gru_on_an_lstm_only_recurrence_is_refused_naming_what_runs_it(impl):
    with pytest.raises(UnsupportedError, match=rf"^--lstm-impl {impl}: it computes the LSTM cell only; a GRU runs "
                                               r"scan or flax$"):
        resolve(impl, Run("lm", platform="cpu", cell="gru"))


def test_cudnn_is_the_classifiers_only_saying_why():
    why = obstacle("cudnn", Run("lm", platform="gpu"))
    assert why.startswith("it serves the classifier only: its stack returns the final carries")


def test_the_language_models_auto_is_the_fused_recurrence_for_the_lstm_and_scan_for_the_gru():
    assert auto(Run("lm", platform="cpu"))[0] == "fused"
    assert auto(Run("lm", platform="cpu", cell="gru"))[0] == "scan"
    assert resolve("auto", Run("lm", platform="gpu", cell="gru")) == "scan"


def test_fused_serves_the_language_models_lstm_in_float64_too():
    assert resolve("fused", Run("lm", dtype="float64", platform="cpu")) == "fused"


def test_the_classifiers_conditions_hold_for_the_language_model_too():
    assert obstacle("kernel", Run("lm", dtype="float64", platform="cpu")).startswith("it computes float32 only")
    assert obstacle("onednn", Run("lm", platform="gpu")) == "it is a CPU kernel, and this backend is gpu"

"""The one owner of --lstm-impl for both workloads: the registry, refusals derived from each implementation's
declaration, what the language model may run, and the kernel's forced instruction set."""
import pytest

from common.errors import UnsupportedError
from jax_impl.recurrences import kernel, native
from jax_impl.recurrences.choice import REGISTRY, Run, auto, obstacle, resolve
from jax_impl.recurrences.interface import Recurrence


def test_the_registry_is_the_one_list_and_a_gru_runs_only_scan_and_flax():
    assert list(REGISTRY) == ["fused", "scan", "flax", "cudnn", "onednn", "kernel"]
    assert [name for name, r in REGISTRY.items() if "gru" in r.layers] == ["scan", "flax"]


def test_an_implementations_refusals_are_derived_from_its_declaration(monkeypatch):
    declared = Recurrence("toy", "a declaration only", {"lstm": None}, dtypes=("float32",), platforms=("cpu",),
                          lengths=False, mesh=False, check=lambda dtype: "its library is missing",
                          why={"dtype": "not {dtype}", "platform": "not on {backend}", "lengths": "no lengths",
                               "mesh": "one device"})
    monkeypatch.setitem(REGISTRY, "toy", declared)
    assert obstacle("toy", Run(platform="gpu")) == "not on gpu"
    assert obstacle("toy", Run(dtype="float64", platform="cpu")) == "not float64"
    assert obstacle("toy", Run(platform="cpu", padding="right")) == "no lengths"
    assert obstacle("toy", Run(platform="cpu", devices=2)) == "one device"
    assert obstacle("toy", Run(platform="cpu")) == "its library is missing"
    assert obstacle("toy", Run("lm", platform="cpu", cell="gru")) == ("it computes the LSTM cell only; a GRU runs "
                                                                       "scan or flax")


@pytest.mark.parametrize("impl", ["fused", "onednn", "kernel"])
def test_a_gru_on_an_lstm_only_recurrence_is_refused_naming_what_runs_it(impl):
    with pytest.raises(UnsupportedError, match=rf"^--lstm-impl {impl}: it computes the LSTM cell only; a GRU runs "
                                               r"scan or flax$"):
        resolve(impl, Run("lm", platform="cpu", cell="gru"))


def test_cudnn_serves_the_language_models_lstm_on_a_cuda_gpu_only():
    assert obstacle("cudnn", Run("lm", platform="gpu")) is None
    assert obstacle("cudnn", Run("lm", platform="cpu")) == "it needs a CUDA GPU, and this backend is cpu"


def test_the_language_models_auto_is_the_fused_recurrence_for_the_lstm_and_scan_for_the_gru():
    assert auto(Run("lm", platform="cpu"))[0] == "fused"
    assert auto(Run("lm", platform="cpu", cell="gru"))[0] == "scan"
    assert resolve("auto", Run("lm", platform="gpu", cell="gru")) == "scan"


def test_fused_serves_the_language_models_lstm_in_float64_too():
    assert resolve("fused", Run("lm", dtype="float64", platform="cpu")) == "fused"


def test_the_classifiers_conditions_hold_for_the_language_model_too():
    assert obstacle("kernel", Run("lm", dtype="float64", platform="cpu")).startswith("it computes float32 only")
    assert obstacle("onednn", Run("lm", platform="gpu")) == "it is a CPU kernel, and this backend is gpu"


@pytest.mark.parametrize("value", ["bogus", "AVX2"])
@pytest.mark.parametrize("impl,run", [("auto", Run(platform="cpu")), ("scan", Run(platform="cpu")),
                                      ("auto", Run("lm", platform="cpu", cell="gru"))])
def test_a_forced_isa_that_names_none_is_refused_in_one_line_whatever_runs(monkeypatch, value, impl, run):
    monkeypatch.setenv(kernel.ISA_ENV, value)
    with pytest.raises(UnsupportedError, match=rf"^LSTM_KERNEL_ISA must be one of avx512, avx2, portable, "
                                               rf"got '{value}'$"):
        resolve(impl, run)


def test_under_auto_a_forced_isa_this_cpu_cannot_run_is_refused_not_passed_over(monkeypatch):
    # A CPU without AVX-512, as the kernel's library reports it (this host's may have every set).
    monkeypatch.setenv(kernel.ISA_ENV, "avx512")
    monkeypatch.setattr(native, "unavailable", lambda name: None)
    monkeypatch.setattr(kernel, "isa_problem", lambda: "LSTM_KERNEL_ISA=avx512: this CPU cannot run it (it runs "
                                                       "portable, avx2)")
    with pytest.raises(UnsupportedError, match=r"^LSTM_KERNEL_ISA=avx512: this CPU cannot run it \(it runs "
                                               r"portable, avx2\)$"):
        resolve("auto", Run(platform="cpu"))


def test_the_trainer_under_auto_stops_at_a_bogus_forced_isa_in_one_line_and_exit_status_2(monkeypatch, capsys):
    from jax_impl.train import main
    monkeypatch.setenv(kernel.ISA_ENV, "bogus")
    assert main(["--device", "cpu"]) == 2
    assert capsys.readouterr().err == "error: LSTM_KERNEL_ISA must be one of avx512, avx2, portable, got 'bogus'\n"


def test_the_nnx_model_on_a_flax_without_what_it_calls_is_refused_naming_the_release_it_needs(monkeypatch):
    import importlib.metadata

    from flax import nnx

    monkeypatch.delattr(nnx, "List")
    monkeypatch.delattr(nnx, "as_pure")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"flax": "0.10.7"}[name])
    with pytest.raises(UnsupportedError) as refused:
        resolve("auto", Run(flax_api="nnx"))
    assert str(refused.value) == ("--flax-api nnx: it needs Flax 0.12.7 or later (nnx.List and nnx.as_pure missing "
                                  "in flax 0.10.7); upgrade flax, or leave --flax-api linen")

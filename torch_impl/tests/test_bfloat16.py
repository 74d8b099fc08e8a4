"""--dtype bfloat16: PyTorch's standard mixed precision (float32 parameters, gradients and Adam state; the forward pass
under autocast; the loss in float32 outside it), and a CPU without oneDNN's bfloat16, simulated by capping oneDNN's
instruction set (ONEDNN_MAX_CPU_ISA=AVX2), where autocast alone cannot run nn.LSTM."""
import json
import os
import subprocess
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from common.batches import batches
from common.params import init_params
from common.precision import BFLOAT16_RULES
from torch_impl.numerics import lacks_bfloat16_lstm
from torch_impl.tests.conftest import ROOT, tiny_args
from torch_impl.train import TorchTwin


def one_step(cfg, data):
    twin = TorchTwin(cfg, len(data.vocab), torch.device("cpu"), None)
    state = twin.init_state(init_params(len(data.vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=0))
    batch = next(batches(data.train, cfg.batch_size, shuffle_seed=0))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        state, carry, loss = twin.train_step(state, twin.init_carry(), batch)
    return twin, state, carry, loss, prof.events()


def test_bfloat16_keeps_parameters_gradients_adam_state_and_carry_in_float32(tiny_cfg, tiny_data):
    cfg = tiny_cfg.replace(dropout=0.0, fc_dropout=0.0)
    twin, state, carry, loss, _ = one_step(cfg.replace(dtype="bfloat16"), tiny_data)
    for p in state.model.parameters():
        adam = state.optimizer.state[p]
        assert p.dtype == p.grad.dtype == adam["exp_avg"].dtype == adam["exp_avg_sq"].dtype == torch.float32
    assert carry[0].dtype == carry[1].dtype == torch.float32
    kernel = "native" if lacks_bfloat16_lstm(torch.device("cpu")) else "onednn"
    assert twin.record["lstm_kernel"] == kernel and twin.record["bfloat16"] == BFLOAT16_RULES[kernel]
    # The forward pass really ran in bfloat16: the loss (near ln 2) moves by far more than float32's rounding (6e-8
    # there) and by less than bfloat16's (its probabilities are rounded to 2^-9 ≈ 2e-3).
    _, _, _, loss32, _ = one_step(cfg, tiny_data)
    assert 1e-6 < abs(loss - loss32) < 1e-2


def test_autocast_runs_the_lstm_and_classifier_in_bfloat16_and_the_embedding_and_loss_in_float32(tiny_cfg, tiny_data):
    *_, events = one_step(tiny_cfg.replace(dtype="bfloat16"), tiny_data)
    first_input = {}
    for e in events:  # the innermost call of each op (autocast calls an op again, on the cast inputs)
        if e.input_dtypes and not any(c.name == e.name for c in e.cpu_children):
            first_input.setdefault(e.name, set()).add(e.input_dtypes[0])
    lstm = "aten::mkldnn_rnn_layer" if not lacks_bfloat16_lstm(torch.device("cpu")) else "aten::addmm"
    assert first_input[lstm] == {"c10::BFloat16"} and first_input["aten::sigmoid"] == {"c10::BFloat16"}
    assert first_input["aten::embedding"] == first_input["aten::binary_cross_entropy"] == {"float"}


AVX2_ONLY = """
import torch
from torch_impl.numerics import lacks_bfloat16_lstm
lstm = torch.nn.LSTM(4, 4)
try:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lstm(torch.ones(3, 2, 4))
    print(lacks_bfloat16_lstm(torch.device("cpu")), "autocast ran")
except RuntimeError as err:
    print(lacks_bfloat16_lstm(torch.device("cpu")), "autocast failed:", str(err).split(" for ")[0])
"""


def test_a_cpu_without_onednn_bfloat16_trains_on_the_aten_cell(tiny_cfg, tmp_path):
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    probe = subprocess.run([sys.executable, "-c", AVX2_ONLY], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
    # nn.LSTM picks oneDNN for its float32 input, autocast then hands oneDNN bfloat16, which it cannot compute here.
    assert probe.stdout.strip() == "True autocast failed: could not create a primitive descriptor", probe.stderr
    metrics = tmp_path / "metrics.jsonl"
    run = subprocess.run([sys.executable, "-m", "torch_impl.train", *tiny_args(tiny_cfg), "--dtype", "bfloat16",
                          "--max-steps", "3", "--metrics-out", str(metrics)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    record = json.loads(metrics.read_text().splitlines()[0])["run"]
    assert record["lstm_kernel"] == "native" and record["bfloat16"] == BFLOAT16_RULES["native"]

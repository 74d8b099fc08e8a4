"""The memory check: a run's size estimated from the Config, and a run beyond the machine refused in one line."""
from __future__ import annotations

import os

import pytest

from common import memory
from common.config import Config
from common.errors import ConfigError
from common.tests.conftest import run_python
from common.tests.lm_corpus import lm_args, write_lm_corpus

# Embedding 10×4; layer 0: 12×4 + 12×3 + 2·12; layer 1: 12×3 + 12×3 + 2·12; fc 1×3 + 1: 248 parameters.
SMALL = Config(embed_dim=4, hidden_dim=3, layers=2, seq_len=6, batch_size=5)


def test_the_estimate_counts_parameters_a_batchs_activations_and_the_encoded_texts():
    need = memory.run_bytes(SMALL, vocab_size=10, texts=7)
    assert list(need.values()) == [6 * 4 * 248,  # six float32 copies of each parameter
                                   2 * 4 * 5 * 6 * (4 + 6 * 3 * 2),  # B·T tokens, E + 6H·L floats each, twice
                                   4 * 7 * 6]  # int32 ids, T per text


def test_float64_runs_count_eight_bytes_a_number():
    float32, float64 = (memory.run_bytes(SMALL.replace(dtype=d), 10, 7) for d in ("float32", "float64"))
    assert [b // a for a, b in zip(float32.values(), float64.values())] == [2, 2, 1]  # the token ids stay int32


def test_the_memory_available_is_at_most_the_machines():
    assert 0 < memory.available_bytes() <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_a_run_that_fits_passes():
    memory.check_fits(Config(), vocab_size=5000, texts=20000)  # the seed's recipe: a few hundred MiB


def test_a_run_beyond_the_memory_is_refused_saying_what_it_needs_and_what_there_is(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 1024 ** 3)
    with pytest.raises(ConfigError) as refused:
        memory.check_fits(SMALL.replace(hidden_dim=99999999999), vocab_size=10, texts=7)
    message = str(refused.value)
    assert message.startswith("--embed-dim 4, --hidden-dim 99999999999, --layers 2, --seq-len 6 and --batch-size 5, "
                              "with a vocabulary of 10 and 7 texts, need about ")
    assert "more than the 1 GiB this process can have" in message and "\n" not in message


@pytest.mark.parametrize("size, text", [(999, "999 B"), (1536, "1.5 KiB"), (3 * 1024 ** 3, "3 GiB"),
                                        (2 * 1024 ** 6, "2048 PiB")])
def test_sizes_read_in_binary_units(size, text):
    assert memory.human(size) == text


def test_a_sequence_length_beyond_the_machine_is_one_line_from_the_data_cli(data_cli, corpus_csv):
    proc = data_cli("summary", "--data", corpus_csv(20), "--seq-len", "99999999999999")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: --embed-dim 400, --hidden-dim 256, --layers 2, --seq-len 99999999999999")
    assert proc.stderr.count("\n") == 1


def test_a_huge_layer_count_is_refused_at_once():
    # The estimate counts one layer's parameters, not each of 10**30 layers'.
    with pytest.raises(ConfigError, match=r"--layers 10{30}, .* need about"):
        memory.check_fits(SMALL.replace(layers=10**30), vocab_size=10, texts=7)


@pytest.mark.parametrize("layers", [1, 2, 5])
def test_the_parameter_count_is_the_sum_over_every_layers_shapes(layers):
    import math

    from common.params import param_shapes

    count = sum(map(math.prod, param_shapes(10, 4, 3, layers).values()))
    key = "parameters with their gradients and Adam's state"
    assert memory.run_bytes(SMALL.replace(layers=layers), 10, 7)[key] == memory.PARAMETER_COPIES * 4 * count


# ---------------------------------------------------------------- the language model

# People's Daily's streams at the defaults (words with <eos>: train, val, test), the language model's own corpus.
PEOPLES_DAILY = (925_522, 109_997, 105_412)
LM = Config.for_workload("lm")


def test_the_language_models_estimate_counts_parameters_a_windows_activations_and_logits_and_the_streams():
    cfg = Config.for_workload("lm", embed_dim=4, hidden_dim=3, layers=2, batch_size=5, bptt=6)
    # Encoder 10×4; layer 0: 12×4 + 12×3 + 2·12; layer 1: 12×3 + 12×3 + 2·12; decoder 10×3 + 10: 284 parameters.
    assert list(memory.lm_run_bytes(cfg, vocab_size=10, streams=(100, 40, 30)).values()) == [
        4 * 4 * 284,  # weights, gradients and the float64 draw; plain SGD keeps no state
        2 * 4 * 6 * 5 * (4 + 6 * 3 * 2),  # a window of bptt × B tokens, E + 6H·L floats each, twice
        3 * 4 * 6 * 5 * 10,  # its logits, their log-softmax and gradient: bptt × B × V, three times
        4 * 170]  # int32 ids


def test_a_bptt_beyond_the_stream_counts_one_window_of_the_whole_stream():
    need = memory.lm_run_bytes(LM.replace(bptt=10**30), 10_000, PEOPLES_DAILY)
    rows = PEOPLES_DAILY[0] // LM.batch_size - 1  # the window torch allocated 37 GB of logits for
    assert need["its logits over the vocabulary"] == 3 * 4 * rows * LM.batch_size * 10_000


def test_a_default_size_language_model_fits_in_less_than_a_gib():
    need = memory.lm_run_bytes(LM, 10_000, PEOPLES_DAILY)
    assert sum(need.values()) < 1024 ** 3
    memory.check_lm_fits(LM, 10_000, PEOPLES_DAILY)


@pytest.mark.parametrize("name, value", [("layers", 10**12), ("hidden_dim", 99999999999), ("embed_dim", 10**9),
                                         ("bptt", 10**30), ("batch_size", 10**9), ("max_vocab", 10**9)])
def test_a_language_model_beyond_the_memory_is_refused_naming_its_flag(monkeypatch, name, value):
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * 1024 ** 3)
    vocab = value if name == "max_vocab" else 10_000  # the vocabulary a corpus of that many words would give
    streams = (10**10, 10**9, 10**9) if name == "batch_size" else PEOPLES_DAILY
    with pytest.raises(ConfigError) as refused:
        memory.check_lm_fits(LM.replace(**{name: value}), vocab, streams)
    flag = "--" + name.replace("_", "-")
    message = str(refused.value)
    assert message.startswith(f"{flag} {value} is too large: the language model (--embed-dim ")
    assert message.endswith(f"more than the 16 GiB this process can have; make {flag} smaller")
    assert "\n" not in message


@pytest.mark.parametrize("twin", ["torch_impl", "jax_impl"])
def test_each_twin_refuses_a_language_model_beyond_the_memory_before_building_it(tmp_path, twin):
    corpus = write_lm_corpus(tmp_path / "lm.txt")
    proc = run_python(["-m", f"{twin}.train", *lm_args(corpus), "--layers", str(10**12)], timeout=120)
    assert (proc.returncode, proc.stderr.count("\n")) == (2, 1), proc.stderr
    assert proc.stderr.startswith(f"error: --layers {10**12} is too large: the language model (")

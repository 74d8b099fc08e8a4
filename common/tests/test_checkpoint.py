"""The neutral checkpoint: a bitwise round trip, atomic writes, and a message naming each kind of damage."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from common.checkpoint import (CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE, check_save_dir, load_checkpoint, save_checkpoint,
                               save_dir_held)
from common.config import MODEL_FIELDS, Config
from common.errors import CheckpointError, ConfigError
from common.files import CHECKSUM_FILE
from common.params import init_params
from common.text import Vocab

CFG = Config(embed_dim=4, hidden_dim=3, layers=2, seq_len=6, tokenizer="char", dropout=0.25, fc_dropout=0.1)
VOCAB = Vocab(("<pad>", "<unk>", "好", "a", "b"))


def _params(seed: int = 0) -> dict[str, np.ndarray]:
    return init_params(len(VOCAB), CFG.embed_dim, CFG.hidden_dim, CFG.layers, seed=seed)


@pytest.fixture
def ckpt(tmp_path) -> Path:
    return save_checkpoint(tmp_path / "ckpt", _params(), CFG, VOCAB, "char", meta={"step": 7})


def _rewrite_weights(ckpt: Path, change) -> None:
    params = load_file(str(ckpt / WEIGHTS_FILE))
    change(params)
    save_file(params, str(ckpt / WEIGHTS_FILE))


def _rewrite_config(ckpt: Path, change) -> None:
    config = json.loads((ckpt / CONFIG_FILE).read_text(encoding="utf-8"))
    change(config)
    (ckpt / CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")


# ---------------------------------------------------------------- round trip and atomic writes


def test_round_trip_is_bitwise(ckpt):
    loaded = load_checkpoint(ckpt)
    original = _params()
    assert set(loaded.params) == set(original)
    for name, arr in original.items():
        assert loaded.params[name].dtype == np.float32
        np.testing.assert_array_equal(loaded.params[name].view(np.uint32), arr.view(np.uint32), err_msg=name)
    assert loaded.vocab == VOCAB and loaded.tokenizer == "char" and loaded.meta == {"step": 7}
    assert {n: getattr(loaded.config, n) for n in MODEL_FIELDS} == {n: getattr(CFG, n) for n in MODEL_FIELDS}


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def test_a_meta_number_that_is_not_finite_is_written_as_null_and_read_back_as_none(tmp_path):
    meta = {"val_loss": 710.0, "val_perplexity": float("inf"), "step": 3, "losses": [float("nan"), 1.0]}
    ckpt = save_checkpoint(tmp_path / "ckpt", _params(), CFG, VOCAB, "char", meta=meta)
    written = json.loads((ckpt / CONFIG_FILE).read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    assert written["meta"] == {"val_loss": 710.0, "val_perplexity": None, "step": 3, "losses": [None, 1.0]}
    assert load_checkpoint(ckpt).meta == written["meta"]


def test_checkpoint_directory_holds_exactly_the_three_files_and_their_checksums(ckpt):
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE, CHECKSUM_FILE])
    listed = [line.split("  ")[2] for line in (ckpt / CHECKSUM_FILE).read_text(encoding="utf-8").splitlines()]
    assert listed == sorted([CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE])
    assert json.loads((ckpt / VOCAB_FILE).read_text(encoding="utf-8")) == list(VOCAB.tokens)


def test_save_leaves_no_temporary_directory(ckpt):
    assert [p.name for p in ckpt.parent.iterdir()] == ["ckpt"]


def test_overwriting_keeps_one_valid_checkpoint_with_the_new_weights(ckpt):
    save_checkpoint(ckpt, _params(seed=1), CFG, VOCAB, "char")
    assert [p.name for p in ckpt.parent.iterdir()] == ["ckpt"]
    np.testing.assert_array_equal(load_checkpoint(ckpt).params["fc.weight"], _params(seed=1)["fc.weight"])


def test_failed_write_keeps_the_previous_checkpoint(ckpt, monkeypatch):
    import safetensors.numpy

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", fail)
    with pytest.raises(OSError):
        save_checkpoint(ckpt, _params(seed=1), CFG, VOCAB, "char")
    assert [p.name for p in ckpt.parent.iterdir()] == ["ckpt"]  # the temporary directory was removed
    np.testing.assert_array_equal(load_checkpoint(ckpt).params["fc.weight"], _params(seed=0)["fc.weight"])


def test_save_refuses_parameters_that_do_not_match_the_config(tmp_path):
    params = _params()
    del params["fc.bias"]
    with pytest.raises(CheckpointError, match="missing tensor 'fc.bias'"):
        save_checkpoint(tmp_path / "ckpt", params, CFG, VOCAB, "char")
    assert not (tmp_path / "ckpt").exists()


# ---------------------------------------------------------------- damaged weights


def test_missing_tensor_is_named(ckpt):
    _rewrite_weights(ckpt, lambda p: p.pop("lstm.bias_hh_l1"))
    with pytest.raises(CheckpointError, match="missing tensor 'lstm.bias_hh_l1'"):
        load_checkpoint(ckpt)


def test_unexpected_tensor_is_named(ckpt):
    _rewrite_weights(ckpt, lambda p: p.update({"lstm.weight_ih_l2": np.zeros((12, 3), np.float32)}))
    with pytest.raises(CheckpointError, match="unexpected tensor 'lstm.weight_ih_l2'"):
        load_checkpoint(ckpt)


def test_wrong_shape_is_named(ckpt):
    _rewrite_weights(ckpt, lambda p: p.update({"fc.weight": np.zeros((1, 4), np.float32)}))
    with pytest.raises(CheckpointError, match=r"'fc.weight' has shape \(1, 4\), expected \(1, 3\)"):
        load_checkpoint(ckpt)


def test_wrong_dtype_is_named(ckpt):
    _rewrite_weights(ckpt, lambda p: p.update({"fc.bias": p["fc.bias"].astype(np.float64)}))
    with pytest.raises(CheckpointError, match="'fc.bias' has dtype float64, expected float32"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_values_are_named(ckpt, bad):
    def poison(p):
        p["embedding.weight"][2, 1] = bad

    _rewrite_weights(ckpt, poison)
    with pytest.raises(CheckpointError, match="'embedding.weight' holds non-finite values"):
        load_checkpoint(ckpt)


def test_truncated_weights_file_is_refused(ckpt):
    weights = ckpt / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-40])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unreadable safetensors file"):
        load_checkpoint(ckpt)


def test_missing_weights_file_is_refused(ckpt):
    (ckpt / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing"):
        load_checkpoint(ckpt)


def test_vocab_size_that_disagrees_with_the_embedding_is_named(ckpt):
    (ckpt / VOCAB_FILE).write_text(json.dumps(list(VOCAB.tokens) + ["c"]), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"'embedding.weight' has shape \(5, 4\), expected \(6, 4\)"):
        load_checkpoint(ckpt)


# ---------------------------------------------------------------- damaged config and vocabulary


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        load_checkpoint(tmp_path / "nowhere")


def test_missing_config_is_named(ckpt):
    (ckpt / CONFIG_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        load_checkpoint(ckpt)


def test_corrupt_config_is_named(ckpt):
    (ckpt / CONFIG_FILE).write_text('{"format": "lstm-tw', encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        load_checkpoint(ckpt)


def test_config_of_another_format_is_refused(ckpt):
    _rewrite_config(ckpt, lambda c: c.update(format="something-else"))
    with pytest.raises(CheckpointError, match=r"config\.json: not a neutral checkpoint config"):
        load_checkpoint(ckpt)


def test_wrong_format_version_is_named(ckpt):
    _rewrite_config(ckpt, lambda c: c.update(version=3))
    with pytest.raises(CheckpointError, match=r"config\.json: format version 3, this code reads version 2$"):
        load_checkpoint(ckpt)


def test_missing_model_setting_is_named(ckpt):
    _rewrite_config(ckpt, lambda c: c["model"].pop("hidden_dim"))
    with pytest.raises(CheckpointError, match="model setting 'hidden_dim' is missing"):
        load_checkpoint(ckpt)


def test_model_setting_of_the_wrong_type_is_named(ckpt):
    _rewrite_config(ckpt, lambda c: c["model"].update(layers="2"))
    with pytest.raises(CheckpointError, match="model setting 'layers' has the wrong type"):
        load_checkpoint(ckpt)


def test_out_of_range_model_setting_is_a_checkpoint_error(ckpt):
    _rewrite_config(ckpt, lambda c: c["model"].update(seq_len=0))
    with pytest.raises(CheckpointError, match=r"config\.json: --seq-len must be > 0"):
        load_checkpoint(ckpt)


def test_unknown_resolved_tokenizer_is_refused(ckpt):
    _rewrite_config(ckpt, lambda c: c.update(tokenizer_resolved="auto"))
    with pytest.raises(CheckpointError, match="'tokenizer_resolved' must be one of char, word, script"):
        load_checkpoint(ckpt)


def test_missing_vocab_is_named(ckpt):
    (ckpt / VOCAB_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"vocab\.json: missing"):
        load_checkpoint(ckpt)


def test_corrupt_vocab_is_named(ckpt):
    (ckpt / VOCAB_FILE).write_bytes(b'["<pad>", "<unk>", "\xff')
    with pytest.raises(CheckpointError, match=r"vocab\.json: not valid JSON"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("content, message", [({"a": 1}, "expected a JSON list of token strings"),
                                              (["<pad>", "<unk>", 3], "expected a JSON list of token strings"),
                                              (["<unk>", "<pad>", "a", "b", "c"], "must start with"),
                                              (["<pad>", "<unk>", "a", "a", "b"], "must not repeat a token")])
def test_malformed_vocab_is_named(ckpt, content, message):
    (ckpt / VOCAB_FILE).write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(CheckpointError, match=rf"vocab\.json: .*{message}"):
        load_checkpoint(ckpt)


# ---------------------------------------------------------------- requested settings


@pytest.mark.parametrize("name, value", [("hidden_dim", 5), ("seq_len", 9), ("tokenizer", "word"),
                                         ("padding", "right"), ("max_vocab", 10)])
def test_requested_model_setting_that_differs_is_named(ckpt, name, value):
    with pytest.raises(CheckpointError, match=rf"checkpoint has {name}=.* but --{name.replace('_', '-')}"):
        load_checkpoint(ckpt, Config().replace(**{name: value}))


def test_default_settings_take_the_checkpoints_model_and_keep_the_callers_run_settings(ckpt):
    loaded = load_checkpoint(ckpt, Config(batch_size=7, dropout=0.0, fc_dropout=0.0))
    assert (loaded.config.embed_dim, loaded.config.hidden_dim, loaded.config.seq_len) == (4, 3, 6)
    assert loaded.config.batch_size == 7
    assert (loaded.config.dropout, loaded.config.fc_dropout) == (0.0, 0.0)  # dropout is a training setting


def test_asking_for_the_checkpoints_resolved_tokenizer_is_accepted(tmp_path):
    # Trained with --tokenizer auto (resolved to char): asking for char is asking for what it has.
    ckpt = save_checkpoint(tmp_path / "ckpt", _params(), CFG.replace(tokenizer="auto"), VOCAB, "char")
    assert load_checkpoint(ckpt, Config(tokenizer="char")).tokenizer == "char"


# ---------------------------------------------------------------- checksums


def _flip_a_weight_byte(ckpt: Path) -> None:
    """Flip the lowest bit of the first number in model.safetensors' data region: the file still parses, every
    tensor keeps its name, shape and dtype, and one value changes in its last place."""
    weights = ckpt / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # after the header's length and the JSON header
    data[start] ^= 0x01
    weights.write_bytes(bytes(data))


def test_a_flipped_byte_in_the_weights_is_refused_as_damage(ckpt):
    _flip_a_weight_byte(ckpt)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: contents differ from when it was written"):
        load_checkpoint(ckpt)


def test_a_checkpoint_without_its_checksums_is_refused_naming_the_file(ckpt):
    (ckpt / CHECKSUM_FILE).unlink()
    with pytest.raises(CheckpointError, match=rf"{CHECKSUM_FILE}: missing$"):
        load_checkpoint(ckpt)


# ---------------------------------------------------------------- --save-dir: another run's checkpoint


def test_save_dir_holding_this_models_checkpoint_is_accepted(ckpt):
    check_save_dir(ckpt, CFG, VOCAB, overwrite=False)  # a resumed run, or the same command again


@pytest.mark.parametrize("cfg, vocab, held", [
    (CFG.replace(hidden_dim=5), VOCAB, "a checkpoint with hidden_dim=3"),
    (CFG, Vocab(("<pad>", "<unk>", "好", "a", "c")), "a checkpoint with another vocabulary"),
])
def test_save_dir_holding_another_runs_checkpoint_is_refused_unless_overwrite(ckpt, cfg, vocab, held):
    with pytest.raises(ConfigError, match=rf"^--save-dir {ckpt}: holds {held}, not this run's, and saving replaces "
                                          rf"it; name another directory, or pass --overwrite$"):
        check_save_dir(ckpt, cfg, vocab, overwrite=False)
    check_save_dir(ckpt, cfg, vocab, overwrite=True)


def test_save_dir_holding_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ConfigError, match="holds files that are not a neutral checkpoint"):
        check_save_dir(tmp_path, CFG, VOCAB, overwrite=False)
    check_save_dir(tmp_path / "new", CFG, VOCAB, overwrite=False)  # a directory to be made is fine


def test_save_dir_vocabulary_is_compared_only_once_it_is_known(ckpt):
    # Before the corpus is read only the model settings can be compared; the vocabulary once the data gives it.
    other = Vocab(("<pad>", "<unk>", "好", "a", "c"))
    assert save_dir_held(ckpt, CFG) is None
    assert save_dir_held(ckpt, CFG, other) == (f"--save-dir {ckpt}: holds a checkpoint with another vocabulary, not "
                                               f"this run's, and saving replaces it; name another directory, or pass "
                                               f"--overwrite")
    assert save_dir_held(ckpt, CFG.replace(hidden_dim=5)).startswith(f"--save-dir {ckpt}: holds a checkpoint with "
                                                                     f"hidden_dim=3")

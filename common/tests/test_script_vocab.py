"""The classic script's side of the neutral format: its tokenizer, its vocabulary (ids from 1, no <unk>, unknown
words skipped and counted), and the checkpoint format's unknown-word rule."""
from __future__ import annotations

import json
import string

import numpy as np
import pytest

from common.checkpoint import CONFIG_FILE, load_checkpoint, save_checkpoint
from common.config import Config
from common.data import encode_texts
from common.errors import CheckpointError
from common.params import init_params
from common.predict import format_predictions, unknown_words
from common.text import PAD, UNK, Vocab, script_tokens, vocab_from_word_ids, word_tokens

WORD_IDS = {"good": 1, "film": 2, "“superb”": 3, "joy—pure": 4}  # the script's vocab_to_int
SCRIPT_VOCAB = Vocab((PAD, "good", "film", "“superb”", "joy—pure"), unknown_words="skip")
CFG = Config(embed_dim=4, hidden_dim=3, layers=1, seq_len=4, tokenizer="script")


# ---------------------------------------------------------------- the script's tokenizer


def test_script_tokenizer_drops_ascii_punctuation_and_keeps_the_rest():
    assert script_tokens("GOOD film!!! “Superb”—joy… it's") == ["good", "film", "“superb”—joy…", "its"]


def test_script_tokenizer_drops_every_character_of_string_punctuation():
    assert script_tokens(f"a{string.punctuation}b") == ["ab"]


def test_script_tokenizer_differs_from_the_word_tokenizer_on_unicode_punctuation():
    assert (script_tokens("“superb”"), word_tokens("“superb”")) == (["“superb”"], ["superb"])


# ---------------------------------------------------------------- the script's vocabulary


def test_word_ids_become_a_vocabulary_with_the_scripts_ids():
    vocab = vocab_from_word_ids(WORD_IDS, rows=5)
    assert vocab == SCRIPT_VOCAB and vocab.word_ids() == WORD_IDS


def test_skip_vocabulary_drops_unknown_words_before_taking_the_first_seq_len():
    tokens, lengths = encode_texts(["zzz good xx film good film good"], SCRIPT_VOCAB, "script", seq_len=4)
    np.testing.assert_array_equal(tokens, [[1, 2, 1, 2]])  # the first 4 *known* words
    assert lengths.tolist() == [4]


def test_skip_vocabulary_left_pads_as_the_script_does():
    tokens, _ = encode_texts(["Good, FILM!"], SCRIPT_VOCAB, "script", seq_len=4)
    np.testing.assert_array_equal(tokens, [[0, 0, 1, 2]])


def test_unknown_words_are_counted_per_text():
    counts = SCRIPT_VOCAB.unknown_counts([script_tokens(t) for t in ["good zzz film yy", "good", ""]])
    assert counts == [2, 0, 0]


def test_unk_vocabulary_counts_the_words_it_reads_as_unk():
    assert Vocab((PAD, UNK, "a")).unknown_counts([["a", "b", "c"]]) == [2]


@pytest.mark.parametrize("word_ids, message", [
    ({"good": 1, "film": 1}, "ids collide: 'good' and 'film' both have id 1"),
    ({"good": 0, "film": 1}, "'good' has id 0, which is the script's padding"),
    ({"good": 2, "film": 3}, "ids must be 1..2, as the script numbers them; id 1 is unused"),
    ({"good": 1, "film": 2, "plot": 3}, "need an embedding of 4 rows, the state_dict's embedding.weight has 3"),
    (["good", "film"], "expected a JSON object of word → integer id"),
    ({"good": 1, "film": "2"}, "expected a JSON object of word → integer id"),
    ({"good": 1, "film": True}, "expected a JSON object of word → integer id"),
])
def test_malformed_word_ids_are_named(word_ids, message):
    with pytest.raises(CheckpointError, match=message.replace(".", r"\.").replace("(", r"\(")):
        vocab_from_word_ids(word_ids, rows=3)


def test_skip_vocabulary_must_start_with_pad():
    with pytest.raises(CheckpointError, match="must start with '<pad>'$"):
        Vocab(("good", PAD), unknown_words="skip")


# ---------------------------------------------------------------- checkpoint format version 2


def _save(tmp_path, vocab=SCRIPT_VOCAB, cfg=CFG, tokenizer="script"):
    params = init_params(len(vocab), cfg.embed_dim, cfg.hidden_dim, cfg.layers, seed=0)
    return save_checkpoint(tmp_path / "ckpt", params, cfg, vocab, tokenizer)


def test_script_checkpoint_round_trips_its_tokenizer_and_unknown_word_rule(tmp_path):
    ckpt = load_checkpoint(_save(tmp_path))
    assert (ckpt.vocab, ckpt.tokenizer, ckpt.config.tokenizer) == (SCRIPT_VOCAB, "script", "script")
    assert ckpt.params["embedding.weight"].shape == (5, 4)  # the script's rows: no <unk> added


def test_saved_config_is_version_2_and_names_the_rule(tmp_path):
    config = json.loads((_save(tmp_path) / CONFIG_FILE).read_text(encoding="utf-8"))
    assert (config["version"], config["unknown_words"]) == (2, "skip")


def test_unknown_word_rule_that_is_not_known_is_refused(tmp_path):
    folder = _save(tmp_path)
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    (folder / CONFIG_FILE).write_text(json.dumps({**config, "unknown_words": "zero"}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="'unknown_words' must be one of unk, skip"):
        load_checkpoint(folder)


# ---------------------------------------------------------------- predict's record


def test_predict_json_records_count_the_unknown_words(tmp_path):
    ckpt = load_checkpoint(_save(tmp_path))
    texts = ["Good film", "good zzz, yy!"]
    records = json.loads(format_predictions(texts, [0.75, 0.25], True, unknown_words(ckpt, texts)))
    assert [r["unknown_words"] for r in records] == [0, 2]

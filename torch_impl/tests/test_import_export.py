"""Importing the classic script's files (``torch.save(net.state_dict())`` and its ``vocab_to_int``) as a neutral
checkpoint, and exporting one back: bitwise both ways, sizes from the shapes, and one line for each bad input.
(The predictions against an independent copy of the script are in parity_tests/test_classic_model.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from common.checkpoint import load_checkpoint, save_checkpoint
from common.config import Config
from common.files import CHECKSUM_FILE
from common.params import init_params
from common.text import PAD, UNK, Vocab
from torch_impl import export_model, import_model
from torch_impl import train as torch_train
from torch_impl.model import SentimentRNN
from torch_impl.tests.conftest import NEGATIVE, NEUTRAL, POSITIVE

WORDS = [*POSITIVE, *NEGATIVE, *NEUTRAL]
V, E, H, L = len(WORDS) + 1, 5, 3, 2  # the script's vocab_size = len(vocab_to_int) + 1


def write_script_files(folder: Path, state: dict | None = None, word_ids: object = None) -> tuple[Path, Path]:
    """model.pt (a state_dict of torch's own initialisation, seed 0) and vocab_to_int.json (WORDS, ids from 1)."""
    torch.manual_seed(0)
    state = SentimentRNN(V, E, H, L).state_dict() if state is None else state
    model, vocab = folder / "model.pt", folder / "vocab_to_int.json"
    torch.save(state, model)
    vocab.write_text(json.dumps({w: i for i, w in enumerate(WORDS, 1)} if word_ids is None else word_ids),
                     encoding="utf-8")
    return model, vocab


def run_import(model: Path, vocab: Path, out: Path, *flags: str) -> int:
    return import_model.main(["--state-dict", str(model), "--vocab", str(vocab), "--out", str(out), *flags])


@pytest.fixture
def imported(tmp_path) -> Path:
    model, vocab = write_script_files(tmp_path)
    assert run_import(model, vocab, tmp_path / "ckpt", "--seq-len", "12") == 0
    return tmp_path / "ckpt"


def test_import_reads_the_sizes_from_the_shapes(imported):
    cfg = load_checkpoint(imported).config
    assert (cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.seq_len, cfg.tokenizer) == (E, H, L, 12, "script")


def test_import_keeps_every_weight_bitwise(tmp_path, imported):
    original = torch.load(tmp_path / "model.pt", weights_only=True)
    params = load_checkpoint(imported).params
    assert params.keys() == original.keys()
    assert all(torch.equal(torch.from_numpy(params[name]), tensor) for name, tensor in original.items())


def test_import_keeps_the_scripts_ids_and_skips_unknown_words(imported):
    vocab = load_checkpoint(imported).vocab
    assert (len(vocab), vocab.tokens[:3], vocab.unknown_words) == (V, (PAD, *WORDS[:2]), "skip")


def test_import_reads_a_one_layer_model(tmp_path):
    model, vocab = write_script_files(tmp_path, SentimentRNN(V, E, H, 1).state_dict())
    assert run_import(model, vocab, tmp_path / "ckpt") == 0
    assert load_checkpoint(tmp_path / "ckpt").config.layers == 1


def test_export_gives_back_the_scripts_state_dict_and_vocab_to_int(tmp_path, imported):
    out_pt, out_json = tmp_path / "out.pt", tmp_path / "out.json"
    assert export_model.main([str(imported), "--state-dict", str(out_pt), "--vocab", str(out_json)]) == 0
    original, exported = (torch.load(p, weights_only=True) for p in (tmp_path / "model.pt", out_pt))
    assert list(exported) == list(original)  # the state_dict's own order
    assert all(torch.equal(exported[name], tensor) for name, tensor in original.items())
    assert json.loads(out_json.read_text(encoding="utf-8")) == json.loads((tmp_path / "vocab_to_int.json").read_text())
    SentimentRNN(V, E, H, L).load_state_dict(exported)  # strict: every name and shape fits


def test_export_of_a_project_vocabulary_keeps_unk_as_id_1(tmp_path):
    cfg = Config(embed_dim=E, hidden_dim=H, layers=L, tokenizer="word")
    save_checkpoint(tmp_path / "ckpt", init_params(3, E, H, L, seed=0), cfg, Vocab((PAD, UNK, "good")), "word")
    assert export_model.main([str(tmp_path / "ckpt"), "--state-dict", str(tmp_path / "o.pt"),
                              "--vocab", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text(encoding="utf-8")) == {UNK: 1, "good": 2}


def test_export_refuses_a_right_padded_checkpoint(tmp_path, capsys):
    cfg = Config(embed_dim=E, hidden_dim=H, layers=L, tokenizer="word", padding="right")
    save_checkpoint(tmp_path / "ckpt", init_params(3, E, H, L, seed=0), cfg, Vocab((PAD, UNK, "good")), "word")
    assert export_model.main([str(tmp_path / "ckpt"), "--state-dict", str(tmp_path / "o.pt"),
                              "--vocab", str(tmp_path / "o.json")]) == 2
    assert "the script left-pads" in capsys.readouterr().err
    assert not (tmp_path / "o.pt").exists() and not (tmp_path / "o.json").exists()


def test_torch_trainer_fine_tunes_an_imported_checkpoint(tmp_path, imported, tiny_cfg):
    # The model settings come from the checkpoint; only data and training flags are given.
    args = ["--pos", tiny_cfg.pos, "--neg", tiny_cfg.neg, "--batch-size", "4", "--max-steps", "3", "--log-every", "0",
            "--no-progress", "--init-from", str(imported), "--save-dir", str(tmp_path / "tuned")]
    assert torch_train.main(args) == 0
    before, after = load_checkpoint(imported), load_checkpoint(tmp_path / "tuned")
    assert (after.vocab, after.tokenizer) == (before.vocab, "script")
    assert (after.params["fc.weight"] != before.params["fc.weight"]).all()


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing written


def _whole_model(folder: Path):
    torch.save(SentimentRNN(V, E, H, L), folder / "model.pt")


def _state(change):
    def make(folder: Path):
        state = SentimentRNN(V, E, H, L).state_dict()
        change(state)
        write_script_files(folder, state=state)
    return make


def _vocab(word_ids):
    return lambda folder: write_script_files(folder, word_ids=word_ids)


BAD_INPUTS = {
    "a pickled whole model": (_whole_model, "holds a pickled torch_impl.model.SentimentRNN, not a state_dict: it "
                                            "is read with torch.load(weights_only=True)"),
    "bytes torch.save did not write": (lambda f: (f / "model.pt").write_bytes(b"hello"),
                                       "model.pt: not a file torch.save wrote"),
    "a missing tensor": (_state(lambda s: s.pop("fc.bias")), "missing tensor 'fc.bias'"),
    "an extra tensor": (_state(lambda s: s.update({"lstm.weight_ih_l0_reverse": torch.zeros(4 * H, E)})),
                        "unexpected tensor 'lstm.weight_ih_l0_reverse'"),
    "a shape that disagrees": (_state(lambda s: s.update({"fc.weight": torch.zeros(2, H)})),
                               "tensor 'fc.weight' has shape (2, 3), expected (1, 3)"),
    "ids that collide": (_vocab({**{w: i for i, w in enumerate(WORDS, 1)}, "good": 2}),
                         "ids collide: 'good' and 'great' both have id 2"),
    "id 0 used": (_vocab({w: i for i, w in enumerate(WORDS)}), "'good' has id 0, which is the script's padding"),
    "ids from 2": (_vocab({w: i for i, w in enumerate(WORDS, 2)}), "id 1 is unused"),
    "ids that do not fit the embedding": (_vocab({w: i for i, w in enumerate([*WORDS, "extra"], 1)}),
                                          f"need an embedding of {V + 1} rows, the state_dict's embedding.weight "
                                          f"has {V}"),
    "a JSON list": (_vocab(WORDS), "expected a JSON object of word → integer id"),
    "JSON that does not parse": (lambda f: (f / "vocab_to_int.json").write_text("{'good': 1}"), "not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, case):
    write_script_files(tmp_path)
    make, message = BAD_INPUTS[case]
    make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert run_import(tmp_path / "model.pt", tmp_path / "vocab_to_int.json", tmp_path / "ckpt") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no --out, no temporary debris


def test_non_empty_out_is_refused_and_left_as_it_was(tmp_path, capsys):
    model, vocab = write_script_files(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    assert run_import(model, vocab, tmp_path / "ckpt") == 2
    assert capsys.readouterr().err == f"error: --out {tmp_path / 'ckpt'}: exists and is not an empty directory; " \
                                      f"name a new one\n"
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["notes.txt"]


def test_empty_out_directory_is_filled(tmp_path):
    model, vocab = write_script_files(tmp_path)
    (tmp_path / "ckpt").mkdir()
    assert run_import(model, vocab, tmp_path / "ckpt") == 0
    assert load_checkpoint(tmp_path / "ckpt").config.embed_dim == E


# ---------------------------------------------------------------- export's outputs: checked first, written together


def run_export(ckpt: Path, state_dict: Path, vocab: Path, *flags: str) -> int:
    return export_model.main([str(ckpt), "--state-dict", str(state_dict), "--vocab", str(vocab), *flags])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("existing", ["state_dict", "vocab"])
def test_export_refuses_an_existing_output_and_leaves_both_paths_as_they_were(tmp_path, imported, capsys, existing):
    out = {"state_dict": tmp_path / "out.pt", "vocab": tmp_path / "out.json"}
    out[existing].write_text("mine", encoding="utf-8")
    assert run_export(imported, out["state_dict"], out["vocab"]) == 2
    flag = "--state-dict" if existing == "state_dict" else "--vocab"
    assert _one_line_error(capsys) == f"error: {flag} {out[existing]}: exists; pass --overwrite to replace it\n"
    assert out[existing].read_text(encoding="utf-8") == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt", "model.pt", "vocab_to_int.json",
                                                                 out[existing].name])


def test_export_with_overwrite_replaces_both_outputs(tmp_path, imported):
    out_pt, out_json = tmp_path / "out.pt", tmp_path / "out.json"
    out_pt.write_text("old", encoding="utf-8")
    out_json.write_text("old", encoding="utf-8")
    assert run_export(imported, out_pt, out_json, "--overwrite") == 0
    assert list(torch.load(out_pt, weights_only=True)) == list(torch.load(tmp_path / "model.pt", weights_only=True))
    assert json.loads(out_json.read_text(encoding="utf-8")) == json.loads((tmp_path / "vocab_to_int.json").read_text())


def test_export_refuses_one_path_for_both_outputs(tmp_path, imported, capsys):
    assert run_export(imported, tmp_path / "out", tmp_path / "sub" / ".." / "out") == 2
    assert _one_line_error(capsys) == (f"error: --state-dict {tmp_path / 'out'} is the same path as --vocab "
                                       f"{tmp_path / 'sub' / '..' / 'out'}: both would write it; give each its own "
                                       f"path\n")
    assert not (tmp_path / "out").exists()


def test_export_into_a_missing_directory_creates_it(tmp_path, imported):
    assert run_export(imported, tmp_path / "out.pt", tmp_path / "missing" / "out.json") == 0
    assert json.loads((tmp_path / "missing" / "out.json").read_text()) == json.loads(
        (tmp_path / "vocab_to_int.json").read_text())


def test_export_under_a_regular_file_is_refused_before_anything_is_written(tmp_path, imported, capsys):
    (tmp_path / "afile").write_text("mine")
    assert run_export(imported, tmp_path / "out.pt", tmp_path / "afile" / "out.json") == 2
    assert _one_line_error(capsys) == (f"error: --vocab {tmp_path / 'afile' / 'out.json'}: cannot write there "
                                       f"({tmp_path / 'afile'} is a file)\n")
    assert not (tmp_path / "out.pt").exists() and (tmp_path / "afile").read_text() == "mine"


def test_export_whose_second_file_fails_leaves_neither(tmp_path, imported, capsys, monkeypatch):
    def disk_full(path, obj):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_model, "write_json", disk_full)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert run_export(imported, tmp_path / "out.pt", tmp_path / "out.json") == 2
    assert _one_line_error(capsys) == (f"error: {tmp_path / 'out.pt'} and {tmp_path / 'out.json'}: cannot write (No "
                                       f"space left on device)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no temporary file


# ---------------------------------------------------------------- import: DataParallel's names, checksums


def test_import_strips_the_dataparallel_prefix_and_says_so(tmp_path, capsys):
    torch.manual_seed(0)
    plain = SentimentRNN(V, E, H, L).state_dict()
    model, vocab = write_script_files(tmp_path, state={f"module.{name}": t for name, t in plain.items()})
    assert run_import(model, vocab, tmp_path / "ckpt") == 0
    assert capsys.readouterr().out.rstrip().endswith("; the names' 'module.' prefix (saved by nn.DataParallel) was "
                                                     "stripped")
    params = load_checkpoint(tmp_path / "ckpt").params
    assert all(torch.equal(torch.from_numpy(params[name]), tensor) for name, tensor in plain.items())


def test_import_writes_the_checksums_every_load_checks(imported, capsys):
    assert (imported / CHECKSUM_FILE).is_file()
    load_checkpoint(imported)
    assert capsys.readouterr().err == ""  # no warning: the files were verified

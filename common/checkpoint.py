"""The neutral checkpoint: a directory any twin reads and writes.

    config.json        model and tokenizer settings (and the format version)
    vocab.json         a JSON list of tokens; the index is the id
    model.safetensors  float32 arrays under the PyTorch state-dict names (see common.params)

Nothing is unpickled. Writes go to a temporary directory that is renamed into place, so a kill during a save
leaves the previous checkpoint intact. Reading checks every name, shape and dtype and says which is wrong.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from common.config import MODEL_FIELDS, Config
from common.errors import CheckpointError, ConfigError
from common.params import Params, shapes_for
from common.text import Vocab

FORMAT = "lstm-twins/neutral-checkpoint"
VERSION = 1
CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE = "config.json", "vocab.json", "model.safetensors"


@dataclass(frozen=True)
class Checkpoint:
    params: Params
    config: Config  # the run's Config with the checkpoint's model fields
    vocab: Vocab
    tokenizer: str  # resolved: 'char' or 'word'
    meta: dict[str, Any]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(directory: str | Path, params: Params, cfg: Config, vocab: Vocab, tokenizer: str,
                    meta: dict[str, Any] | None = None) -> Path:
    """Write ``params`` (name → float32 array) atomically as a neutral checkpoint in ``directory``."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"{directory}: exists and is not a directory")
    validate_params(params, cfg, len(vocab), where=str(directory))
    for name, arr in params.items():
        if not np.all(np.isfinite(arr)):
            raise CheckpointError(f"{directory}: refusing to save tensor {name!r}: it holds non-finite values")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    except OSError as err:
        raise CheckpointError(f"{directory}: cannot write a checkpoint here ({err.strerror})") from None
    try:
        config = {"format": FORMAT, "version": VERSION, "tokenizer_resolved": tokenizer,
                  "model": {name: getattr(cfg, name) for name in MODEL_FIELDS}, "meta": meta or {}}
        _write_json(tmp / CONFIG_FILE, config)
        _write_json(tmp / VOCAB_FILE, list(vocab.tokens))
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in params.items()},
                  str(tmp / WEIGHTS_FILE))
        with open(tmp / WEIGHTS_FILE, "rb+") as f:
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        # Swap in: the old directory (if any) moves aside and is removed only after the rename succeeded.
        old = None
        if directory.exists():
            old = directory.parent / f".{directory.name}.old-{os.getpid()}"
            os.replace(directory, old)
        os.replace(tmp, directory)
        _fsync_dir(directory.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def validate_params(params: Params, cfg: Config, vocab_size: int, where: str = "parameters") -> None:
    """Raise :class:`CheckpointError` naming the first missing, unexpected, misshapen or non-float32 array."""
    expected = shapes_for(cfg, vocab_size)
    for name in expected:
        if name not in params:
            raise CheckpointError(f"{where}: missing tensor {name!r}")
    for name in params:
        if name not in expected:
            raise CheckpointError(f"{where}: unexpected tensor {name!r}")
    for name, shape in expected.items():
        arr = params[name]
        if tuple(arr.shape) != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {tuple(arr.shape)}, expected {shape}")
        if np.dtype(arr.dtype) != np.float32:
            raise CheckpointError(f"{where}: tensor {name!r} has dtype {np.dtype(arr.dtype)}, expected float32")


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None


def load_checkpoint(directory: str | Path, cfg: Config | None = None) -> Checkpoint:
    """Read and check a neutral checkpoint. The returned config is ``cfg`` (default: the defaults) with the
    checkpoint's model fields; a ``cfg`` whose model fields differ from the checkpoint's is refused."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such checkpoint directory")
    config = _read_json(directory / CONFIG_FILE)
    if not isinstance(config, dict) or config.get("format") != FORMAT or not isinstance(config.get("model"), dict):
        raise CheckpointError(f"{directory / CONFIG_FILE}: not a neutral checkpoint config "
                              f"(expected format {FORMAT!r} with a 'model' section)")
    if config.get("version") != VERSION:
        raise CheckpointError(f"{directory / CONFIG_FILE}: format version {config.get('version')!r}, "
                              f"this code reads version {VERSION}")
    model = config["model"]
    known = {f.name: f for f in fields(Config)}
    for name in MODEL_FIELDS:
        if name not in model:
            raise CheckpointError(f"{directory / CONFIG_FILE}: model setting {name!r} is missing")
        if type(model[name]) is not type(known[name].default) and not (
                isinstance(known[name].default, float) and isinstance(model[name], int)):
            raise CheckpointError(f"{directory / CONFIG_FILE}: model setting {name!r} has the wrong type")
    tokenizer = config.get("tokenizer_resolved")
    if tokenizer not in ("char", "word"):
        raise CheckpointError(f"{directory / CONFIG_FILE}: 'tokenizer_resolved' must be 'char' or 'word'")
    base = cfg or Config()
    if cfg is not None:
        defaults = Config()
        for name in MODEL_FIELDS:
            asked = getattr(cfg, name)
            if name in ("dropout", "fc_dropout"):
                continue
            if name == "tokenizer" and asked == tokenizer:
                continue  # asking for the tokenizer an 'auto' checkpoint resolved to is asking for what it has
            if asked != getattr(defaults, name) and asked != model[name]:
                raise CheckpointError(f"{directory}: the checkpoint has {name}={model[name]!r} but "
                                      f"--{name.replace('_', '-')} {asked!r} was asked for")
    # Dropout rates are training settings: the caller's win (parity runs use 0 on any checkpoint).
    keep_callers = ("dropout", "fc_dropout") if cfg is not None else ()
    try:
        merged = base.replace(**{name: model[name] for name in MODEL_FIELDS if name not in keep_callers})
    except ConfigError as err:
        raise CheckpointError(f"{directory / CONFIG_FILE}: {err}") from None

    tokens = _read_json(directory / VOCAB_FILE)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{directory / VOCAB_FILE}: expected a JSON list of token strings")
    try:
        vocab = Vocab(tuple(tokens))
    except CheckpointError as err:
        raise CheckpointError(f"{directory / VOCAB_FILE}: {err}") from None

    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    try:
        params = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights}: unreadable safetensors file ({err})") from None
    validate_params(params, merged, len(vocab), where=str(weights))
    for name, arr in params.items():
        if not np.all(np.isfinite(arr)):
            raise CheckpointError(f"{weights}: tensor {name!r} holds non-finite values")
    return Checkpoint(params, merged, vocab, tokenizer, config.get("meta", {}))

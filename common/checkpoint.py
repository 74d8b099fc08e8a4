"""The neutral checkpoint: a directory any twin reads and writes.

    config.json        model and tokenizer settings, the unknown-word rule (and the format version)
    vocab.json         a JSON list of tokens; the index is the id
    model.safetensors  float32 arrays under the PyTorch state-dict names (see common.params)
    checksums.sha256   SHA-256 and size of the three (common.files' manifest, as training checkpoints have)

Nothing is unpickled. Writes go to a temporary directory that is renamed into place, so a kill during a save
leaves the previous checkpoint intact. Reading checks every name, shape and dtype and says which is wrong, then every
file against its checksum.

``unknown_words``: 'unk' (the vocabulary starts <pad>, <unk>) or 'skip' (it starts <pad> alone and unknown words are
dropped: a model imported from the classic script). A language model's (``workload`` 'lm') starts <unk>, <eos>, its
words read as whitespace-separated (``tokenizer_resolved`` 'whitespace').
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.config import MODEL_FIELDS, WORKLOADS, Config, flag
from common.errors import CheckpointError, ConfigError
from common.files import atomic_dir, read_json, verify_manifest, write_json, write_manifest
from common.lm_data import TOKENIZER as LM_TOKENIZER, LMVocab
from common.params import Params, shapes_for
from common.text import TOKENIZERS, UNKNOWN_RULES, Vocab

FORMAT = "lstm-twins/neutral-checkpoint"
ADDED_WITH_THE_LM = ("workload", "cell", "tied")  # model settings a checkpoint of this version may lack
VERSION = 2
CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE = "config.json", "vocab.json", "model.safetensors"


@dataclass(frozen=True)
class Checkpoint:
    params: Params
    config: Config  # the run's Config with the checkpoint's model fields
    vocab: Vocab | LMVocab
    tokenizer: str  # resolved: one of common.text.TOKENIZERS, or a language model's 'whitespace'
    meta: dict[str, Any]


def save_checkpoint(directory: str | Path, params: Params, cfg: Config, vocab: Vocab, tokenizer: str,
                    meta: dict[str, Any] | None = None) -> Path:
    """Write ``params`` (name → float32 array) atomically as a neutral checkpoint in ``directory``."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"{directory}: exists and is not a directory")
    validate_params(params, cfg, len(vocab), where=str(directory))
    config = {"format": FORMAT, "version": VERSION, "tokenizer_resolved": tokenizer,
              "unknown_words": vocab.unknown_words,
              "model": {name: getattr(cfg, name) for name in MODEL_FIELDS}, "meta": meta or {}}
    with atomic_dir(directory, "a checkpoint") as tmp:
        write_json(tmp / CONFIG_FILE, config)
        write_json(tmp / VOCAB_FILE, list(vocab.tokens))
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in params.items()}, str(tmp / WEIGHTS_FILE))
        write_manifest(tmp)
    return directory


def save_dir_held(directory: str | Path, cfg: Config, vocab: Vocab | None = None) -> str | None:
    """The refusal of a --save-dir holding anything but a checkpoint of ``cfg``'s model (and of ``vocab``; None: not
    known yet, checked once the data is read), or None: a save replaces the whole directory."""
    directory = Path(directory)
    try:
        if not directory.is_dir() or not any(directory.iterdir()):
            return None
        model, tokens = read_json(directory / CONFIG_FILE)["model"], read_json(directory / VOCAB_FILE)
        differs = [f"{name}={model.get(name)!r}" for name in MODEL_FIELDS if model.get(name) != getattr(cfg, name)]
        held = (f"a checkpoint with {differs[0]}" if differs else "a checkpoint with another vocabulary"
                if vocab is not None and tokens != list(vocab.tokens) else None)
    except OSError:  # a directory the system does not let us list
        held = "files that cannot be read"
    except (CheckpointError, TypeError, KeyError, AttributeError):
        held = "files that are not a neutral checkpoint"
    if held is None:
        return None
    return (f"--save-dir {directory}: holds {held}, not this run's, and saving replaces it; name another directory, or "
            f"pass --overwrite")


def check_save_dir(directory: str | Path, cfg: Config, vocab: Vocab, overwrite: bool) -> None:
    """Refuse (:class:`ConfigError`) a --save-dir holding anything but a checkpoint of ``cfg``'s model and ``vocab``,
    unless ``overwrite`` (:func:`save_dir_held`)."""
    if not overwrite and (held := save_dir_held(directory, cfg, vocab)):
        raise ConfigError(held)


def validate_params(params: Params, cfg: Config, vocab_size: int, where: str) -> None:
    """Raise :class:`CheckpointError` naming the first missing, unexpected, misshapen, non-float32 or non-finite one."""
    expected = shapes_for(cfg, vocab_size)
    for name in {**expected, **params}:  # the expected ones first
        if name not in params or name not in expected:
            raise CheckpointError(f"{where}: {'missing' if name in expected else 'unexpected'} tensor {name!r}")
    for name, shape in expected.items():
        arr = params[name]
        if tuple(arr.shape) != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {tuple(arr.shape)}, expected {shape}")
        if np.dtype(arr.dtype) != np.float32:
            raise CheckpointError(f"{where}: tensor {name!r} has dtype {np.dtype(arr.dtype)}, expected float32")
        if not np.all(np.isfinite(arr)):
            raise CheckpointError(f"{where}: tensor {name!r} holds non-finite values")


def _reason(path: Path, err: OSError) -> str:
    """Why ``path`` cannot be read, as the system says it: safetensors' reader words a refused open as "No such file
    or directory", so the file is opened once more here to ask."""
    try:
        with open(path, "rb"):
            pass
    except OSError as real:
        return real.strerror or str(real)
    return err.strerror or str(err)


def load_checkpoint(directory: str | Path, cfg: Config | None = None) -> Checkpoint:
    """Read and check a neutral checkpoint. The returned config is ``cfg`` (default: the defaults) with the
    checkpoint's model fields; a ``cfg`` whose model fields differ from the checkpoint's is refused."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    directory = Path(directory)
    config_file = directory / CONFIG_FILE
    try:
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: no such checkpoint directory")
    except OSError as err:  # a folder above it that cannot be searched
        raise CheckpointError(f"{directory}: cannot read it ({err.strerror or err})") from None
    config = read_json(config_file)
    if not isinstance(config, dict) or config.get("format") != FORMAT or not isinstance(config.get("model"), dict):
        raise CheckpointError(f"{config_file}: not a neutral checkpoint config (expected format {FORMAT!r} with a "
                              f"'model' section)")
    if config.get("version") != VERSION:
        raise CheckpointError(f"{config_file}: format version {config.get('version')!r}, this code reads version "
                              f"{VERSION}")
    model, tokenizer = dict(config["model"]), config.get("tokenizer_resolved")
    for name in ADDED_WITH_THE_LM:  # a checkpoint written before they existed is a classifier's
        model.setdefault(name, getattr(Config(), name))
    workload = model.get("workload")
    defaults = Config.for_workload(workload) if workload in WORKLOADS else Config()
    unknown_words = config.get("unknown_words")
    for name in MODEL_FIELDS:
        default = getattr(defaults, name)
        if name not in model:
            raise CheckpointError(f"{config_file}: model setting {name!r} is missing")
        if type(model[name]) is not type(default) and not (isinstance(default, float) and isinstance(model[name], int)):
            raise CheckpointError(f"{config_file}: model setting {name!r} has the wrong type")
    if workload not in WORKLOADS:
        raise CheckpointError(f"{config_file}: model setting 'workload' must be one of {', '.join(WORKLOADS)}")
    tokenizers = (LM_TOKENIZER,) if workload == "lm" else TOKENIZERS
    if tokenizer not in tokenizers:
        raise CheckpointError(f"{config_file}: 'tokenizer_resolved' must be one of {', '.join(tokenizers)}")
    if unknown_words not in UNKNOWN_RULES:
        raise CheckpointError(f"{config_file}: 'unknown_words' must be one of {', '.join(UNKNOWN_RULES)}")
    # Dropout rates are training settings: the caller's win (parity runs use 0 on any checkpoint).
    keep_callers = ("dropout", "fc_dropout") if cfg is not None else ()
    for name in MODEL_FIELDS if cfg is not None else ():
        asked, accepted = getattr(cfg, name), (getattr(defaults, name), model[name])
        # Asking for the tokenizer an 'auto' checkpoint resolved to is asking for what it has.
        if name not in keep_callers and asked not in accepted and not (name == "tokenizer" and asked == tokenizer):
            raise CheckpointError(f"{directory}: the checkpoint has {name}={model[name]!r} but "
                                  f"--{flag(name)} {asked!r} was asked for")
    try:
        merged = (cfg or defaults).replace(**{n: model[n] for n in MODEL_FIELDS if n not in keep_callers})
    except ConfigError as err:
        raise CheckpointError(f"{config_file}: {err}") from None

    tokens = read_json(directory / VOCAB_FILE)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{directory / VOCAB_FILE}: expected a JSON list of token strings")
    try:
        vocab = LMVocab(tuple(tokens)) if workload == "lm" else Vocab(tuple(tokens), unknown_words)
    except CheckpointError as err:
        raise CheckpointError(f"{directory / VOCAB_FILE}: {err}") from None

    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    try:
        params = load_file(str(weights))
    except OSError as err:  # permission denied, an I/O error, ...: the system's own words (safetensors' may differ)
        raise CheckpointError(f"{weights}: cannot read it ({_reason(weights, err)})") from None
    except (SafetensorError, ValueError) as err:
        raise CheckpointError(f"{weights}: unreadable safetensors file ({err})") from None
    validate_params(params, merged, len(vocab), where=str(weights))
    verify_manifest(directory)
    return Checkpoint(params, merged, vocab, tokenizer, config.get("meta", {}))

"""The training state behind ``--checkpoint-every`` / ``--resume``: everything a run needs to continue as if it
had never stopped (bitwise, on the CPU). One directory per checkpoint (``common.runstate`` names it and makes
it appear atomically):

    model.safetensors      parameters, under the state-dict names, in the compute dtype
    optimizer.safetensors  Adam's state per parameter: NAME.exp_avg, NAME.exp_avg_sq, NAME.step
    carry.safetensors      the carried hidden state h, c, each (L, B, H)
    rng.safetensors        torch's CPU generator state (uint8), and CUDA's when training on a GPU
    state.json             scalars: format, the run's config, progress, and the size and SHA-256 of every
                           file above (safetensors has no checksum of its own)
    progress.json          written by common.runstate

Any file that is missing, truncated or altered raises :class:`CheckpointError` naming it, so
``common.runstate.load_latest`` falls back to the previous checkpoint.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.errors import CheckpointError
from common.files import file_sha256
from common.runstate import Progress, read_progress

FORMAT = "lstm-twins/torch-training-state"
VERSION = 2  # 2: the last validation moved into progress.json
MODEL_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.safetensors"
CARRY_FILE, RNG_FILE, STATE_FILE = "carry.safetensors", "rng.safetensors", "state.json"
TENSOR_FILES = (MODEL_FILE, OPTIMIZER_FILE, CARRY_FILE, RNG_FILE)
ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")

@dataclass
class TrainingState:
    """What :func:`load_training_state` read: tensors on the CPU, scalars as saved."""

    params: dict[str, torch.Tensor]
    adam: dict[str, dict[str, torch.Tensor]]  # parameter name → {exp_avg, exp_avg_sq, step}
    hidden: tuple[torch.Tensor, torch.Tensor]
    rng: dict[str, torch.Tensor]  # 'cpu', and 'cuda' when saved on a GPU
    scalars: dict[str, Any]  # state.json


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def save_training_state(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                        hidden: tuple[torch.Tensor, torch.Tensor], cfg, progress: Progress) -> None:
    """Write the state files into ``directory`` (a fresh temporary directory from common.runstate)."""
    from safetensors.torch import save_file

    names = {id(p): name for name, p in model.named_parameters()}
    adam: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                adam[f"{names[id(p)]}.{key}"] = _cpu(value)
    rng = {"cpu": torch.get_rng_state()}
    if hidden[0].is_cuda:
        rng["cuda"] = torch.cuda.get_rng_state(hidden[0].device)
    tensors = {MODEL_FILE: {name: _cpu(t) for name, t in model.state_dict().items()},
               OPTIMIZER_FILE: adam,
               CARRY_FILE: {"h": _cpu(hidden[0]), "c": _cpu(hidden[1])},
               RNG_FILE: rng}
    files = {}
    for file_name, content in tensors.items():
        path = directory / file_name
        save_file(content, str(path))
        files[file_name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    group = optimizer.param_groups[0]
    scalars = {"format": FORMAT, "version": VERSION, "torch": torch.__version__, "config": cfg.to_dict(),
               "progress": progress.to_dict(), "device": str(hidden[0].device),
               "adam": {"lr": group["lr"], "betas": list(group["betas"]), "eps": group["eps"]},
               "files": files}
    scalars["digest"] = _digest(scalars)
    (directory / STATE_FILE).write_text(json.dumps(scalars, indent=1), encoding="utf-8")


def _read_scalars(directory: Path) -> dict[str, Any]:
    path = directory / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        scalars = json.loads(path.read_text(encoding="utf-8"))
        digest = scalars.pop("digest")
    except (UnicodeDecodeError, ValueError, AttributeError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: corrupt ({type(err).__name__})") from None
    if digest != _digest(scalars):
        raise CheckpointError(f"{path}: corrupt (its digest does not match its content)")
    if scalars.get("format") != FORMAT or scalars.get("version") != VERSION:
        raise CheckpointError(f"{path}: not a {FORMAT} version {VERSION} file")
    return scalars


def _read_tensors(path: Path, expected: dict[str, Any]) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise CheckpointError(f"{path}: truncated or altered ({size} bytes, {expected['bytes']} written)")
    if file_sha256(path) != expected["sha256"]:
        raise CheckpointError(f"{path}: corrupt (SHA-256 differs from the one recorded in {STATE_FILE})")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: unreadable safetensors file ({err})") from None


def load_training_state(directory: Path) -> tuple[Progress, TrainingState]:
    """Read and verify one checkpoint directory. Damage raises :class:`CheckpointError` naming the file
    (so the caller can fall back); common.runstate.load_latest refuses other trajectory settings."""
    directory = Path(directory)
    scalars = _read_scalars(directory)
    progress = read_progress(directory)
    if progress.to_dict() != scalars["progress"]:
        raise CheckpointError(f"{directory / 'progress.json'}: altered (it disagrees with {STATE_FILE})")
    content = {name: _read_tensors(directory / name, scalars["files"][name]) for name in TENSOR_FILES}
    adam: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in content[OPTIMIZER_FILE].items():
        name, _, part = key.rpartition(".")
        adam.setdefault(name, {})[part] = value
    carry = content[CARRY_FILE]
    return progress, TrainingState(content[MODEL_FILE], adam, (carry["h"], carry["c"]), content[RNG_FILE], scalars)


def restore_training_state(state: TrainingState, model: nn.Module, optimizer: torch.optim.Optimizer,
                           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Put ``state`` back into ``model``, ``optimizer`` and torch's generators; return the carried hidden."""
    model_state = model.state_dict()
    for name, value in state.params.items():
        if name not in model_state or model_state[name].shape != value.shape:
            raise CheckpointError(f"{MODEL_FILE}: tensor {name!r} does not fit the model")
    with torch.no_grad():
        for name, tensor in model_state.items():
            tensor.copy_(state.params[name])
    names = {id(p): name for name, p in model.named_parameters()}
    saved = optimizer.state_dict()
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            if name in state.adam:
                if set(state.adam[name]) != set(ADAM_KEYS):
                    raise CheckpointError(f"{OPTIMIZER_FILE}: {name!r} lacks some of {ADAM_KEYS}")
                saved["state"][index] = dict(state.adam[name])
            index += 1
    optimizer.load_state_dict(saved)  # casts exp_avg/exp_avg_sq to each parameter's device and dtype
    torch.set_rng_state(state.rng["cpu"])
    if "cuda" in state.rng and device.type == "cuda":
        torch.cuda.set_rng_state(state.rng["cuda"], device)
    dtype = model.fc.weight.dtype
    return tuple(t.to(device, dtype) for t in state.hidden)

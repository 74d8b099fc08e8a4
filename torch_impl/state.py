"""The training state behind ``--checkpoint-every`` / ``--resume``: everything a run needs to continue as if it
had never stopped (bitwise, on the CPU). One directory per checkpoint, made atomically by
:func:`write_checkpoint` (no library writes a directory of safetensors and JSON atomically and keeps the newest N):

    model.safetensors      parameters, under the state-dict names, in the compute dtype
    optimizer.safetensors  Adam's state per parameter: NAME.exp_avg, NAME.exp_avg_sq, NAME.step (SGD has none)
    carry.safetensors      the carried hidden state h, c (a GRU's: h), each (L, B, H)
    rng.safetensors        torch's CPU generator state (uint8), and CUDA's when training on a GPU
    state.json             format, version, the run's config, device and the optimizer's hyperparameters
    progress.json          common.runstate.Progress
    checksums.sha256       SHA-256 and size of every file above (safetensors has no checksum of its own)

A missing, extra, truncated or altered file is a :class:`CheckpointError` naming it: ``load_latest`` falls back.
"""
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from common.errors import CheckpointError, ConfigError
from common.files import atomic_dir, read_json, verify_manifest, write_json, write_manifest
from common.runstate import PREFIX, PROGRESS_FILE, Progress, checkpoint_dirs, read_progress, step_dir

FORMAT = "lstm-twins/torch-training-state"
VERSION = 4
MODEL_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.safetensors"
CARRY_FILE, RNG_FILE, STATE_FILE = "carry.safetensors", "rng.safetensors", "state.json"
ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")
Tensors = dict[str, torch.Tensor]


def write_checkpoint(root: str | Path, progress: Progress, write_state: Callable[[Path], None], keep: int = 3) -> Path:
    """Create ``root/step_N`` atomically (replacing one there: after a fallback past it): progress.json first,
    then ``write_state(dir)`` adds the twin's files. Older ones beyond the newest ``keep`` (≥ 1) are removed."""
    final = step_dir(root, progress.step)
    with atomic_dir(final, "training checkpoints") as tmp:
        write_json(tmp / PROGRESS_FILE, asdict(progress))
        write_state(tmp)
    for _, old in checkpoint_dirs(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in Path(root).glob(f".{PREFIX}*"):  # left by a run killed mid-write (one writer per root)
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def carry_tensors(hidden: torch.Tensor | tuple[torch.Tensor, ...]) -> Tensors:
    """The carry as named tensors: an LSTM's ``(h, c)`` → ``{"h", "c"}``, a GRU's ``h`` → ``{"h"}``."""
    return {"h": hidden} if isinstance(hidden, torch.Tensor) else dict(zip(("h", "c"), hidden))


def save_training_state(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                        hidden: torch.Tensor | tuple[torch.Tensor, torch.Tensor], cfg) -> None:
    """Write the state files into ``directory`` (write_checkpoint's, progress.json already there), then the
    checksums of all."""
    from safetensors.torch import save_file

    names = {id(p): name for name, p in model.named_parameters()}
    adam = {f"{names[id(p)]}.{key}": _cpu(value) for group in optimizer.param_groups for p in group["params"]
            for key, value in optimizer.state.get(p, {}).items()}
    carry = carry_tensors(hidden)
    device = carry["h"].device
    rng = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    save_file({name: _cpu(t) for name, t in model.state_dict().items()}, str(directory / MODEL_FILE))
    save_file(adam, str(directory / OPTIMIZER_FILE))
    save_file({name: _cpu(t) for name, t in carry.items()}, str(directory / CARRY_FILE))
    save_file(rng, str(directory / RNG_FILE))
    group = optimizer.param_groups[0]
    write_json(directory / STATE_FILE, {"format": FORMAT, "version": VERSION, "torch": torch.__version__,
                                        "config": cfg.to_dict(), "device": str(device),
                                        "optimizer": {k: group[k] for k in ("lr", "betas", "eps") if k in group}})
    write_manifest(directory)


def _check_version(path: Path) -> None:
    state = read_json(path)
    version = state.get("version") if isinstance(state, dict) and state.get("format") == FORMAT else None
    if version != VERSION:
        raise CheckpointError(f"{path}: not a {FORMAT} version {VERSION} file")


def load_training_state(directory: Path) -> tuple[Progress, dict[str, Tensors]]:
    """Read one checkpoint directory, every file checked against its checksum first: the progress and each
    safetensors file's tensors (on the CPU) by file name."""
    from safetensors.torch import load_file

    directory = Path(directory)
    verify_manifest(directory)
    _check_version(directory / STATE_FILE)
    # The bytes are the ones save_file wrote (checked above), so loading them cannot fail.
    content = {name: load_file(str(directory / name)) for name in (MODEL_FILE, OPTIMIZER_FILE, CARRY_FILE, RNG_FILE)}
    return read_progress(directory), content


def restore_training_state(content: dict[str, Tensors], model: nn.Module, optimizer: torch.optim.Optimizer,
                           device: torch.device) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Put what :func:`load_training_state` read back into ``model``, ``optimizer`` and torch's generators;
    return the carried hidden state: (h, c), or a GRU's h, each (L, B, H)."""
    params, model_state = content[MODEL_FILE], model.state_dict()
    for name in params.keys() | model_state.keys():
        if name not in params or name not in model_state or params[name].shape != model_state[name].shape:
            raise ConfigError(f"{MODEL_FILE}: tensor {name!r} does not fit this run's model: the data gives another "
                              f"vocabulary than the run had; resume with the run's data")
    model.load_state_dict(params)  # copies into each parameter, in its dtype
    names = {id(p): name for name, p in model.named_parameters()}
    adam, saved = content[OPTIMIZER_FILE], optimizer.state_dict()
    for index, name in enumerate(names[id(p)] for group in optimizer.param_groups for p in group["params"]):
        found = {key: adam[f"{name}.{key}"] for key in ADAM_KEYS if f"{name}.{key}" in adam}
        if 0 < len(found) < len(ADAM_KEYS):
            raise CheckpointError(f"{OPTIMIZER_FILE}: {name!r} lacks some of {ADAM_KEYS}")
        if found:
            saved["state"][index] = found
    optimizer.load_state_dict(saved)  # casts exp_avg/exp_avg_sq to each parameter's device and dtype
    rng = content[RNG_FILE]
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], device)
    carry, dtype = content[CARRY_FILE], next(model.parameters()).dtype
    hidden = tuple(carry[name].to(device, dtype) for name in ("h", "c") if name in carry)
    return hidden if len(hidden) == 2 else hidden[0]

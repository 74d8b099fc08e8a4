"""Training state on disk for ``--checkpoint-every`` / ``--resume``: Orbax, inside common.runstate's layout.

    RUN_DIR/step-00000100/train_state/          Orbax (StandardCheckpointHandler): params, opt_state, step, carry
    RUN_DIR/step-00000100/train_state.sha256    one line per file under train_state/: sha256, size, path
    RUN_DIR/step-00000100/progress.json         common.runstate: step, epoch, batch, skipped, best_val_loss

The dropout key is ``fold_in(key(cfg.seed), step)`` and the batch order a function of ``(seed, epoch)``, so
nothing random needs saving. Orbax reads a truncated file but not always a flipped byte (raw chunks carry no
checksum), so every file is hashed when written and checked before Orbax reads it: a damaged checkpoint is a
:class:`CheckpointError` naming the file, and ``common.runstate.load_latest`` falls back to the previous one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from common.errors import CheckpointError
from common.files import file_sha256

STATE_DIR = "train_state"
DIGEST_FILE = "train_state.sha256"


def _payload(state: Any, carry: Any) -> dict[str, Any]:
    return {"params": state.params, "opt_state": state.opt_state, "step": state.step, "carry": carry}


def _files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def save_training_state(directory: str | Path, state: Any, carry: Any) -> None:
    """Write ``state`` (``params``, ``opt_state``, ``step``) and ``carry`` under ``directory`` (a fresh
    directory from common.runstate.write_checkpoint, which adds progress.json and renames it into place)."""
    directory = Path(directory).absolute()  # Orbax accepts only absolute paths
    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as checkpointer:
        checkpointer.save(directory / STATE_DIR, args=ocp.args.StandardSave(_payload(state, carry)))
    lines = [f"{file_sha256(p)}  {p.stat().st_size}  {p.relative_to(directory).as_posix()}"
             for p in _files_under(directory / STATE_DIR)]
    (directory / DIGEST_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")


def verify_files(directory: Path) -> None:
    """Raise :class:`CheckpointError` naming the first file that is missing, extra, truncated or altered."""
    digest_path = directory / DIGEST_FILE
    try:
        text = digest_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{digest_path}: missing") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{digest_path}: unreadable ({err})") from None
    expected: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split("  ")
        if len(parts) != 3 or len(parts[0]) != 64 or not parts[1].isdigit():
            raise CheckpointError(f"{digest_path}: line {number} is corrupt")
        expected[parts[2]] = (parts[0], int(parts[1]))
    if not text.endswith("\n") or not expected:
        raise CheckpointError(f"{digest_path}: truncated")
    found = {p.relative_to(directory).as_posix(): p for p in _files_under(directory / STATE_DIR)}
    for name, (sha, size) in expected.items():
        path = directory / name
        if name not in found:
            raise CheckpointError(f"{path}: missing")
        if path.stat().st_size != size:
            raise CheckpointError(f"{path}: {path.stat().st_size} bytes, expected {size} (truncated or damaged)")
        if file_sha256(path) != sha:
            raise CheckpointError(f"{path}: contents differ from when it was written (damaged)")
    for name in found:
        if name not in expected:
            raise CheckpointError(f"{directory / name}: a file the checkpoint did not write")


def load_training_state(directory: str | Path, template_state: Any, template_carry: Any) -> tuple[Any, Any]:
    """Read ``(state, carry)`` written by :func:`save_training_state`, shaped like the templates (whose
    arrays also give the device). Every problem is a :class:`CheckpointError` naming the file."""
    directory = Path(directory).absolute()
    verify_files(directory)
    template = _payload(template_state, template_carry)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
    try:
        with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as checkpointer:
            restored = checkpointer.restore(directory / STATE_DIR, args=ocp.args.StandardRestore(abstract))
    except Exception as err:  # Orbax raises many types (ValueError, OSError, tensorstore errors, ...)
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CheckpointError(f"{directory / STATE_DIR}: unreadable training state "
                              f"({type(err).__name__}: {first_line[:200]})") from None
    _check_like(restored, template, directory / STATE_DIR)
    state = template_state.replace(params=restored["params"], opt_state=restored["opt_state"],
                                   step=restored["step"])
    return state, restored["carry"]


def _check_like(restored: Any, template: Any, where: Path) -> None:
    """Same tree, shapes and dtypes as ``template``, and every float finite."""
    got, tree = jax.tree_util.tree_flatten_with_path(restored)
    want, want_tree = jax.tree_util.tree_flatten_with_path(template)
    if tree != want_tree:
        raise CheckpointError(f"{where}: the saved state has a different structure than this model's")
    for (path, arr), (_, ref) in zip(got, want):
        name = jax.tree_util.keystr(path)
        if tuple(arr.shape) != tuple(ref.shape) or arr.dtype != ref.dtype:
            raise CheckpointError(f"{where}: {name} is {arr.dtype}{list(arr.shape)}, "
                                  f"expected {ref.dtype}{list(ref.shape)}")
        if jnp.issubdtype(arr.dtype, jnp.floating) and not bool(np.all(np.isfinite(np.asarray(arr)))):
            raise CheckpointError(f"{where}: {name} holds non-finite values")

"""Training state on disk for ``--checkpoint-every`` / ``--resume``: one Orbax ``CheckpointManager`` step each.

    RUN_DIR/step_00000100/train_state/       Orbax StandardSave: params, opt_state, step, carry
    RUN_DIR/step_00000100/progress/          Orbax JsonSave: common.runstate.Progress
    RUN_DIR/step_00000100/checksums.sha256   SHA-256 and size of every other file of the step, written last

Orbax makes each step directory appear atomically and keeps the newest N (a ``LatestN`` preservation policy).
The dropout key is ``fold_in(key(cfg.seed), step)`` and the batch order a function of ``(seed, epoch)``, so
nothing random needs saving. Orbax checksums only its shard index, not the array data, hence our checksums on
top: a flipped byte in a data chunk is then an error naming the file, not silently different numbers. A step
without them (killed between Orbax's commit and ours) counts as damaged like any other, and
``common.runstate.load_latest`` falls back to the previous one.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from common.errors import CheckpointError
from common.files import file_sha256
from common.runstate import DIGITS, PREFIX, Progress, step_dir

STATE_ITEM, PROGRESS_ITEM = "train_state", "progress"
CHECKSUM_FILE = "checksums.sha256"


def _manager(root: Path, keep: int | None = None) -> ocp.CheckpointManager:
    """A manager over ``root`` whose step directories are named as common.runstate names them; ``keep``: write
    access, keeping the newest ``keep`` steps (else read-only)."""
    options = ocp.CheckpointManagerOptions(
        step_name_format=ocp.step.standard_name_format(step_prefix=PREFIX.rstrip("_"), step_format_fixed_length=DIGITS),
        preservation_policy=ocp.checkpoint_managers.LatestN(keep) if keep else None,
        create=keep is not None, read_only=keep is None)
    return ocp.CheckpointManager(root.absolute(), options=options)


def _payload(state: Any, carry: Any) -> dict[str, Any]:
    return {"params": state.params, "opt_state": state.opt_state, "step": state.step, "carry": carry}


def _files(path: Path) -> dict[str, Path]:
    return {p.relative_to(path).as_posix(): p for p in sorted(path.rglob("*"))
            if p.is_file() and not p.name.startswith(CHECKSUM_FILE)}


def save_training_state(root: str | Path, progress: Progress, state: Any, carry: Any, keep: int) -> Path:
    """Write ``state`` (``params``, ``opt_state``, ``step``), ``carry`` and ``progress`` as step
    ``progress.step`` under ``root``, then its checksums. Steps from ``progress.step`` on that are already there
    (left by a run that fell back past them) are deleted first: Orbax refuses to save below its latest step."""
    root = Path(root).absolute()
    with _manager(root, keep) as manager:
        for old in manager.all_steps():
            if old >= progress.step:
                manager.delete(old)
        manager.save(progress.step, args=ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(_payload(state, carry)),
            PROGRESS_ITEM: ocp.args.JsonSave(progress.to_dict())}))
        manager.wait_until_finished()  # saving is asynchronous by default; the checksums need the files
    path = step_dir(root, progress.step)
    lines = [f"{file_sha256(p)}  {p.stat().st_size}  {name}" for name, p in _files(path).items()]
    tmp = path / f"{CHECKSUM_FILE}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / CHECKSUM_FILE)
    return path


def verify_files(path: Path) -> None:
    """Raise :class:`CheckpointError` naming the first file that is missing, extra, truncated or altered."""
    checksums = path / CHECKSUM_FILE
    try:
        text = checksums.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{checksums}: missing") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{checksums}: unreadable ({err})") from None
    expected: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split("  ")
        if len(parts) != 3 or len(parts[0]) != 64 or not parts[1].isdigit():
            raise CheckpointError(f"{checksums}: line {number} is corrupt")
        expected[parts[2]] = (parts[0], int(parts[1]))
    if not text.endswith("\n") or not expected:
        raise CheckpointError(f"{checksums}: truncated")
    found = _files(path)
    for name, (sha, size) in expected.items():
        file = path / name
        if name not in found:
            raise CheckpointError(f"{file}: missing")
        if file.stat().st_size != size:
            raise CheckpointError(f"{file}: {file.stat().st_size} bytes, expected {size} (truncated or damaged)")
        if file_sha256(file) != sha:
            raise CheckpointError(f"{file}: contents differ from when it was written (damaged)")
    for name in found:
        if name not in expected:
            raise CheckpointError(f"{path / name}: a file the checkpoint did not write")


def load_training_state(path: str | Path, template_state: Any, template_carry: Any
                        ) -> tuple[Progress, tuple[Any, Any]]:
    """Read ``(progress, (state, carry))`` from the step directory ``path``, shaped like the templates (whose
    arrays also give the devices). Every problem is a :class:`CheckpointError` naming the file."""
    path = Path(path).absolute()
    verify_files(path)
    template = _payload(template_state, template_carry)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
    try:
        with _manager(path.parent) as manager:
            restored = manager.restore(int(path.name[len(PREFIX):]), args=ocp.args.Composite(**{
                STATE_ITEM: ocp.args.StandardRestore(abstract), PROGRESS_ITEM: ocp.args.JsonRestore()}))
    except Exception as err:  # Orbax raises many types (ValueError, OSError, tensorstore errors, ...)
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CheckpointError(f"{path}: unreadable training state ({type(err).__name__}: {first_line[:200]})") \
            from None
    arrays = restored[STATE_ITEM]
    _check_like(arrays, template, path / STATE_ITEM)
    progress = Progress.from_dict(restored[PROGRESS_ITEM], path / PROGRESS_ITEM)
    if int(arrays["step"]) != progress.step:
        raise CheckpointError(f"{path}: the progress says step {progress.step}, the training state "
                              f"{int(arrays['step'])}")
    state = template_state.replace(params=arrays["params"], opt_state=arrays["opt_state"], step=arrays["step"])
    return progress, (state, arrays["carry"])


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

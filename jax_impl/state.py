"""Training state on disk for ``--checkpoint-every`` / ``--resume``: one Orbax ``CheckpointManager`` step each.

    RUN_DIR/step_00000100/train_state/       Orbax StandardSave: params, opt_state, step, carry
    RUN_DIR/step_00000100/progress/          Orbax JsonSave: common.runstate.Progress
    RUN_DIR/step_00000100/checksums.sha256   common.files' manifest of every other file of the step, written last

Orbax makes each step appear atomically and keeps the newest N (a ``LatestN`` preservation policy). Nothing random
is saved: the dropout key is ``fold_in(key(cfg.seed), step)``, the batch order a function of ``(seed, epoch)``.
Orbax checksums only its shard index, not the array data, hence our checksums on top. A step without them (killed
between Orbax's commit and ours) counts as damaged, and ``common.runstate.load_latest`` falls back.
"""
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from common.errors import CheckpointError
from common.files import finite_json, verify_manifest, write_manifest
from common.runstate import DIGITS, PREFIX, Progress, step_dir

STATE_ITEM, PROGRESS_ITEM = "train_state", "progress"


def _manager(root: Path, keep: int) -> ocp.CheckpointManager:
    """A manager over ``root`` whose step directories are named as common.runstate names them, keeping the newest
    ``keep`` steps."""
    options = ocp.CheckpointManagerOptions(
        step_name_format=ocp.step.standard_name_format(step_prefix=PREFIX.rstrip("_"), step_format_fixed_length=DIGITS),
        preservation_policy=ocp.checkpoint_managers.LatestN(keep), create=True)
    return ocp.CheckpointManager(root.absolute(), options=options)


def _payload(state: Any, carry: Any) -> dict[str, Any]:
    return {"params": state.params, "opt_state": state.opt_state, "step": state.step, "carry": carry}


def save_training_state(root: str | Path, progress: Progress, state: Any, carry: Any, keep: int) -> Path:
    """Write ``state`` (``params``, ``opt_state``, ``step``), ``carry`` and ``progress`` as step
    ``progress.step`` under ``root``, then its checksums. Steps from ``progress.step`` on that are already there
    (left by a run that fell back past them) are deleted first: Orbax refuses to save below its latest step. So are
    Orbax's temporary step directories, the debris of a save a kill cut short (one run writes a root at a time):
    left, Orbax would remove the one it meets again itself, logging a warning through absl into the run's output."""
    root = Path(root).absolute()
    with _manager(root, keep) as manager:
        for old in [step for step in manager.all_steps() if step >= progress.step]:
            manager.delete(old)
        for debris in ocp.step.tmp_checkpoints(root):
            shutil.rmtree(root / debris, ignore_errors=True)
        manager.save(progress.step, args=ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(_payload(state, carry)),
            PROGRESS_ITEM: ocp.args.JsonSave(finite_json(asdict(progress)))}))  # standard JSON: no NaN
        manager.wait_until_finished()  # saving is asynchronous by default; the checksums need the files
    return write_manifest(step_dir(root, progress.step))


def load_training_state(path: str | Path, template_state: Any, template_carry: Any
                        ) -> tuple[Progress, tuple[Any, Any]]:
    """Read ``(progress, (state, carry))`` from the step directory ``path``, shaped like the templates (whose
    arrays also give the devices). Every problem is a :class:`CheckpointError` naming the file."""
    path = Path(path).absolute()
    verify_manifest(path)
    template = _payload(template_state, template_carry)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
    try:
        # One step directory, read as the manager wrote it (its items are a composite's), without a manager: a
        # read-only one would log warnings on every resume, and one with write access is not needed.
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
            restored = checkpointer.restore(path, args=ocp.args.Composite(**{
                STATE_ITEM: ocp.args.StandardRestore(abstract), PROGRESS_ITEM: ocp.args.JsonRestore()}))
    except Exception as err:  # Orbax raises many types (ValueError, OSError, tensorstore errors, ...)
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"{path}: unreadable training state ({type(err).__name__}: {first})") from None
    arrays = restored[STATE_ITEM]
    _check_like(arrays, template, path / STATE_ITEM)
    progress = Progress.from_dict(restored[PROGRESS_ITEM], path / PROGRESS_ITEM)
    if int(arrays["step"]) != progress.step:
        raise CheckpointError(f"{path}: the progress says step {progress.step}, the state {int(arrays['step'])}")
    state = template_state.replace(params=arrays["params"], opt_state=arrays["opt_state"], step=arrays["step"])
    return progress, (state, arrays["carry"])


def _check_like(restored: Any, template: Any, where: Path) -> None:
    """Same tree, shapes and dtypes as ``template``, and every float finite."""
    got, tree = jax.tree_util.tree_flatten_with_path(restored)
    want, want_tree = jax.tree_util.tree_flatten_with_path(template)
    if tree != want_tree:
        raise CheckpointError(f"{where}: the saved state has a different structure than this model's")
    for (key, arr), (_, ref) in zip(got, want):
        name = jax.tree_util.keystr(key)
        if tuple(arr.shape) != tuple(ref.shape) or arr.dtype != ref.dtype:
            raise CheckpointError(f"{where}: {name} is {arr.dtype}{list(arr.shape)}, not {ref.dtype}{list(ref.shape)}")
        if jnp.issubdtype(arr.dtype, jnp.floating) and not bool(np.all(np.isfinite(np.asarray(arr)))):
            raise CheckpointError(f"{where}: {name} holds non-finite values")

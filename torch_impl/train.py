"""Train the classic notebook's sentiment LSTM in PyTorch: ``python -m torch_impl.train [--epochs 4] ...``, or
pytorch/examples' word-level language model: ``python -m torch_impl.train --workload lm [--cell gru] ...``.

The loop is ``common.loop.train``, the same program as ``jax_impl.train``: the hidden state starts at zeros
each epoch and is carried from batch to batch; the workload's ``forward`` (:mod:`torch_impl.classifier`,
:mod:`torch_impl.lm`) detaches it at the start of every batch or window (``repackage_hidden``), then its loss (BCELoss
on the sigmoid output; the language model's cross-entropy), and :func:`torch_impl.step.update` clips the gradients at
``--clip`` and steps Adam or SGD. :class:`TorchTwin` is the PyTorch side of the loop. ``--no-detach`` reproduces the
seed's famous error.

Several devices: ``torchrun --nproc_per_node N -m torch_impl.train ...`` trains the same global batches with
DistributedDataParallel, each process on its slice of every batch (:mod:`torch_impl.distributed`).
"""
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from common import interrupts, loop
from common.batches import Batch
from common.config import Config, parse_config
from common.errors import ConfigError, cli_main
from common.params import Params
from common.precision import BFLOAT16_RULES
from common.runstate import Progress
from torch_impl.distributed import (World, check_config, dropout_seed, join_process_group,
                                     leave_process_group, world_from_environment, wrap)
from torch_impl import classifier, lm, step
from torch_impl.model import Hidden, export_params, load_params
from torch_impl.state import (load_training_state, restore_training_state, save_training_state,
                              write_checkpoint)
from torch_impl.numerics import lstm_kernel, resolve_device, resolve_dtype, set_numerics
from torch_impl.step import TrainState, make_optimizer, set_lr

PROG = "python -m torch_impl.train"


def no_detach_message(err: RuntimeError) -> str:
    pytorch_says = str(err).split(". ")[0].strip()
    return (f"PyTorch: \"{pytorch_says}.\" This is the seed's bug, reproduced on purpose by --no-detach: the "
            f"hidden state carried from the previous batch still points into that batch's graph, which "
            f"backward() has already freed. The fix is to detach the carry at every batch (repackage_hidden), "
            f"which is the default: drop --no-detach.")


WORKLOADS = {"classifier": classifier, "lm": lm}  # each workload's PyTorch side: the twin reads one, once


class TorchTwin:
    """The PyTorch twin for ``common.loop``, either workload (:data:`WORKLOADS`: its model, loss and evaluation). Under
    torchrun (``world``, the classifier) each process trains through DDP on its rows of every batch and carries their
    hidden state; rank 0 prints and writes files. For the bench, :meth:`lower` and :meth:`train_step_parts`."""

    def __init__(self, cfg: Config, vocab_size: int, device: torch.device, world: World | None):
        self.cfg, self.world, self.device, self.workload = cfg, world, device, WORKLOADS[cfg.workload]
        numerics = set_numerics(cfg, device)  # before the model: its initialisation starts the intra-op threads
        model = self.workload.model_from_config(cfg, vocab_size)
        self.model = model.to(device=device, dtype=resolve_dtype(cfg.dtype))
        self.parts = None  # train_step_parts' workload parts, made at its first call
        self.is_main = world is None or world.is_main
        self.processes = world.size if world else 1
        kernel = lstm_kernel(cfg, device)
        self.record = {"framework": "torch", "torch": torch.__version__, "device": str(device),
                       "devices": self.processes, "dtype": cfg.dtype,
                       "lstm_impl": f"nn.{cfg.cell.upper()}", "lstm_kernel": kernel,  # the classifier's cell: lstm
                       **numerics}
        if cfg.dtype == "bfloat16":  # what autocast computes in bfloat16 with this kernel
            self.record["bfloat16"] = BFLOAT16_RULES[kernel]

    def init_state(self, params: Params) -> TrainState:
        load_params(self.model, params)
        seed = self.cfg.seed if self.world is None else dropout_seed(self.cfg.seed, self.world.rank)
        torch.manual_seed(seed)  # dropout's stream
        trained = self.model if self.world is None else wrap(self.model)
        if self.cfg.torch_compile:  # Dynamo and Inductor do their work inside the first call
            trained = torch.compile(trained)
        return TrainState(trained, make_optimizer(self.model, self.cfg))

    def init_carry(self, batch_size: int | None = None) -> Hidden:
        return self.model.init_hidden((batch_size or self.cfg.batch_size) // self.processes)

    def train_step(self, state: TrainState, carry: Hidden, batch: Batch) -> tuple[TrainState, Hidden, float]:
        batch = batch if self.world is None else self.world.part(batch)  # this rank's contiguous rows
        try:
            state, carry, loss = self.workload.train_step(state, carry, batch, self.cfg)
        except RuntimeError as err:  # then ``carry`` is still the incoming one
            if not self.cfg.detach and carry[0].grad_fn is not None:  # it reaches into the previous batch's graph
                raise ConfigError(no_detach_message(err)) from None
            raise
        # Under DDP the mean over ranks: a NaN on one rank is a NaN on all, so every rank stops at this step.
        return state, carry, (loss if self.world is None else self.world.mean(loss)).item()

    def eval_step(self, state: TrainState, carry: Any, batch: Any) -> tuple[Any, tuple[Any, Any]]:
        model = state.model if self.cfg.torch_compile else self.model  # (under DDP state.model is the wrapper)
        batch = batch if self.world is None else self.world.part(batch)
        if batch.size == 0:  # a last batch smaller than the number of ranks
            return carry, (0.0, 0)
        return self.workload.eval_step(model, carry, batch, self.cfg)

    def sum_over_processes(self, loss_sum: float, second: float) -> tuple[float, float]:
        return (loss_sum, second) if self.world is None else tuple(self.world.sum(loss_sum, second))

    def set_lr(self, state: TrainState, lr: float) -> TrainState:
        set_lr(state.optimizer, lr)
        return state

    def export_params(self, state: TrainState) -> Params:
        return export_params(self.model)

    def import_params(self, state: TrainState, read: Callable[[], Params]) -> TrainState:
        if self.is_main:
            load_params(self.model, read())
        if self.world is not None:
            self.world.broadcast_params(self.model)  # rank 0 read them
        return state

    def save_state(self, root: Path, progress: Progress, state: TrainState, carry: Hidden, keep: int) -> None:
        saved = carry if self.world is None else self.world.gather_hidden(carry)  # the global carry
        if self.is_main:
            write_checkpoint(root, progress, lambda d: save_training_state(
                d, self.model, state.optimizer, saved, self.cfg), keep=keep)

    def restore_state(self, path: Path, state: TrainState, carry: Hidden) -> tuple[Progress, tuple[Any, Hidden]]:
        progress, saved = load_training_state(path)
        carry = restore_training_state(saved, self.model, state.optimizer, self.device)
        if self.world is not None:
            carry = self.world.part_hidden(carry)  # the checkpoint holds the global carry
            if not self.world.is_main:  # and rank 0's generator only
                torch.manual_seed(dropout_seed(self.cfg.seed, self.world.rank, progress.step))
        return progress, (state, carry)

    def lower(self, kind: str, state: TrainState, carry: Hidden, batch: Any) -> None:
        """Nothing to lower: PyTorch runs its steps eagerly (under --torch-compile, Dynamo works inside the first
        call)."""

    def train_step_parts(self, state: TrainState, carry: Any, batch: Any, clock: Any
                         ) -> tuple[TrainState, Any, float, dict[str, float]]:
        """:meth:`train_step` from its parts, the workload's ``forward`` and :mod:`torch_impl.step`'s ``backward`` and
        ``update``, ``clock.lap()`` read after each (after a device sync), then the workload's own parts (the language
        model's ``decoder``): ``(state, carry, loss, seconds per part)``."""
        if self.parts is None:
            self.parts = self.workload.timed_parts(self.model)
        loss, new_carry, finite = self.workload.forward(state.model, carry, batch, self.cfg)
        forward = clock.lap()
        step.backward(state.model, loss)
        backward = clock.lap()
        state, carry, loss = step.update(state, carry, new_carry, loss, finite, self.cfg)
        parts = {"forward": forward, "backward": backward, "optimizer": clock.lap(), **self.parts(batch, clock)}
        return state, carry, loss.item(), parts


@contextmanager
def twin_maker(cfg: Config) -> Iterator[Callable[[Config, int], TorchTwin]]:
    """How :func:`train` builds its twin: the device and, started by torchrun with WORLD_SIZE > 1, the process group,
    joined here and left on exit. The benchmark's workers build theirs through it too."""
    if cfg.lstm_impl != "auto":
        raise ConfigError(f"--lstm-impl {cfg.lstm_impl} is JAX-only: PyTorch runs nn.LSTM (leave --lstm-impl auto)")
    if cfg.flax_api != "linen":
        raise ConfigError(f"--flax-api {cfg.flax_api} is JAX-only: PyTorch runs nn.LSTM (leave --flax-api linen)")
    world = world_from_environment()
    WORKLOADS[cfg.workload].check_world(world)
    check_config(cfg, world)
    device = resolve_device(cfg.device)
    resolve_dtype(cfg.dtype)
    if world is None:
        yield lambda cfg, vocab_size: TorchTwin(cfg, vocab_size, device, None)
        return
    device = join_process_group(world, device)
    try:
        yield lambda cfg, vocab_size: TorchTwin(cfg, vocab_size, device, world)
    finally:
        leave_process_group()


def train(cfg: Config) -> dict[str, Any]:
    """The full run (see ``common.loop.train`` for the result's keys). Started by torchrun with WORLD_SIZE > 1,
    it is one rank of a data-parallel run."""
    with twin_maker(cfg) as make_twin:
        return loop.train(cfg, make_twin)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv, prog=PROG, description="Train the sentiment LSTM or the word-level language model "
                       "(PyTorch).")
    train(cfg)
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())

"""Data parallelism in PyTorch: DDP, one process per device (``torchrun --nproc_per_node N -m torch_impl.train``).

Every rank reads the same global batch of B rows and trains on its contiguous b = B / N of them, carrying
their hidden state. Its loss is the mean over its b rows and DDP averages the gradients,
(1/N) Σ_r (1/b) Σ_{i∈r} ∇ℓ_i = (1/B) Σ_i ∇ℓ_i, so clipping (after the all-reduce) sees the global gradient:
results equal one process's up to the order of float sums, with dropout 0 (each rank draws its own masks).
Evaluation sums are all-reduced; rank 0 writes.

A failing rank ends the run: torchrun stops the others when one exits, and a collective that a rank never
joins fails after :data:`TIMEOUT_S` (not PyTorch's 30 minutes). The step's loss is the mean over ranks, so a NaN
on one rank is a NaN on all of them, and every rank stops at the same step with the same line.
"""
import os
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from common.batches import Batch
from common.config import Config
from common.errors import ConfigError
from torch_impl.model import Hidden

# Longer than any wait between two collectives (rank 0 alone writing a checkpoint), far shorter than 30 minutes.
TIMEOUT_S = float(os.environ.get("LSTM_TWINS_DDP_TIMEOUT", "60"))


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` ranks (``local_rank``: its device index on its machine)."""

    rank: int
    size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rows(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` rows; shares differ by at most one where size does not divide n."""
        return slice(n * self.rank // self.size, n * (self.rank + 1) // self.size)

    def part(self, batch: Batch) -> Batch:
        """This rank's rows of a global batch."""
        rows = self.rows(batch.size)
        return Batch(batch.tokens[rows], batch.labels[rows], batch.lengths[rows])

    def part_hidden(self, hidden: Hidden) -> Hidden:
        """This rank's rows of a global carry (a resumed checkpoint's): (L, B, H) → (L, B / size, H)."""
        return tuple(t[:, self.rows(t.shape[1])].contiguous() for t in hidden)

    def gather_hidden(self, hidden: Hidden) -> Hidden:
        """Every rank's carry (L, B / size, H), in rank order → the global (L, B, H). A collective."""
        parts = [[torch.empty_like(t) for _ in range(self.size)] for t in hidden]
        for p, t in zip(parts, hidden):
            dist.all_gather(p, t.contiguous())
        return tuple(torch.cat(p, dim=1) for p in parts)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar over ranks (gloo has no AVG, hence SUM / size). A collective."""
        total = value.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total / self.size

    def sum(self, *values: float) -> list[float]:
        """Sums over ranks of a few host numbers, in float64 (on the current GPU under NCCL). A collective."""
        total = torch.tensor(values, dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.tolist()

    def broadcast_params(self, module: nn.Module) -> None:
        """Copy rank 0's parameters to every rank (rank 0 alone read them from disk). A collective."""
        for tensor in module.state_dict().values():  # detached views: writing them writes the parameters
            dist.broadcast(tensor, src=0)


def world_from_environment() -> World | None:
    """The torchrun world (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), or None for a single process."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return World(int(os.environ["RANK"]), size, int(os.environ.get("LOCAL_RANK", "0"))) if size > 1 else None


def check_config(cfg: Config, world: World | None) -> None:
    """--devices must agree with torchrun, and the global batch must split evenly (exact averaging)."""
    size = world.size if world else 1
    if cfg.devices not in (0, size):
        raise ConfigError(f"--devices {cfg.devices}: PyTorch takes the device count from torchrun (here {size}); "
                          f"run `torchrun --nproc_per_node {cfg.devices} -m torch_impl.train ...` or pass --devices 0")
    if cfg.batch_size % size:
        raise ConfigError(f"--batch-size {cfg.batch_size} does not split evenly over {size} processes: pass a "
                          f"--batch-size that is a multiple of {size}, or a --nproc_per_node that divides "
                          f"{cfg.batch_size}")
    if cfg.torch_compile and world:
        raise ConfigError("--torch-compile is for one process: under torchrun, leave it off")


def join_process_group(world: World, device: torch.device) -> torch.device:
    """Join torchrun's process group (NCCL on CUDA, else gloo); this rank's device (``cuda:LOCAL_RANK`` on GPUs)."""
    if device.type == "cuda":
        if world.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"rank {world.rank}: LOCAL_RANK {world.local_rank} needs GPU {world.local_rank}, but "
                              f"PyTorch sees {torch.cuda.device_count()} here; pass a --nproc_per_node of at most "
                              f"{torch.cuda.device_count()}, or --device cpu")
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=world.rank, world_size=world.size,
                            timeout=timedelta(seconds=TIMEOUT_S))
    return device


def wrap(model: nn.Module) -> nn.parallel.DistributedDataParallel:
    """DDP over ``model`` (already on this rank's device); broadcasts rank 0's weights once."""
    device = next(model.parameters()).device
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def dropout_seed(seed: int, rank: int, step: int = 0) -> int:
    """Rank 0 keeps ``seed``; other ranks get distinct streams, restarted at ``step`` (a checkpoint holds rank 0's)."""
    return seed if rank == 0 else int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

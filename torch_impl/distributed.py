"""Data parallelism in PyTorch: DistributedDataParallel, one process per device, started by torchrun.

    torchrun --nproc_per_node N -m torch_impl.train ...      # WORLD_SIZE > 1: gloo on CPU, NCCL on GPUs

Every rank reads the same global batch of B rows from ``common.batches`` (same seed, same order) and trains
on its contiguous slice of B / N rows, carrying the hidden state of those rows. Each rank's loss is the
mean BCE over its slice; DDP averages the ranks' gradients during ``backward()``. With equal slices that is
exactly the gradient of the mean over the global batch, (1/N) Σ_r (1/b) Σ_{i∈r} ∇ℓ_i = (1/B) Σ_i ∇ℓ_i
(PyTorch's BCELoss 'mean' divides by the rows it sees, b = B / N), so clip_grad_norm_, applied after DDP's
all-reduce, sees the global gradient and clips it as one process would. The reported loss is the mean of
the ranks' losses (an all-reduce), i.e. the global batch's mean. Results equal one process's up to the
order of floating-point sums, with dropout 0; with dropout each rank draws its own masks.

Evaluation: every rank scores its share of each evaluation batch with the unwrapped module and the sums
are all-reduced, so every rank knows the same validation loss. Only rank 0 prints and writes files.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from common.batches import Batch
from common.config import Config
from common.errors import ConfigError

Hidden = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (L, B, H)


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
        """This rank's contiguous share of ``n`` rows: n / size of them when size divides n (training
        batches, checked at start-up), otherwise shares differing by at most one (evaluation batches)."""
        return slice(n * self.rank // self.size, n * (self.rank + 1) // self.size)

    def part(self, batch: Batch) -> Batch:
        """This rank's rows of a global batch."""
        rows = self.rows(batch.size)
        return Batch(batch.tokens[rows], batch.labels[rows], batch.lengths[rows])

    def part_hidden(self, hidden: Hidden) -> Hidden:
        """This rank's rows of a global carry (L, B, H) → (L, B / size, H) (a resumed checkpoint's)."""
        rows = self.rows(hidden[0].shape[1])
        return tuple(t[:, rows].contiguous() for t in hidden)

    def gather_hidden(self, hidden: Hidden) -> Hidden:
        """Every rank's carry (L, B / size, H), concatenated in rank order → the global (L, B, H) (for a
        training checkpoint, which holds the global carry as one process would). A collective: all ranks."""
        out = []
        for t in hidden:
            parts = [torch.empty_like(t) for _ in range(self.size)]
            dist.all_gather(parts, t.contiguous())
            out.append(torch.cat(parts, dim=1))
        return tuple(out)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar over ranks (gloo has no AVG, hence SUM / size). A collective."""
        total = value.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total / self.size

    def sum(self, *values: float) -> list[float]:
        """Sums over ranks of a few host numbers, in float64. A collective."""
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        total = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.tolist()

    def broadcast_params(self, module: nn.Module) -> None:
        """Copy rank 0's parameters to every rank (after rank 0 alone read them from disk). A collective."""
        with torch.no_grad():
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)


def world_from_environment() -> World | None:
    """The torchrun world (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), or None for a single process."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    return World(rank=int(os.environ["RANK"]), size=size, local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def check_config(cfg: Config, world: World | None) -> None:
    """--devices must agree with torchrun, and the global batch must split evenly (exact averaging)."""
    size = world.size if world else 1
    if cfg.devices not in (0, size):
        raise ConfigError(f"--devices {cfg.devices}: PyTorch runs one process per device and takes the count "
                          f"from torchrun (here {size}); start it as `torchrun --nproc_per_node {cfg.devices} "
                          f"-m torch_impl.train ...` (or leave --devices at 0)")
    if cfg.batch_size % size:
        raise ConfigError(f"--batch-size {cfg.batch_size} does not split evenly over {size} processes: pass a "
                          f"--batch-size that is a multiple of {size}, or a --nproc_per_node that divides "
                          f"{cfg.batch_size}")


def join_process_group(world: World, device: torch.device) -> torch.device:
    """Join the process group (NCCL for CUDA, gloo for the CPU; rendezvous from torchrun's MASTER_ADDR /
    MASTER_PORT) and return this rank's device (``cuda:LOCAL_RANK`` on GPUs)."""
    if device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=world.rank, world_size=world.size)
    return device


def wrap(model: nn.Module) -> DistributedDataParallel:
    """DDP over ``model`` (already on this rank's device); broadcasts rank 0's weights once."""
    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def dropout_seed(seed: int, rank: int, step: int = 0) -> int:
    """The seed of a rank's dropout stream: rank 0 keeps ``seed`` (its masks are those of a single process),
    the others get distinct streams. ``step``: where a resumed run restarts the streams of ranks > 0 (a
    training checkpoint holds rank 0's generator state only)."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

"""Data parallelism in JAX: the same jitted ``train_step``, its batch axis sharded over a 1-D ``("data",)`` mesh.

Batch-axis arrays (tokens (B, T), labels (B,), lengths (B,), carry (B, H)) go to ``place.data``, the rest (params,
optimizer state, the dropout key) to ``place.replicated``; jit compiles for those shardings and XLA's SPMD
partitioner splits the batch and inserts the all-reduces itself: no pmap, no hand-written psum. Results equal one
device's up to the order of float sums: the dropout key is ``fold_in(key(seed), step)``, and JAX's random bits
depend on the key and the global shape, not the sharding, so every row gets the same mask. One process, one host:
several hosts (``jax.distributed``) are not supported (docs/distributed.md).
"""
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from common.config import Config
from common.errors import ConfigError

Where = jax.Device | jax.sharding.Sharding  # what jax.device_put places onto: one device, or a sharding


@dataclass(frozen=True)
class Placement:
    """``data`` for arrays with a leading batch axis, ``replicated`` for the rest; on one device, both that device."""

    data: Where
    replicated: Where
    devices: int
    mesh: Mesh | None = None

    def describe(self) -> str:
        """``cpu:0`` for one device, ``2x cpu (data-parallel)`` for a mesh."""
        mesh = self.mesh
        return str(self.data) if mesh is None else f"{self.devices}x {mesh.devices.flat[0].platform} (data-parallel)"


def placement(cfg: Config, device: jax.Device) -> Placement:
    """``--devices`` on ``device``'s platform: 0 means every device JAX sees there, N the first N. ``--batch-size``
    must split evenly over them; a :class:`ConfigError` says what to change."""
    available = jax.devices(device.platform)
    count = cfg.devices or len(available)
    if count > len(available):
        hint = (" (for simulated CPU devices, set XLA_FLAGS=--xla_force_host_platform_device_count="
                f"{count} before starting Python)") if device.platform == "cpu" else ""
        raise ConfigError(f"--devices {count}: JAX sees only {len(available)} {device.platform} device(s){hint}")
    if cfg.batch_size % count:
        raise ConfigError(f"--batch-size {cfg.batch_size} does not split evenly over {count} devices: pass a "
                          f"--batch-size that is a multiple of {count}, or a --devices count that divides "
                          f"{cfg.batch_size}")
    if count == 1:
        return Placement(data=device, replicated=device, devices=1)
    mesh = Mesh(np.array(available[:count]), ("data",))  # Auto axis: shardings propagate through jit
    return Placement(NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec()), count, mesh)


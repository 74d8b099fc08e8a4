"""Data parallelism in JAX: the same jitted ``train_step``, its batch axis sharded over a 1-D ``("data",)`` mesh.

Batch-axis arrays (tokens (B, T), labels (B,), lengths (B,), carry (B, H)) go to ``place.data``, the rest (params,
optimizer state, the dropout key) to ``place.replicated``; jit compiles for those shardings and XLA's SPMD
partitioner splits the batch and inserts the all-reduces itself: no pmap, no hand-written psum. Results equal one
device's up to the order of float sums: the dropout key is ``fold_in(key(seed), step)``, and JAX's random bits
depend on the key and the global shape, not the sharding, so every row gets the same mask.

Several hosts: :func:`initialize_from_environment` joins them first, then the mesh spans all their devices. Each
process places only its own rows of the same global batch (:func:`put`); only process 0 writes files.
"""
import os
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
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
    """``--devices`` on ``device``'s platform: 0 means every device JAX sees there (every host's, once initialised),
    N the first N. ``--batch-size`` must split evenly over them; a :class:`ConfigError` says what to change."""
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
    if jax.process_count() > 1 and (cfg.checkpoint_every or cfg.resume):
        raise ConfigError("--checkpoint-every/--resume are not supported across several hosts yet; "
                          "use --save-dir (written by process 0)")
    if count == 1:
        return Placement(data=device, replicated=device, devices=1)
    mesh = Mesh(np.array(available[:count]), ("data",))  # Auto axis: shardings propagate through jit
    return Placement(NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec()), count, mesh)


def put(value: np.ndarray, where: Where | None) -> jax.Array:
    """``jax.device_put``; across hosts each process builds its own shards (skipping device_put's all-gather check)."""
    if isinstance(where, jax.sharding.Sharding) and not where.is_fully_addressable:
        return jax.make_array_from_callback(value.shape, where, lambda index: value[index])
    return jax.device_put(value, where)


def put_key(key: jax.Array, where: Where) -> jax.Array:
    """``jax.device_put`` of a PRNG key via its uint32 data (a key array cannot go onto other hosts' devices)."""
    data = jax.device_put(np.asarray(jax.random.key_data(key)), where)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))


def is_main_process() -> bool:
    """True on the process that logs and writes files (always, on one host)."""
    return jax.process_index() == 0


def from_main_process(read: Callable[[], Any], like: Any) -> Any:
    """``read()`` on process 0 (a file only it wrote), broadcast as numpy; ``like``: a pytree shaped like the result."""
    if jax.process_count() == 1:
        return read()
    value = read() if is_main_process() else jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype), like)
    return jax.tree_util.tree_map(np.asarray, multihost_utils.broadcast_one_to_all(value))


def initialize_from_environment() -> bool:
    """``jax.distributed.initialize`` if ``JAX_COORDINATOR_ADDRESS`` (process 0's host:port) is set, before any
    device is touched (``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``, else JAX's detection); returns whether it did."""
    if not os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return False
    parsed = {}
    for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        value = os.environ.get(name)
        try:
            parsed[name] = int(value) if value else None
        except ValueError:
            raise ConfigError(f"{name}={value!r}: expected an integer") from None
    jax.distributed.initialize(num_processes=parsed["JAX_NUM_PROCESSES"], process_id=parsed["JAX_PROCESS_ID"])
    return True

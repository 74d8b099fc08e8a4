"""Data parallelism in JAX: the same jitted ``train_step``, its batch axis sharded over a device mesh.

    place = placement(cfg, device)    # --devices N: a 1-D mesh ("data",) of N devices (one device: no mesh)
    place.data        NamedSharding(mesh, P("data"))   tokens (B, T), labels (B,), lengths (B,), carry (B, H)
    place.replicated  NamedSharding(mesh, P())         params, optimizer state, step, the dropout key

Nothing else changes. ``jax_impl.train.make_train_step`` is jitted without any sharding annotation; called
with arrays placed as above, jit compiles it for those shardings and XLA's SPMD partitioner splits every
computation along the batch axis and inserts the all-reduces itself (of the gradients and of the batch's
mean loss). No pmap, no hand-written psum: one global-view program, whatever the device count.

Results equal one device's, up to the order of floating-point sums: the dropout key of a step is
``fold_in(key(seed), step)``, a function of the step alone, and JAX's random bits are a function of the
key and the *global* shape, not of how the output is split over devices (``jax_threefry_partitionable``),
so every row gets the same mask on 2 devices as on 1.

Several hosts: every host runs the same command; :func:`initialize_from_environment` joins them into one
JAX system (``jax.distributed.initialize``) before anything touches a device, after which ``jax.devices()``
lists every host's devices and the mesh spans them all. Every process reads the same global batch (same
seed, same order) and places only its own devices' rows (:func:`put`); only process 0 prints and writes
files, and what it reads back from disk reaches the others by broadcast (:func:`from_main_process`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from common.config import Config
from common.errors import ConfigError

DATA_AXIS = "data"
Where = jax.Device | jax.sharding.Sharding  # what jax.device_put places onto: one device, or a sharding


@dataclass(frozen=True)
class Placement:
    """Where the training loop puts arrays: ``data`` for those with a leading batch axis (batches, the
    carry), ``replicated`` for the rest. On one device both are that device, and the loop is the
    single-device program it always was."""

    data: Where
    replicated: Where
    devices: int
    mesh: Mesh | None = None

    def describe(self) -> str:
        """``cpu:0`` for one device, ``2x cpu (data-parallel)`` for a mesh."""
        if self.mesh is None:
            return str(self.data)
        return f"{self.devices}x {self.mesh.devices.flat[0].platform} (data-parallel)"


def data_mesh(devices: list[jax.Device]) -> Mesh:
    """A 1-D mesh with one axis, ``"data"``, over ``devices`` (Auto axis: shardings propagate through jit)."""
    return Mesh(np.array(devices), (DATA_AXIS,))


def over_mesh(mesh: Mesh) -> Placement:
    return Placement(data=NamedSharding(mesh, PartitionSpec(DATA_AXIS)),
                     replicated=NamedSharding(mesh, PartitionSpec()), devices=mesh.size, mesh=mesh)


def placement(cfg: Config, device: jax.Device) -> Placement:
    """``--devices`` on ``device``'s platform: 0 means every device JAX sees there (all local devices; all
    hosts' after :func:`initialize_from_environment`), N the first N. The global batch is split evenly, so
    ``--batch-size`` must be a multiple of the count; a :class:`ConfigError` says what to change."""
    available = jax.devices(device.platform)
    count = cfg.devices or len(available)
    if count > len(available):
        hint = (" (for simulated CPU devices, set XLA_FLAGS=--xla_force_host_platform_device_count="
                f"{count} before starting Python)") if device.platform == "cpu" else ""
        raise ConfigError(f"--devices {count}: JAX sees only {len(available)} {device.platform} "
                          f"device(s){hint}")
    if cfg.batch_size % count:
        raise ConfigError(f"--batch-size {cfg.batch_size} does not split evenly over {count} devices: pass a "
                          f"--batch-size that is a multiple of {count}, or a --devices count that divides "
                          f"{cfg.batch_size}")
    if jax.process_count() > 1 and (cfg.checkpoint_every or cfg.resume):
        raise ConfigError("--checkpoint-every/--resume are not supported across several hosts yet; "
                          "use --save-dir (written by process 0)")
    if count == 1:
        return Placement(data=device, replicated=device, devices=1)
    return over_mesh(data_mesh(available[:count]))


def put(value: np.ndarray, where: Where | None) -> jax.Array:
    """``jax.device_put`` of a host array; onto devices of several hosts, each process builds only its own
    devices' shards from its (identical) copy, instead of device_put's check that all copies are equal
    (an all-gather of the whole array, every step)."""
    if isinstance(where, jax.sharding.Sharding) and not where.is_fully_addressable:
        return jax.make_array_from_callback(value.shape, where, lambda index: value[index])
    return jax.device_put(value, where)


def put_key(key: jax.Array, where: Where) -> jax.Array:
    """``jax.device_put`` for a PRNG key, through its raw uint32 data: a key array made on this process's
    default device cannot be placed onto other hosts' devices, host numpy data can. Same key, same values."""
    data = jax.device_put(np.asarray(jax.random.key_data(key)), where)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))


def is_main_process() -> bool:
    """True on the process that logs and writes files (always, on one host)."""
    return jax.process_index() == 0


def from_main_process(read: Callable[[], Any], like: Any) -> Any:
    """``read()`` on process 0, handed to every process as numpy arrays (it reads a file only process 0
    wrote, maybe on a disk only it sees); on one host simply ``read()``. ``like``: a pytree shaped like the
    result (the other processes' placeholder)."""
    if jax.process_count() == 1:
        return read()
    value = read() if is_main_process() else jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype), like)
    return jax.tree_util.tree_map(np.asarray, multihost_utils.broadcast_one_to_all(value))


def initialize_from_environment() -> bool:
    """Join a multi-host run when the environment asks for one: ``JAX_COORDINATOR_ADDRESS`` (host:port of
    process 0) set, with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (or left to JAX's own detection
    under Slurm, Open MPI or on Cloud TPU). Must run before anything touches a device. Returns whether it
    initialised."""
    if not os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return False

    def env_int(name: str) -> int | None:
        value = os.environ.get(name)
        try:
            return int(value) if value else None
        except ValueError:
            raise ConfigError(f"{name}={value!r}: expected an integer") from None

    jax.distributed.initialize(num_processes=env_int("JAX_NUM_PROCESSES"), process_id=env_int("JAX_PROCESS_ID"))
    return True

"""Train the sentiment LSTM with JAX/Flax: ``python -m jax_impl.train [--lstm-impl auto|kernel|fused|scan|...] ...``.

The loop is ``common.loop.train``, the same program as ``torch_impl.train`` (flags, data order, carry modes,
log line, metrics JSONL, neutral and training checkpoints). :class:`JaxTwin` is the JAX side of it, a few
lines over the pure, jitted steps of :mod:`jax_impl.step`, where the seed's ``h.detach()`` is
``jax.lax.stop_gradient(carry)``. ``--devices N`` runs the same jitted steps data-parallel over N devices:
only where arrays are placed changes (:mod:`jax_impl.distributed`).
"""
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from common import interrupts

interrupts.exit_on_ctrl_c(__name__)  # first: Ctrl-C while the imports below load is one line and exit 130

import jax  # noqa: E402

from common import loop  # noqa: E402
from common.config import Config, parse_config  # noqa: E402
from common.errors import ConfigError, cli_main  # noqa: E402
from common.params import Params  # noqa: E402
from common.precision import BFLOAT16_RULES  # noqa: E402
from common.runstate import Progress  # noqa: E402
from jax_impl import kernel, onednn, rng_lowering, xla_env  # noqa: E402
from jax_impl.convert import from_flax, to_flax  # noqa: E402
from jax_impl.distributed import placement  # noqa: E402
from jax_impl.model import auto_lstm_impl, model_from_config, resolve_lstm_impl  # noqa: E402
from jax_impl.numerics import param_dtype_for  # noqa: E402
from jax_impl.state import load_training_state, save_training_state  # noqa: E402
from jax_impl.step import (TrainState, batch_to_device, create_train_state, make_eval_step,  # noqa: E402
                           make_train_step, padded_eval_batch, resolve_device, resolve_dtype)

PROG = "python -m jax_impl.train"


class JaxTwin:
    """The JAX twin for ``common.loop``: state is a :class:`jax_impl.step.TrainState`, the carry a tuple of L
    ``(h, c)`` pairs, both placed on the run's device (or split over its mesh along the batch axis)."""

    def __init__(self, cfg: Config, vocab_size: int, device: jax.Device):
        if cfg.torch_compile:
            raise ConfigError("--torch-compile is PyTorch's: JAX's steps are always jit-compiled")
        if not cfg.flush_denormal and device.platform == "cpu":
            raise ConfigError("--no-flush-denormal is PyTorch's: XLA always flushes denormals to zero on the CPU")
        self.place = placement(cfg, device)  # on one device both placements are `device` itself
        self.cfg, self.model = cfg, model_from_config(cfg, vocab_size, device.platform, self.place.devices)
        self.is_main = True  # one process drives every device
        self.key = jax.device_put(jax.random.key(cfg.seed), self.place.replicated)  # dropout: fold_in(key, step)
        unrolled = rng_lowering.unroll_threefry_on_cpu()  # before the steps are lowered: the same bits, faster
        self.step, self.evaluate = make_train_step(self.model, cfg), make_eval_step(self.model, cfg)
        self.record = {"framework": "jax", "jax": jax.__version__, "device": self.place.describe(),
                       "devices": self.place.devices, "dtype": cfg.dtype, "lstm_impl": self.model.lstm_impl,
                       "flush_denormal": device.platform == "cpu", "allow_tf32": cfg.allow_tf32,
                       "matmul_precision": self.model.precision.name.lower(), **xla_env.record()}
        if cfg.lstm_impl == "auto":  # which implementation the default ran, and why that one
            self.record["lstm_impl_auto"] = auto_lstm_impl(cfg.dtype, device.platform, self.place.devices)[1]
        if device.platform == "cpu":
            self.record["threefry_lowering"] = "unrolled" if unrolled else "rolled (JAX's default on the CPU)"
        if self.model.lstm_impl == "onednn":  # the vendor kernel's version, threads and measured float rule
            self.record.update(onednn.describe())
        if self.model.lstm_impl == "kernel":  # its GEMM, threads and gate math
            self.record.update(kernel.describe(cfg.hidden_dim))
        if cfg.dtype == "bfloat16":  # what the model computes in bfloat16 (scan: PyTorch's autocast, flax: Flax's)
            rules = "flax" if self.model.lstm_impl == "flax" else "native" if cfg.padding == "right" else "onednn"
            self.record["bfloat16"] = BFLOAT16_RULES[rules]

    def init_state(self, params: Params) -> TrainState:
        return create_train_state(self.model, self.cfg, params, self.place.replicated)

    def init_carry(self) -> Any:
        return jax.device_put(self.model.zero_carry(self.cfg.batch_size), self.place.data)  # committed, as the state is

    def train_step(self, state: TrainState, carry: Any, batch) -> tuple[TrainState, Any, float]:
        state, carry, metrics = self.step(state, carry, batch_to_device(batch, self.place.data), self.key)
        loss, finite = jax.device_get((metrics.loss, metrics.finite))  # the step's one host sync
        return state, carry, float(loss) if finite else math.nan

    def eval_step(self, state: TrainState, batch) -> tuple[jax.Array, jax.Array]:
        return self.evaluate(state.params, padded_eval_batch(batch, self.cfg.batch_size, self.place.data))

    def sum_over_processes(self, loss_sum: float, correct: int) -> tuple[float, int]:
        return loss_sum, correct  # the sharded arrays' sums are already global

    def export_params(self, state: TrainState) -> Params:
        return from_flax(state.params)

    def import_params(self, state: TrainState, read: Callable[[], Params]) -> TrainState:
        params = to_flax(read(), dtype=param_dtype_for(self.model.dtype))
        return state.replace(params=jax.device_put(params, self.place.replicated))

    def save_state(self, root: Path, progress: Progress, state: TrainState, carry: Any, keep: int) -> None:
        save_training_state(root, progress, state, carry, keep)

    def restore_state(self, path: Path, state: TrainState, carry: Any) -> tuple[Progress, tuple[TrainState, Any]]:
        return load_training_state(path, state, carry)


@contextmanager
def twin_maker(cfg: Config) -> Iterator[Callable[[Config, int], JaxTwin]]:
    """How :func:`train` builds its twin: on the run's device, made JAX's default while the context is open. The
    benchmark's workers build theirs through it too."""
    resolve_dtype(cfg.dtype)
    device = resolve_device(cfg.device)
    resolve_lstm_impl(cfg.lstm_impl, cfg.dtype, device.platform, cfg.padding)  # fails before the data is read
    with jax.default_device(device):
        yield lambda cfg, vocab_size: JaxTwin(cfg, vocab_size, device)


def train(cfg: Config) -> dict[str, Any]:
    """The full run (see ``common.loop.train`` for the result's keys)."""
    with twin_maker(cfg) as make_twin:
        return loop.train(cfg, make_twin)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv, PROG, "Train the LSTM sentiment classifier with JAX/Flax.")
    xla_env.configure()  # XLA_FLAGS: read once, when the first backend starts
    train(cfg)
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())

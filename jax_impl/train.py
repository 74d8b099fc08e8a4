"""Train the sentiment LSTM with JAX/Flax: ``python -m jax_impl.train [--lstm-impl auto|kernel|fused|scan|...] ...``,
the same written in Flax NNX: ``python -m jax_impl.train --flax-api nnx``, or the word-level language model:
``python -m jax_impl.train --workload lm [--cell gru] [--lstm-impl scan|flax]``.

The loop is ``common.loop.train``, the same program as ``torch_impl.train`` (flags, data order, carry modes,
log line, metrics JSONL, neutral and training checkpoints). :class:`JaxTwin` is the JAX side of it, a few
lines over the pure, jitted steps of :mod:`jax_impl.step` (the language model's: :mod:`jax_impl.lm_step`), where
the seed's ``h.detach()`` is ``jax.lax.stop_gradient(carry)``. ``--devices N`` runs the same jitted steps data-parallel
over N devices: only where arrays are placed changes (:mod:`jax_impl.distributed`).
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
from jax_impl import lm_model, nnx_model, nnx_step, rng_lowering, xla_env  # noqa: E402
from jax_impl.recurrences import choice, kernel, onednn  # noqa: E402
from jax_impl.convert import from_flax, from_nnx, to_flax, to_nnx  # noqa: E402
from jax_impl.lm_step import make_lm_eval_step, make_lm_train_step, window_to_device  # noqa: E402
from jax_impl.distributed import placement  # noqa: E402
from jax_impl.model import model_from_config  # noqa: E402
from jax_impl.numerics import param_dtype_for  # noqa: E402
from jax_impl.optim import set_lr  # noqa: E402
from jax_impl.state import load_training_state, save_training_state  # noqa: E402
from jax_impl.step import (TrainState, batch_to_device, create_train_state, make_eval_step,  # noqa: E402
                           make_train_step, padded_eval_batch, resolve_device, resolve_dtype)

PROG = "python -m jax_impl.train"


class JaxTwin:
    """The JAX twin for ``common.loop``, either workload: state is a :class:`jax_impl.step.TrainState`, the carry a
    tuple of L per-layer carries (``(h, c)`` pairs; the GRU's ``h``), both placed on the run's device (or, the
    classifier's, split over its mesh along the batch axis)."""

    def __init__(self, cfg: Config, vocab_size: int, device: jax.Device):
        if cfg.torch_compile:
            raise ConfigError("--torch-compile is PyTorch's: JAX's steps are always jit-compiled")
        if not cfg.flush_denormal and device.platform == "cpu":
            raise ConfigError("--no-flush-denormal is PyTorch's: XLA always flushes denormals to zero on the CPU")
        self.lm = cfg.workload == "lm"
        if self.lm and cfg.devices > 1:
            raise ConfigError("the language model trains on one device: data parallelism (--devices) is the "
                              "classifier's")
        self.place = placement(cfg.replace(devices=1) if self.lm else cfg, device)  # on one device: `device` itself
        self.cfg, self.is_main = cfg, True  # one process drives every device
        self.key = jax.device_put(jax.random.key(cfg.seed), self.place.replicated)  # dropout: fold_in(key, step)
        unrolled = rng_lowering.unroll_threefry_on_cpu()  # before the steps are lowered: the same bits, faster
        impl = self.build(cfg, vocab_size, device)
        self.record = {"framework": "jax", "jax": jax.__version__, "device": self.place.describe(),
                       "devices": self.place.devices, "dtype": cfg.dtype, "lstm_impl": impl,
                       "flush_denormal": device.platform == "cpu", "allow_tf32": cfg.allow_tf32,
                       "matmul_precision": self.model.precision.name.lower(), **xla_env.record()}
        if cfg.lstm_impl == "auto":  # which implementation the default ran, and why that one
            self.record["lstm_impl_auto"] = choice.auto(choice.Run.of(cfg, device.platform, self.place.devices))[1]
        if device.platform == "cpu":
            self.record["threefry_lowering"] = "unrolled" if unrolled else "rolled (JAX's default on the CPU)"
        if impl == "onednn":  # the vendor kernel's version, threads and measured float rule
            self.record.update(onednn.describe())
        if impl == "kernel":  # its GEMM, threads and gate math
            self.record.update(kernel.describe(cfg.hidden_dim))
        if cfg.dtype == "bfloat16":  # what the model computes in bfloat16 (scan: PyTorch's autocast, flax: Flax's)
            rules = "flax" if impl == "flax" else "native" if cfg.padding == "right" else "onednn"
            self.record["bfloat16"] = BFLOAT16_RULES[rules]

    def build(self, cfg: Config, vocab_size: int, device: jax.Device) -> str:
        """The model, its jitted steps (``step``, ``evaluate``) and its neutral ⇄ Flax conversions; returns the LSTM
        implementation that runs."""
        if self.lm:
            self.model = lm_model.lm_model_from_config(cfg, vocab_size)
            self.step, self.evaluate = make_lm_train_step(self.model, cfg), make_lm_eval_step(self.model)
            self.to_flax, self.from_flax = lm_model.to_flax, lm_model.from_flax
            return self.model.impl
        self.model = model_from_config(cfg, vocab_size, device.platform, self.place.devices)
        self.step, self.evaluate = make_train_step(self.model, cfg), make_eval_step(self.model, cfg)
        self.to_flax, self.from_flax = to_flax, from_flax
        return self.model.lstm_impl

    def init_state(self, params: Params) -> TrainState:
        return create_train_state(self.model, self.cfg, params, self.place.replicated, self.to_flax)

    def init_carry(self, batch_size: int | None = None) -> Any:
        zeros = self.model.zero_carry(batch_size or self.cfg.batch_size)
        return jax.device_put(zeros, self.place.data)  # committed, as the state is

    def train_step(self, state: TrainState, carry: Any, batch) -> tuple[TrainState, Any, float]:
        on_device = window_to_device(batch, self.place.data) if self.lm else batch_to_device(batch, self.place.data)
        state, carry, metrics = self.step(state, carry, on_device, self.key)
        loss, finite = jax.device_get((metrics.loss, metrics.finite))  # the step's one host sync
        return state, carry, float(loss) if finite else math.nan

    def eval_step(self, state: TrainState, carry: Any, batch) -> tuple[Any, tuple[jax.Array, Any]]:
        if self.lm:
            carry, loss_sum = self.evaluate(state.params, carry, window_to_device(batch, self.place.data))
            return carry, (loss_sum, batch.targets.size)
        return carry, self.evaluate(state.params, padded_eval_batch(batch, self.cfg.batch_size, self.place.data))

    def sum_over_processes(self, loss_sum: float, second: float) -> tuple[float, float]:
        return loss_sum, second  # the sharded arrays' sums are already global

    def set_lr(self, state: TrainState, lr: float) -> TrainState:
        return state.replace(opt_state=set_lr(state.opt_state, lr))

    def export_params(self, state: TrainState) -> Params:
        return self.from_flax(state.params)

    def import_params(self, state: TrainState, read: Callable[[], Params]) -> TrainState:
        params = self.to_flax(read(), dtype=param_dtype_for(self.model.dtype))
        return state.replace(params=jax.device_put(params, self.place.replicated))

    def save_state(self, root: Path, progress: Progress, state: TrainState, carry: Any, keep: int) -> None:
        save_training_state(root, progress, state, carry, keep)

    def restore_state(self, path: Path, state: TrainState, carry: Any) -> tuple[Progress, tuple[TrainState, Any]]:
        return load_training_state(path, state, carry)


class NnxTwin(JaxTwin):
    """The JAX twin written in Flax NNX (``--flax-api nnx``, the classifier): the model of :mod:`jax_impl.nnx_model`
    and the ``nnx.jit`` steps of :mod:`jax_impl.nnx_step`; its state a :class:`jax_impl.nnx_step.TrainState` (the
    model and its ``nnx.Optimizer``, updated in place), everything else the linen twin's."""

    def __init__(self, cfg: Config, vocab_size: int, device: jax.Device):
        super().__init__(cfg, vocab_size, device)
        self.record["flax_api"] = "nnx"
        self.record.pop("lstm_impl_auto", None)  # under NNX, auto has one choice: nothing to explain

    def build(self, cfg: Config, vocab_size: int, device: jax.Device) -> str:
        """Flax NNX's model and its ``nnx.jit`` steps; the implementation that runs is Flax's stock cell."""
        impl = choice.resolve(cfg.lstm_impl, choice.Run.of(cfg, device.platform, self.place.devices))
        self.model = nnx_model.model_from_config(cfg, vocab_size)  # copied, with the run's weights, by init_state
        self.step, self.evaluate = nnx_step.make_train_step(cfg), nnx_step.make_eval_step(cfg)
        self.to_flax, self.from_flax = to_nnx, from_nnx
        return impl

    def init_state(self, params: Params) -> nnx_step.TrainState:
        return nnx_step.create_train_state(self.model, self.cfg, params, self.place.replicated)

    def train_step(self, state: nnx_step.TrainState, carry: Any, batch) -> tuple[nnx_step.TrainState, Any, float]:
        carry, metrics = self.step(state.model, state.optimizer, carry, batch_to_device(batch, self.place.data),
                                   self.key)
        loss, finite = jax.device_get((metrics.loss, metrics.finite))  # the step's one host sync
        return state, carry, float(loss) if finite else math.nan

    def eval_step(self, state: nnx_step.TrainState, carry: Any, batch) -> tuple[Any, tuple[jax.Array, Any]]:
        return carry, self.evaluate(state.model, padded_eval_batch(batch, self.cfg.batch_size, self.place.data))


@contextmanager
def twin_maker(cfg: Config) -> Iterator[Callable[[Config, int], JaxTwin]]:
    """How :func:`train` builds its twin (``--flax-api``: linen's :class:`JaxTwin`, or :class:`NnxTwin`): on the run's
    device, made JAX's default while the context is open. The benchmark's workers build theirs through it too."""
    resolve_dtype(cfg.dtype)
    device = resolve_device(cfg.device)
    devices = 1 if cfg.workload == "lm" else placement(cfg, device).devices  # the language model: one (JaxTwin)
    choice.resolve(cfg.lstm_impl, choice.Run.of(cfg, device.platform, devices))  # fails before the data is read
    twin = NnxTwin if cfg.flax_api == "nnx" else JaxTwin
    with jax.default_device(device):
        yield lambda cfg, vocab_size: twin(cfg, vocab_size, device)


def train(cfg: Config) -> dict[str, Any]:
    """The full run (see ``common.loop.train`` for the result's keys)."""
    with twin_maker(cfg) as make_twin:
        return loop.train(cfg, make_twin)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv, PROG, "Train the LSTM sentiment classifier or the word-level language model with "
                       "JAX/Flax.")
    xla_env.configure()  # XLA_FLAGS: read once, when the first backend starts
    train(cfg)
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())

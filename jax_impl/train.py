"""Train the sentiment LSTM with JAX/Flax: ``python -m jax_impl.train [--lstm-impl auto|kernel|fused|scan|...] ...``,
the same written in Flax NNX: ``python -m jax_impl.train --flax-api nnx``, or the word-level language model:
``python -m jax_impl.train --workload lm [--cell gru] [--lstm-impl scan|flax]``.

The loop is ``common.loop.train``, the same program as ``torch_impl.train`` (flags, data order, carry modes,
log line, metrics JSONL, neutral and training checkpoints). :class:`JaxTwin` is the JAX side of it, a few
lines over the jitted step of :mod:`jax_impl.step` and what the workload supplies (:mod:`jax_impl.classifier`,
:mod:`jax_impl.lm`: model, loss, evaluation, converters), where the seed's ``h.detach()`` is
``jax.lax.stop_gradient(carry)``. ``--devices N`` runs the same jitted steps data-parallel
over N devices: only where arrays are placed changes (:mod:`jax_impl.distributed`).
"""
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import jax
from flax import nnx

from common import interrupts, loop
from common.config import Config, parse_config
from common.errors import ConfigError, cli_main
from common.params import Params
from common.precision import BFLOAT16_RULES
from common.runstate import Progress
from jax_impl import classifier, lm, nnx_model, nnx_step, threefry, xla_env
from jax_impl.recurrences import choice
from jax_impl.convert import from_nnx, to_nnx
from jax_impl.numerics import param_dtype_for
from jax_impl.optim import set_lr
from jax_impl.state import load_training_state, save_training_state
from jax_impl.step import (StepMetrics, TrainState, create_train_state, make_train_step, make_update,
                           resolve_device, resolve_dtype)

PROG = "python -m jax_impl.train"


WORKLOADS = {"classifier": classifier, "lm": lm}  # each workload's JAX side: the twin reads one, once


def host_loss(metrics: StepMetrics) -> float:
    """A step's loss as a float, NaN when the loss or the gradient was not finite: the step's one host sync."""
    loss, finite = jax.device_get((metrics.loss, metrics.finite))
    return float(loss) if finite else math.nan


class JaxTwin:
    """The JAX twin for ``common.loop``, either workload (:data:`WORKLOADS`: its model, loss, evaluation, converters
    and placement): state is a :class:`jax_impl.step.TrainState`, the carry a tuple of L per-layer carries (``(h, c)``
    pairs; the GRU's ``h``), both placed on the run's device (or, the classifier's, split over its mesh along the batch
    axis). For the bench, :meth:`lower` and :meth:`train_step_parts`."""

    def __init__(self, cfg: Config, vocab_size: int, device: jax.Device):
        if cfg.torch_compile:
            raise ConfigError("--torch-compile is PyTorch's: JAX's steps are always jit-compiled")
        if not cfg.flush_denormal and device.platform == "cpu":
            raise ConfigError("--no-flush-denormal is PyTorch's: XLA always flushes denormals to zero on the CPU")
        self.workload = WORKLOADS[cfg.workload]
        self.place = self.workload.placement(cfg, device)  # on one device: `device` itself
        self.cfg, self.is_main, self.parts = cfg, True, None  # one process drives every device
        # dropout: fold_in(key, step); JAX's threefry bits, its rounds written out on the CPU (faster there)
        self.key = jax.device_put(threefry.key(cfg.seed, device.platform), self.place.replicated)
        run = choice.Run.of(cfg, device.platform, self.place.devices)
        impl = choice.resolve(cfg.lstm_impl, run)
        self.build(cfg, vocab_size, device)
        self.record = {"framework": "jax", "jax": jax.__version__, "device": self.place.describe(),
                       "devices": self.place.devices, "dtype": cfg.dtype, "lstm_impl": impl,
                       "flush_denormal": device.platform == "cpu", "allow_tf32": cfg.allow_tf32,
                       "matmul_precision": self.model.precision.name.lower(), **xla_env.record()}
        if cfg.lstm_impl == "auto":  # which implementation the default ran, and why that one
            self.record["lstm_impl_auto"] = choice.auto(run)[1]
        if threefry.unrolled(device.platform):
            self.record["threefry_lowering"] = "unrolled"
        describe = choice.REGISTRY[impl].describe  # a native one's library: its version, GEMM, threads, float rules
        if describe is not None:
            self.record.update(describe(cfg.hidden_dim))
        if cfg.dtype == "bfloat16":  # what the model computes in bfloat16 (scan: PyTorch's autocast, flax: Flax's)
            rules = "flax" if impl == "flax" else "native" if cfg.padding == "right" else "onednn"
            self.record["bfloat16"] = BFLOAT16_RULES[rules]

    def build(self, cfg: Config, vocab_size: int, device: jax.Device) -> None:
        """The workload's model, its jitted steps (``step``, ``evaluate``) and its neutral ⇄ Flax conversions."""
        self.model = self.workload.model_from_config(cfg, vocab_size, device.platform, self.place.devices)
        self.step = make_train_step(self.workload.make_loss_fn(self.model, cfg), cfg)
        self.evaluate = self.workload.make_eval_step(self.model, cfg)
        self.to_flax, self.from_flax = self.workload.to_flax, self.workload.from_flax

    def init_state(self, params: Params) -> TrainState:
        return create_train_state(self.model, self.cfg, params, self.place.replicated, self.to_flax)

    def init_carry(self, batch_size: int | None = None) -> Any:
        zeros = self.model.zero_carry(batch_size or self.cfg.batch_size)
        return jax.device_put(zeros, self.place.data)  # committed, as the state is

    def train_step(self, state: TrainState, carry: Any, batch) -> tuple[TrainState, Any, float]:
        state, carry, metrics = self.step(state, carry, self.workload.to_device(batch, self.place.data), self.key)
        return state, carry, host_loss(metrics)

    def eval_step(self, state: TrainState, carry: Any, batch) -> tuple[Any, tuple[jax.Array, Any]]:
        return self.workload.evaluate(self.evaluate, state.params, carry, batch, self.cfg, self.place.data)

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

    def lower(self, kind: str, state: TrainState, carry: Any, batch) -> jax.stages.Lowered:
        """The jitted ``kind`` step ("train" or "eval") lowered for ``batch``'s shapes, with the arguments
        :meth:`train_step` and :meth:`eval_step` give it: to compile it ahead of its first call and read its HLO."""
        if kind == "train":
            return self.step.lower(state, carry, self.workload.to_device(batch, self.place.data), self.key)
        return self.evaluate.lower(state.params, *self.workload.eval_inputs(carry, batch, self.cfg, self.place.data))

    def train_step_parts(self, state: Any, carry: Any, batch, clock) -> tuple[Any, Any, float, dict[str, float]]:
        """:meth:`train_step` as three jitted functions (:meth:`part_functions`), each waited for by ``clock.lap``:
        ``forward`` (the loss), ``backward`` (the loss and its gradient, less the forward's time), ``optimizer`` (the
        update), then the workload's own parts (the language model's ``decoder``); ``(state, carry, loss, seconds per
        part)``. XLA fuses the whole step across the parts, so their times add up to a little more than the step's."""
        if self.parts is None:  # compiled in their first call
            self.parts = (*self.part_functions(), self.workload.timed_parts(self.model, self.place.data))
        loss_of, grads_of, update, own_parts = self.parts
        device_batch, key = self.workload.to_device(batch, self.place.data), jax.random.fold_in(self.key, state.step)
        forward = clock.lap(loss_of(state, carry, device_batch, key))
        (loss, new_carry), grads = out = grads_of(state, carry, device_batch, key)
        backward = clock.lap(out) - forward
        state, carry, metrics = out = update(state, grads, loss, carry, new_carry)
        parts = {"forward": forward, "backward": backward, "optimizer": clock.lap(out),
                 **own_parts(state, device_batch, clock)}
        return state, carry, host_loss(metrics), parts

    def part_functions(self) -> tuple[Callable, Callable, Callable]:
        """:meth:`train_step_parts`'s jitted ``loss_of(state, carry, batch, key)``, ``grads_of`` (the same, with the
        gradient) and ``update(state, grads, loss, carry, new_carry) -> (state, carry, metrics)``: the workload's
        ``make_loss_fn`` and :func:`jax_impl.step.make_update`."""
        loss_fn = self.workload.make_loss_fn(self.model, self.cfg)
        loss_of, grads_of = jax.jit(loss_fn), jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
        return (lambda state, *rest: loss_of(state.params, *rest), lambda state, *rest: grads_of(state.params, *rest),
                jax.jit(make_update(self.cfg)))


class NnxTwin(JaxTwin):
    """The JAX twin written in Flax NNX (``--flax-api nnx``, the classifier): the model of :mod:`jax_impl.nnx_model`
    and the ``nnx.jit`` steps of :mod:`jax_impl.nnx_step`; its state a :class:`jax_impl.nnx_step.TrainState` (the
    model and its ``nnx.Optimizer``, updated in place), everything else the linen twin's."""

    def __init__(self, cfg: Config, vocab_size: int, device: jax.Device):
        super().__init__(cfg, vocab_size, device)
        self.record["flax_api"] = "nnx"
        self.record.pop("lstm_impl_auto", None)  # under NNX, auto has one choice: nothing to explain

    def build(self, cfg: Config, vocab_size: int, device: jax.Device) -> None:
        """Flax NNX's model and its ``nnx.jit`` steps (the implementation that runs is Flax's stock cell)."""
        self.model = nnx_model.model_from_config(cfg, vocab_size)  # copied, with the run's weights, by init_state
        self.step, self.evaluate = nnx_step.make_train_step(cfg), nnx_step.make_eval_step(cfg)
        self.to_flax, self.from_flax = to_nnx, from_nnx

    def init_state(self, params: Params) -> nnx_step.TrainState:
        return nnx_step.create_train_state(self.model, self.cfg, params, self.place.replicated)

    def train_step(self, state: nnx_step.TrainState, carry: Any, batch) -> tuple[nnx_step.TrainState, Any, float]:
        carry, metrics = self.step(*self.nnx_args(state, carry, batch))
        return state, carry, host_loss(metrics)

    def eval_step(self, state: nnx_step.TrainState, carry: Any, batch) -> tuple[Any, tuple[jax.Array, Any]]:
        return self.workload.evaluate(self.evaluate, state.model, carry, batch, self.cfg, self.place.data)

    def nnx_args(self, state: nnx_step.TrainState, carry: Any, batch) -> tuple:
        """The ``nnx.jit`` training step's arguments: the model and the optimizer it updates in place, then the
        linen step's."""
        return state.model, state.optimizer, carry, self.workload.to_device(batch, self.place.data), self.key

    def lower(self, kind: str, state: nnx_step.TrainState, carry: Any, batch) -> jax.stages.Lowered:
        """``nnx.jit``'s own ``lower``, on the model and optimizer the steps take."""
        if kind == "train":
            return self.step.lower(*self.nnx_args(state, carry, batch))
        return self.evaluate.lower(state.model, *self.workload.eval_inputs(carry, batch, self.cfg, self.place.data))

    def part_functions(self) -> tuple[Callable, Callable, Callable]:
        """:meth:`JaxTwin.part_functions` as three ``nnx.jit`` functions of :mod:`jax_impl.nnx_step`: the loss and
        ``nnx.value_and_grad``'s gradient of the model, and ``make_update``, which updates the model and the optimizer
        in place (so the state it returns is the one it was given)."""
        loss_fn = nnx_step.make_loss_fn(self.cfg)
        loss_of, grads_of = nnx.jit(loss_fn), nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))
        update_in_place = nnx.jit(nnx_step.make_update(self.cfg))

        def update(state, grads, loss, carry, new_carry):
            return state, *update_in_place(state.model, state.optimizer, grads, loss, carry, new_carry)

        return (lambda state, *rest: loss_of(state.model, *rest), lambda state, *rest: grads_of(state.model, *rest),
                update)


@contextmanager
def twin_maker(cfg: Config) -> Iterator[Callable[[Config, int], JaxTwin]]:
    """How :func:`train` builds its twin (``--flax-api``: linen's :class:`JaxTwin`, or :class:`NnxTwin`): on the run's
    device, made JAX's default while the context is open. The benchmark's workers build theirs through it too."""
    device = resolve_device(cfg.device)
    devices = WORKLOADS[cfg.workload].placement(cfg, device).devices
    choice.resolve(cfg.lstm_impl, choice.Run.of(cfg, device.platform, devices))  # fails before the data is read
    resolve_dtype(cfg.dtype)  # and float64 where JAX's x64 mode is off: main() switches it on
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
    if cfg.dtype == "float64":  # JAX's x64 mode is the process's: set where the program starts, before any array
        jax.config.update("jax_enable_x64", True)
    train(cfg)
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())

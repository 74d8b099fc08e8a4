"""The language model's JAX side, named as :mod:`jax_impl.classifier`'s: placement, model, converters, ``to_device``,
the loss and the evaluation step.

    loss_fn(params, carry, window, dropout_key) -> (mean CE, carry)    # make_loss_fn(model, cfg)
    eval_step(params, carry, window) -> (carry, loss_sum)              # make_eval_step(model, cfg), jitted

``jax.lax.stop_gradient`` on the carry at each window's start is the example's ``repackage_hidden``. The parameter
tree is PyTorch's nested at each name's first dot (``{"encoder": {"weight"}, "rnn": {...}, "decoder": {...}}``).
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from common.config import Config
from common.errors import ConfigError
from common.params import Params
from common.workloads import Window
from jax_impl import distributed
from jax_impl.distributed import Placement, Where
from jax_impl.lm_model import Decoder, LMCarry, RNNModel
from jax_impl.loss import cross_entropy
from jax_impl.numerics import PRECISION, compute_dtype, matmul_precision
from jax_impl.recurrences import choice

DeviceWindow = dict[str, jax.Array]  # "inputs" (t, B) int32, "targets" (t, B) int32


def placement(cfg: Config, device: jax.Device) -> Placement:
    """One device, ``device`` itself: the language model is not data-parallel (--devices > 1 is refused)."""
    if cfg.devices > 1:
        raise ConfigError("the language model trains on one device: data parallelism (--devices) is the classifier's")
    return distributed.placement(cfg.replace(devices=1), device)


def make_lm_model(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str = "lstm",
                  dropout: float = 0.5, tied: bool = False, impl: str = "scan",
                  precision: jax.lax.Precision = PRECISION) -> RNNModel:
    """The model of these sizes, float32 (its initial parameters: ``to_flax(common.params.init_lm_params(...))``,
    the numbers the PyTorch twin starts from)."""
    return RNNModel(vocab_size, embed_dim, hidden_dim, layers, cell, dropout, tied, impl, jnp.float32, precision)


def model_from_config(cfg: Config, vocab_size: int, platform: str | None = None, devices: int = 1) -> RNNModel:
    """The language model ``cfg`` describes (``--cell``, ``--tied``, sizes, ``--dropout``, ``--lstm-impl`` resolved
    for ``platform``), computing in ``--dtype``, its matmuls at the precision ``--allow-tf32`` asks for."""
    impl = choice.resolve(cfg.lstm_impl, choice.Run.of(cfg, platform, devices))
    return RNNModel(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.cell, cfg.dropout, cfg.tied, impl,
                    compute_dtype(cfg.dtype), matmul_precision(cfg.allow_tf32))


def to_flax(neutral: Params, dtype: Any = None) -> dict:
    """Neutral name → array to the Flax params tree: each name nested at its first dot, the arrays as they are (or in
    ``dtype``)."""
    tree: dict = {}
    for name, value in neutral.items():
        module, leaf = name.split(".", 1)
        tree.setdefault(module, {})[leaf] = np.asarray(value, dtype)
    return tree


def from_flax(tree: Any, dtype: Any = np.float32) -> Params:
    """A Flax-layout pytree (parameters or their gradients, numpy or jax arrays) to neutral numpy arrays in ``dtype``
    (default float32, the checkpoint's), in ``common.params.lm_param_shapes``'s order."""
    tree = jax.device_get(tree)
    layers = sum(1 for leaf in tree["rnn"] if leaf.startswith("weight_ih_l"))
    names = [("encoder", "weight")]
    names += [("rnn", f"{name}_l{k}") for k in range(layers)
              for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    names += [("decoder", leaf) for leaf in ("weight", "bias") if leaf in tree["decoder"]]
    return {f"{module}.{leaf}": np.array(tree[module][leaf], dtype) for module, leaf in names}


def to_device(window: Window, device: Where | None = None) -> DeviceWindow:
    """A numpy :class:`common.workloads.Window` on ``device`` (default: JAX's default device)."""
    return {"inputs": jax.device_put(np.asarray(window.inputs, np.int32), device),
            "targets": jax.device_put(np.asarray(window.targets, np.int32), device)}


def eval_inputs(carry: LMCarry, window: Window, cfg: Config, device: Where | None = None
                ) -> tuple[LMCarry, DeviceWindow]:
    """The arguments of the jitted ``eval_step`` after the params: the carry, which goes on from window to window, and
    the window."""
    return carry, to_device(window, device)


def evaluate(eval_step: Callable, params: Any, carry: LMCarry, window: Window, cfg: Config,
             device: Where | None = None) -> tuple[LMCarry, tuple[jax.Array, int]]:
    """The twin's ``eval_step`` over the jitted one: ``(carry after the window, (cross-entropy sum, its t·B
    tokens))``."""
    carry, loss_sum = eval_step(params, *eval_inputs(carry, window, cfg, device))
    return carry, (loss_sum, window.targets.size)


def make_loss_fn(model: RNNModel, cfg: Config) -> Callable[[Any, LMCarry, DeviceWindow, jax.Array],
                                                           tuple[jax.Array, LMCarry]]:
    """``loss_fn(params, carry, window, dropout_key) -> (mean cross-entropy per token, new carry)``, training mode."""
    def loss_fn(params: Any, carry: LMCarry, window: DeviceWindow, dropout_key: jax.Array
                ) -> tuple[jax.Array, LMCarry]:
        if cfg.detach:
            carry = jax.lax.stop_gradient(carry)  # repackage_hidden
        logits, new_carry = model.apply({"params": params}, window["inputs"], carry, train=True,
                                        rngs={"dropout": dropout_key})
        return cross_entropy(logits, window["targets"]), new_carry

    return loss_fn


def make_eval_step(model: RNNModel, cfg: Config) -> Callable[[Any, LMCarry, DeviceWindow], tuple[LMCarry, jax.Array]]:
    """The jitted ``eval_step(params, carry, window) -> (carry, sum of the cross-entropy over the window's t·B
    tokens)``, dropout off."""
    def eval_step(params: Any, carry: LMCarry, window: DeviceWindow) -> tuple[LMCarry, jax.Array]:
        logits, carry = model.apply({"params": params}, window["inputs"], carry, train=False)
        return carry, cross_entropy(logits, window["targets"], reduction="sum")

    return jax.jit(eval_step)


def timed_parts(model: RNNModel, device: Where) -> Callable[..., dict[str, float]]:
    """The language model's own part of a timed training step, ``decoder(state, window, clock) -> {"decoder": s}``:
    the seconds of its decoder and loss alone, forward and backward, on ``window``'s shapes, one jitted function (the
    model's own ``Decoder`` and :func:`cross_entropy` on a fixed (t, B, H) input in the LSTM's output range,
    differentiated for the decoder's parameters, the encoder's table when tied, and the input)."""
    decoder, made = Decoder(model.vocab_size, model.dtype, model.precision), {}

    def loss(params: dict, x: jax.Array, targets: jax.Array) -> jax.Array:
        tied = params["encoder"]["weight"] if "encoder" in params else None
        return cross_entropy(decoder.apply({"params": params["decoder"]}, x, tied), targets)

    grads_of = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    def decoder_part(state: Any, window: DeviceWindow, clock: Any) -> dict[str, float]:
        params = {k: state.params[k] for k in (("decoder", "encoder") if model.tied else ("decoder",))}
        shape = (*window["targets"].shape, model.hidden_dim)
        if shape not in made:  # the input, and the function compiled for it, untimed
            x = jnp.tanh(jax.random.normal(jax.random.key(0), shape, model.dtype))
            made[shape] = jax.device_put(x, device)
            jax.block_until_ready(grads_of(params, made[shape], window["targets"]))
        clock.lap()
        return {"decoder": clock.lap(grads_of(params, made[shape], window["targets"]))}

    return decoder_part

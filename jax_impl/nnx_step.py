"""The NNX twin's steps, as a Flax NNX user writes them: functions of the model and an ``nnx.Optimizer`` under
``nnx.jit``, which update both in place; the loss, clipping and Adam are the linen twin's (:mod:`jax_impl.loss`,
:mod:`jax_impl.optim`), and so is the randomness: the dropout key of a step is ``fold_in(key(cfg.seed), step)``.

    carry, metrics    = train_step(model, optimizer, carry, batch, key)   # nnx.jit; model and optimizer donated
    loss_sum, correct = eval_step(model, batch)                           # nnx.jit, zero carry

``jax.lax.stop_gradient`` on the carry as in :mod:`jax_impl.classifier`: at the batch boundary (the seed's
``h.detach()``) and, the one that truncates a gradient, at each ``--tbptt`` chunk boundary. :class:`TrainState` is
what the training loop holds: the model and its optimizer, read as pure pytrees where Orbax saves them
(:mod:`jax_impl.state`).
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from common.config import Config
from jax_impl.convert import to_nnx
from jax_impl.distributed import Where
from jax_impl.loss import bce_loss, bce_sums
from jax_impl.nnx_model import SentimentRNN
from jax_impl.numerics import Carry, DeviceBatch, param_dtype_for
from jax_impl.optim import global_norm_torch, make_optimizer
from jax_impl.step import StepMetrics


class TrainState:
    """The NNX model and its ``nnx.Optimizer`` (``wrt=nnx.Param``), which the train step updates in place. For the
    loop, the linen state's fields as pure pytrees: ``params`` (``nnx.to_pure_dict`` of the parameters), ``opt_state``
    (optax's) and ``step`` (steps taken, skipped included); :meth:`replace` returns a new state over copies."""

    def __init__(self, model: SentimentRNN, optimizer: nnx.Optimizer):
        self.model, self.optimizer = model, optimizer

    @property
    def params(self) -> dict:
        return nnx.to_pure_dict(nnx.state(self.model, nnx.Param))

    @property
    def opt_state(self) -> Any:
        return nnx.as_pure(self.optimizer.opt_state)

    @property
    def step(self) -> jax.Array:
        return self.optimizer.step[...]

    def replace(self, params: dict | None = None, opt_state: Any = None, step: Any = None) -> "TrainState":
        """A new state over copies of the model and the optimizer, holding the pure pytrees given (a dict of
        ``params`` may have its layer keys as strings, as Orbax restores them)."""
        model, optimizer = nnx.clone(self.model), nnx.clone(self.optimizer)
        if params is not None:
            state = nnx.state(model, nnx.Param)
            nnx.replace_by_pure_dict(state, params)
            nnx.update(model, state)
        if opt_state is not None:
            nnx.update(optimizer.opt_state, nnx.state(opt_state))
        if step is not None:
            optimizer.step[...] = jnp.asarray(step, optimizer.step[...].dtype)
        return TrainState(model, optimizer)


def create_train_state(model: SentimentRNN, cfg: Config, neutral_params: dict, device: Where | None = None
                       ) -> TrainState:
    """The starting state from neutral parameters: a copy of ``model`` holding them (float32; float64 under --dtype
    float64), a fresh optimizer (:func:`jax_impl.optim.make_optimizer`), step 0; every array committed to ``device``."""
    model = nnx.clone(model)
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.device_put(to_nnx(neutral_params, dtype=param_dtype_for(model.dtype)), device))
    nnx.update(model, state)
    optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=nnx.Param)
    # One committed placement for all of it, as the linen state's: jit compiles again when an argument switches
    # between committed and uncommitted placement.
    for node in (model, optimizer):
        nnx.update(node, jax.device_put(nnx.as_pure(nnx.state(node)), device))
    return TrainState(model, optimizer)


def forward(model: SentimentRNN, batch: DeviceBatch, carry: Carry, key: jax.Array, *, train: bool, use_lengths: bool,
            tbptt: int = 0, truncate_chunks: bool = True) -> tuple[jax.Array, Carry]:
    """Logits (B,) of the final step and the new carry, for the whole batch or in truncated-BPTT chunks of ``tbptt``
    steps (:func:`jax_impl.classifier.forward`'s rule: a ``lax.scan`` over the full chunks, then the shorter last one,
    the chunk's dropout key ``fold_in(key, chunk index)``, a ``stop_gradient`` at each boundary if ``truncate_chunks``),
    the scan NNX's own, ``nnx.scan``, the model broadcast to every chunk."""
    tokens, lengths = batch["tokens"], batch["lengths"] if use_lengths else None
    seq_len = tokens.shape[1]
    if not tbptt or tbptt >= seq_len:
        return model(tokens, carry, lengths, train=train, key=key)

    def run_chunk(model: SentimentRNN, carry: Carry, xs: tuple[jax.Array, jax.Array]) -> tuple[Carry, jax.Array]:
        """``xs``: (chunk index, tokens (B, K)) → ``(carry, logits (B,))``, the shape of a scan's body."""
        index, chunk = xs
        logits, carry = model(chunk, carry, None, train=train, key=jax.random.fold_in(key, index))
        if truncate_chunks:
            carry = jax.lax.stop_gradient(carry)  # the chunk boundary: no gradient into earlier chunks
        return carry, logits

    full, rest = divmod(seq_len, tbptt)
    chunks = tokens[:, :full * tbptt].reshape(tokens.shape[0], full, tbptt).swapaxes(0, 1)  # (n, B, K)
    scan = nnx.scan(run_chunk, in_axes=(None, nnx.Carry, 0), out_axes=(nnx.Carry, 0))  # None: the same model each
    carry, chunk_logits = scan(model, carry, (jnp.arange(full, dtype=jnp.int32), chunks))
    logits = chunk_logits[-1]
    if rest:
        carry, logits = run_chunk(model, carry, (jnp.int32(full), tokens[:, full * tbptt:]))
    return logits, carry


def make_loss_fn(cfg: Config, *, truncate_chunks: bool = True
                 ) -> Callable[[SentimentRNN, Carry, DeviceBatch, jax.Array], tuple[jax.Array, Carry]]:
    """``loss_fn(model, carry, batch, dropout_key) -> (mean BCE, new carry)`` in training mode; ``nnx.grad`` takes
    its gradient with respect to the model's ``nnx.Param`` s."""
    def loss_fn(model: SentimentRNN, carry: Carry, batch: DeviceBatch, dropout_key: jax.Array
                ) -> tuple[jax.Array, Carry]:
        if cfg.detach:
            carry = jax.lax.stop_gradient(carry)  # the seed's h.detach(): see jax_impl.classifier.make_loss_fn
        logits, new_carry = forward(model, batch, carry, dropout_key, train=True, tbptt=cfg.tbptt,
                                    use_lengths=cfg.padding == "right", truncate_chunks=truncate_chunks)
        return bce_loss(logits, batch["labels"]), new_carry

    return loss_fn


def make_update(cfg: Config) -> Callable[..., tuple[Carry, StepMetrics]]:
    """The step's optimizer part, ``update(model, optimizer, grads, loss, carry, new_carry) -> (carry, metrics)``:
    ``optimizer.update(model, grads)`` with the linen twin's transformation (PyTorch's clipping and Adam), and under
    --skip-nonfinite a non-finite step that leaves the parameters, the optimizer's state and the carry as they were
    (decided on the device; the step count moves on, as the linen state's does)."""
    def update(model: SentimentRNN, optimizer: nnx.Optimizer, grads: nnx.State, loss: jax.Array, carry: Carry,
               new_carry: Carry) -> tuple[Carry, StepMetrics]:
        finite = jnp.isfinite(loss) & jnp.isfinite(global_norm_torch(nnx.as_pure(grads)))
        trained = lambda: nnx.as_pure((nnx.state(model, nnx.Param), optimizer.opt_state))  # noqa: E731
        before = trained() if cfg.skip_nonfinite else None
        optimizer.update(model, grads)
        if cfg.skip_nonfinite:
            (params, opt_state), new_carry = jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b),
                                                                    (trained(), new_carry), (before, carry))
            nnx.update(model, params)
            nnx.update(optimizer.opt_state, nnx.state(opt_state))
        return new_carry, StepMetrics(loss, finite)

    return update


def make_train_step(cfg: Config, *, truncate_chunks: bool = True) -> Callable[..., tuple[Carry, StepMetrics]]:
    """The ``nnx.jit`` step ``train_step(model, optimizer, carry, batch, key) -> (carry, metrics)``: the loss and its
    gradient (``nnx.value_and_grad`` of :func:`make_loss_fn`), then :func:`make_update`; model and optimizer updated in
    place, their buffers donated. ``key`` is the run's base key; the step's dropout key is
    ``fold_in(key, optimizer.step)``. ``truncate_chunks`` (tests only) as in
    :func:`jax_impl.classifier.make_loss_fn`."""
    loss_fn, update = make_loss_fn(cfg, truncate_chunks=truncate_chunks), make_update(cfg)

    def train_step(model: SentimentRNN, optimizer: nnx.Optimizer, carry: Carry, batch: DeviceBatch, key: jax.Array
                   ) -> tuple[Carry, StepMetrics]:
        step_key = jax.random.fold_in(key, optimizer.step[...])
        (loss, new_carry), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, carry, batch, step_key)
        return update(model, optimizer, grads, loss, carry, new_carry)

    return nnx.jit(train_step, donate_argnames=("model", "optimizer"))


def make_eval_step(cfg: Config) -> Callable[[SentimentRNN, DeviceBatch], tuple[jax.Array, jax.Array]]:
    """The ``nnx.jit`` ``eval_step(model, batch) -> (loss_sum, correct)``: from a zero carry, no dropout; sums weighted
    by ``batch["weights"]`` (padding rows weigh 0)."""
    def eval_step(model: SentimentRNN, batch: DeviceBatch) -> tuple[jax.Array, jax.Array]:
        carry = model.zero_carry(batch["tokens"].shape[0])
        logits, _ = model(batch["tokens"], carry, batch["lengths"] if cfg.padding == "right" else None)
        return bce_sums(logits, batch["labels"], batch["weights"])

    return nnx.jit(eval_step)

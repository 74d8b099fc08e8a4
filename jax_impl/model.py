"""The seed's sentiment classifier in Flax linen: Embed → LSTM stack → dropout → Dense(1). This is the path
that trains.

    logits, carry = model.apply({"params": p}, tokens (B, T) int32, carry, lengths=None, train=False,
                                rngs={"dropout": key})

What runs by default (``--lstm-impl auto`` at float32), from the top:

    SentimentRNN.__call__           the embedding table, then the stack, dropout, Dense
    └─ LSTMStack.__call__           nn.LSTM's parameters (PyTorch's names and layout), the dropout masks
       └─ self.lstm                 partial(recurrence.embedding_lstm_stack, embed_fold=..., precision=...)
          └─ recurrence._wave       2 layers as one wavefront loop; custom VJP: _wave_forward, _wave_backward

:class:`LSTMStack` hands its parameters and masks to one of :data:`IMPLEMENTATIONS` (``--lstm-impl``), bound by
:func:`model_from_config` to its own options: ``fused`` (:mod:`jax_impl.recurrence`, hand-written gradients; the
default for float32 and float64), ``scan`` (:func:`scan_stack`, Flax ``nn.RNN`` over :class:`TorchLSTMCell`,
differentiated by JAX: the readable reference the fused stack is tested against; under bfloat16 it computes as
PyTorch does under autocast, :func:`autocast_stack`), ``flax`` (:func:`flax_cell_stack`, ``nn.RNN`` over Flax's
stock ``nn.OptimizedLSTMCell``: what a Flax user writes) or ``cudnn`` (:mod:`jax_impl.cudnn`, cuDNN's fused LSTM,
CUDA only). Any checkpoint runs under any of them. Every matmul runs at the model's ``precision``:
``Precision.HIGHEST`` (full float32, so TF32 GPUs still agree with the CPU and PyTorch) unless ``--allow-tf32``
makes it ``DEFAULT`` (TF32 where the GPU has it), in both twins. The carry is a tuple of L pairs ``(h, c)``, each
(B, H), where PyTorch keeps two (L, B, H) stacks.
"""
from functools import partial
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from common.errors import ConfigError, UnsupportedError
from jax_impl.cudnn import bfloat16_refusal, cudnn_stack
from jax_impl.recurrence import PRECISION, LayerCarry, LayerWeights, dot, embedding_lstm_stack, round_to

Array = jax.Array
Carry = tuple[LayerCarry, ...]  # one (h, c) pair per layer, bottom first


def param_dtype_for(dtype: Any) -> Any:
    """Parameters (and the carry) stay float32 under bfloat16 compute, and are float64 under float64."""
    return jnp.promote_types(dtype, jnp.float32)


def compute_dtype(name: str) -> Any:
    """'float32' | 'bfloat16' | 'float64' → the jnp dtype (float64 needs ``jax_enable_x64``)."""
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}[name]


def matmul_precision(allow_tf32: bool) -> jax.lax.Precision:
    """``--allow-tf32`` → the precision of every matmul: HIGHEST (full float32), or DEFAULT (TF32 on GPUs with it)."""
    return jax.lax.Precision.DEFAULT if allow_tf32 else PRECISION


class TorchLSTMCell(nn.RNNCellBase):
    """PyTorch's LSTM cell for ``nn.RNN``, on gates whose input half ``x @ W_ih.T + b_ih`` is precomputed for
    all steps at once: ``((h, c), gates_x (B, 4H)) → ((h', c'), h')``. Its recurrent weights are arguments, not
    parameters of its own, so every implementation reads the one tree :class:`LSTMStack` declares."""

    w_hh_t: Array  # (H, 4H)
    b_hh: Array  # (4H,)
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION

    @nn.compact
    def __call__(self, state: LayerCarry, gates_x: Array) -> tuple[LayerCarry, Array]:
        h, c = state
        gates = gates_x + (dot(h.astype(self.dtype), self.w_hh_t, self.precision) + self.b_hh)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c_new = (jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)).astype(c.dtype)
        h_new = (jax.nn.sigmoid(o) * jnp.tanh(c_new)).astype(h.dtype)
        return (h_new, c_new), h_new

    @property
    def num_feature_axes(self) -> int:
        return 1


def to_bfloat16(x: Array) -> Array:
    """Rounded to bfloat16, kept in float32 (:func:`round_to`)."""
    return round_to(x, jnp.bfloat16)


def bfloat16_dot(a: Array, b: Array, precision: jax.lax.Precision) -> Array:
    """(..., K) @ (K, N) as autocast's matmuls compute it: both operands rounded to bfloat16, float32 sums."""
    a, b = (to_bfloat16(x).astype(jnp.bfloat16) for x in (a, b))
    return jnp.matmul(a, b, precision=precision, preferred_element_type=jnp.float32)


class AutocastLSTMCell(nn.RNNCellBase):
    """PyTorch's LSTM cell as PyTorch computes it under bfloat16 autocast, found by replaying it
    (docs/mixed-precision.md): ``((h, c), gates_x (B, 4H)) → ((h', c'), h')`` on float32 arrays, rounded to bfloat16
    where PyTorch rounds. ``kernel`` "onednn" (oneDNN's LSTM): ``gates_x`` holds the float32 input projection and
    both biases; the matmuls take bfloat16 and sum in float32, the gate math is float32, h' is rounded, and c' is
    rounded as it passes to the next step (h' reads it unrounded). "native" (PyTorch's ATen cell, which runs packed
    sequences): ``gates_x`` is the rounded ``x W_ih + b_ih``; each matmul output, gate sum and activation is
    rounded, i * g too, and c and h stay float32. W_hh is cast inside the step, so its gradient sums over the steps
    in float32."""

    w_hh_t: Array  # (H, 4H) float32
    b_hh: Array  # (4H,) float32, rounded to bfloat16 (native only)
    kernel: str = "onednn"
    precision: jax.lax.Precision = PRECISION

    @nn.compact
    def __call__(self, state: LayerCarry, gates_x: Array) -> tuple[LayerCarry, Array]:
        h, c = state
        recurrent = bfloat16_dot(h, self.w_hh_t, self.precision)
        if self.kernel == "onednn":
            i, f, g, o = jnp.split(gates_x + recurrent, 4, axis=-1)
            c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h_new = to_bfloat16(jax.nn.sigmoid(o) * jnp.tanh(c_new))
            return (h_new, to_bfloat16(c_new)), h_new
        gates = to_bfloat16(to_bfloat16(recurrent + self.b_hh) + gates_x)
        i, f, g, o = (to_bfloat16(fn(z)) for fn, z in zip((jax.nn.sigmoid, jax.nn.sigmoid, jnp.tanh, jax.nn.sigmoid),
                                                           jnp.split(gates, 4, axis=-1)))
        c_new = f * c + to_bfloat16(i * g)
        h_new = o * jnp.tanh(c_new)
        return (h_new, c_new), h_new

    @property
    def num_feature_axes(self) -> int:
        return 1


def autocast_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry, lengths: Array | None,
                   masks: Sequence[Array] | None, *, precision: jax.lax.Precision = PRECISION) -> Carry:
    """:func:`scan_stack` under bfloat16: ``nn.LSTM`` under PyTorch's autocast, layer by layer, each a Flax ``nn.RNN``
    of :class:`AutocastLSTMCell` with oneDNN's rules, or the ATen cell's with ``lengths`` (PyTorch runs packed
    sequences there). Arguments as :func:`scan_stack`'s; every array, the carry included, stays float32."""
    kernel = "onednn" if lengths is None else "native"
    xs = jnp.take(table, tokens, axis=0)  # (T, B, E) float32: autocast leaves the embedding alone
    finals = []
    for k, ((w_ih, w_hh, b_ih, b_hh), (h, c)) in enumerate(zip(weights, carry)):
        if k > 0 and masks is not None:
            xs = xs * masks[k - 1]
        projected = bfloat16_dot(xs, w_ih.T, precision)  # all steps at once
        if kernel == "onednn":  # autocast's casts: the biases are added in bfloat16, h0 and c0 rounded
            gates_x = projected + to_bfloat16(to_bfloat16(b_ih) + to_bfloat16(b_hh))
            h, c = to_bfloat16(h), to_bfloat16(c)
        else:
            gates_x = to_bfloat16(projected + to_bfloat16(b_ih))
        cell = AutocastLSTMCell(w_hh.T, to_bfloat16(b_hh), kernel, precision)
        final, xs = nn.RNN(cell, time_major=True, return_carry=True)(gates_x, initial_carry=(h, c),
                                                                     seq_lengths=lengths)
        finals.append(final)
    return tuple(finals)


def scan_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry, lengths: Array | None,
               masks: Sequence[Array] | None, *, dtype: Any, precision: jax.lax.Precision = PRECISION) -> Carry:
    """The reference: ``nn.LSTM`` layer by layer, each a Flax ``nn.RNN`` of :class:`TorchLSTMCell`, in ``dtype``
    (bfloat16: :func:`autocast_stack`).

    table (V, E); tokens (T, B) int32, time-major; ``masks``: None or L-1 multipliers (T, B, H) of the inputs of
    layers 1..L-1. With ``lengths`` (B,) each row's carry is the one after its last token
    (``pack_padded_sequence``). Called inside :class:`LSTMStack`, whose scope the ``nn.RNN`` modules join; it
    looks the embeddings up first, as ``nn.LSTM`` does.
    """
    if dtype == jnp.bfloat16:
        return autocast_stack(table, tokens, weights, carry, lengths, masks, precision=precision)
    xs = jnp.take(table, tokens, axis=0).astype(dtype)  # (T, B, E)
    finals = []
    for k, ((w_ih, w_hh, b_ih, b_hh), layer_carry) in enumerate(zip(weights, carry)):
        if k > 0 and masks is not None:
            xs = xs * masks[k - 1].astype(xs.dtype)
        gates_x = dot(xs.astype(dtype), w_ih.T.astype(dtype), precision) + b_ih.astype(dtype)  # all steps at once
        cell = TorchLSTMCell(w_hh.T.astype(dtype), b_hh.astype(dtype), dtype, precision)
        final, xs = nn.RNN(cell, time_major=True, return_carry=True)(
            gates_x, initial_carry=layer_carry, seq_lengths=lengths)
        finals.append(final)
    return tuple(finals)


def flax_cell_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry,
                    lengths: Array | None, masks: Sequence[Array] | None, *, dtype: Any,
                    precision: jax.lax.Precision = PRECISION) -> Carry:
    """What a Flax user writes: per layer ``nn.RNN`` over Flax's own ``nn.OptimizedLSTMCell``, whose loop projects
    each step's input, fed these weights (arguments as :func:`scan_stack`'s). Per gate g its kernels are
    ``i<g>`` = W_ih[g].T and ``h<g>`` = W_hh[g].T, and its one bias is b_ih[g] + b_hh[g]: the sum lies inside the
    differentiated function, so both biases get PyTorch's gradient and the stack trains PyTorch's function. Its
    matmuls run at ``precision`` through JAX's default-precision setting (the cell takes none); it carries (c, h)."""
    xs = jnp.take(table, tokens, axis=0).astype(dtype)  # (T, B, E)
    finals = []
    for k, ((w_ih, w_hh, b_ih, b_hh), (h, c)) in enumerate(zip(weights, carry)):
        if k > 0 and masks is not None:
            xs = xs * masks[k - 1].astype(xs.dtype)
        hidden = w_hh.shape[1]
        rows = {g: slice(j * hidden, (j + 1) * hidden) for j, g in enumerate("ifgo")}
        cell = {f"i{g}": {"kernel": w_ih[r].T} for g, r in rows.items()}
        cell.update({f"h{g}": {"kernel": w_hh[r].T, "bias": (b_ih + b_hh)[r]} for g, r in rows.items()})
        rnn = nn.RNN(nn.OptimizedLSTMCell(hidden, dtype=dtype, param_dtype=w_hh.dtype), time_major=True,
                     return_carry=True)
        with jax.default_matmul_precision(precision.name.lower()):
            (c, h), xs = rnn.apply({"params": {"cell": cell}}, xs, initial_carry=(c, h), seq_lengths=lengths)
        finals.append((h, c))
    return tuple(finals)


# (table (V, E), tokens (T, B), weights, carry, lengths, masks) → the L final carries, options bound (bind_lstm)
Implementation = Callable[..., Carry]
IMPLEMENTATIONS: dict[str, Implementation] = {"fused": embedding_lstm_stack, "scan": scan_stack,
                                              "flax": flax_cell_stack, "cudnn": cudnn_stack}


def bind_lstm(name: str, dtype: Any = jnp.float32, precision: jax.lax.Precision = PRECISION,
              embed_fold: bool = True) -> Implementation:
    """Implementation ``name`` with the options it takes bound: the fused stack computes in the parameters' dtype
    and may fold the embedding; the scan computes in ``dtype``; cuDNN in float32."""
    options = {"fused": {"embed_fold": embed_fold, "precision": precision}, "cudnn": {"precision": precision},
               "scan": {"dtype": dtype, "precision": precision}, "flax": {"dtype": dtype, "precision": precision}}[name]
    return partial(IMPLEMENTATIONS[name], **options)


def lstm_name(lstm: Implementation) -> str:
    """The key of :data:`IMPLEMENTATIONS` a bound implementation runs."""
    return next(k for k, fn in IMPLEMENTATIONS.items() if fn is lstm.func)


def resolve_lstm_impl(name: str, dtype: str, platform: str | None = None) -> str:
    """``--lstm-impl`` → the implementation that runs: auto is fused, and scan under bfloat16. ``platform``: the
    run's JAX platform (default: JAX's default backend's), which cudnn needs to be a CUDA GPU."""
    if name == "auto":
        return "scan" if dtype == "bfloat16" else "fused"
    if name not in IMPLEMENTATIONS:
        raise ConfigError(f"--lstm-impl must be one of auto, {', '.join(IMPLEMENTATIONS)}, got {name!r}")
    if name == "fused" and dtype == "bfloat16":
        raise UnsupportedError("--lstm-impl fused does not implement bfloat16's mixed precision (float32 parameters "
                               "and carry); use --lstm-impl scan or auto")
    if name == "cudnn":
        platform = platform or jax.default_backend()
        if platform not in ("gpu", "cuda"):
            raise ConfigError(f"cudnn LSTM needs a CUDA GPU; this backend is {platform}")
        if dtype == "bfloat16":
            raise UnsupportedError(f"--lstm-impl cudnn cannot compute bfloat16: jax.experimental.rnn says "
                                   f"\"{bfloat16_refusal()}\"; use --lstm-impl auto")
        if dtype != "float32":
            raise ConfigError(f"--lstm-impl cudnn computes float32 only, not {dtype}; use --lstm-impl auto")
    return name


class LSTMStack(nn.Module):
    """``nn.LSTM(E, H, layers, dropout)`` over embedded tokens: ``(table, tokens, carry) → new carry``.

    Parameters: ``weight_ih_l{k}`` (4H, D_k), ``weight_hh_l{k}`` (4H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}``
    (4H,), with D_0 = E and D_k = H above, initialised U(-1/√H, 1/√H) as PyTorch does. In training, the input
    of each layer above the first is multiplied by a (T, B, H) mask of 0 and 1/(1-p) drawn from the 'dropout'
    rng, the same masks for every implementation.
    """

    hidden_dim: int
    layers: int
    dropout: float = 0.5
    lstm: Implementation = bind_lstm("fused")  # an implementation with its options bound (bind_lstm)
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, table: Array, tokens: Array, carry: Carry, lengths: Array | None = None,
                 train: bool = False) -> Carry:
        """table (V, E) the embedding; tokens (B, T) int32; carry L pairs (h, c) each (B, H); lengths (B,)."""
        hidden, pdtype = self.hidden_dim, self.param_dtype
        bound = 1.0 / hidden ** 0.5
        init = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)  # noqa: E731
        weights = []
        for k in range(self.layers):
            fan_in = table.shape[1] if k == 0 else hidden
            shapes = {"weight_ih": (4 * hidden, fan_in), "weight_hh": (4 * hidden, hidden),
                      "bias_ih": (4 * hidden,), "bias_hh": (4 * hidden,)}
            weights.append(tuple(self.param(f"{name}_l{k}", init, shape, pdtype) for name, shape in shapes.items()))
        masks = None
        if train and self.dropout > 0 and self.layers > 1:
            keep = 1.0 - self.dropout
            shape = (tokens.shape[1], tokens.shape[0], hidden)  # (T, B, H), time-major
            keys = jax.random.split(self.make_rng("dropout"), self.layers - 1)
            masks = [jax.random.bernoulli(key, keep, shape).astype(pdtype) / keep for key in keys]
        return self.lstm(table, tokens.T, weights, carry, lengths, masks)


class SentimentRNN(nn.Module):
    """Embed → ``layers`` LSTM layers → dropout → Dense(1): the logit of the top layer's final h.

    ``apply({'params': p}, tokens (B, T) int32, carry, lengths=None, train=False, rngs={'dropout': key})``
    returns ``(logits (B,), new_carry)``. Dropout (training only) acts between LSTM layers (``dropout``) and
    on the final h before the Dense (``fc_dropout``). With ``lengths`` (B,) the batch is right-padded and the
    carry stops at each text's last token. Under bfloat16 the Dense computes as autocast's Linear (operands rounded
    to bfloat16, float32 sums, the result rounded once) and the logits come back in bfloat16, which tells the loss
    to round its sigmoid likewise (:func:`jax_impl.loss.sigmoid`); the carry stays float32.
    """

    vocab_size: int
    embed_dim: int
    hidden_dim: int
    layers: int
    dropout: float = 0.5
    fc_dropout: float = 0.3
    dtype: Any = jnp.float32
    lstm: Implementation = bind_lstm("fused")
    precision: jax.lax.Precision = PRECISION  # of the Dense (the stack's is bound into ``lstm``)

    @property
    def lstm_impl(self) -> str:
        return lstm_name(self.lstm)

    def zero_carry(self, batch_size: int) -> Carry:
        """Zeros: ``layers`` pairs ``(h, c)``, each (batch_size, hidden_dim), in the parameters' dtype (float32 under
        bfloat16)."""
        zeros = jnp.zeros((batch_size, self.hidden_dim), param_dtype_for(self.dtype))
        return tuple((zeros, zeros) for _ in range(self.layers))

    @nn.compact
    def __call__(self, tokens: Array, carry: Carry, lengths: Array | None = None, train: bool = False
                 ) -> tuple[Array, Carry]:
        if len(carry) != self.layers:
            raise ValueError(f"carry has {len(carry)} layers, the model {self.layers}")
        pdtype = param_dtype_for(self.dtype)
        embedding = nn.Embed(self.vocab_size, self.embed_dim, dtype=self.dtype, param_dtype=pdtype,
                             embedding_init=nn.initializers.normal(1.0), name="embedding")
        lstm = LSTMStack(self.hidden_dim, self.layers, self.dropout, self.lstm, pdtype, name="lstm")
        new_carry = lstm(embedding.embedding, tokens, carry, lengths, train)
        top_h = new_carry[-1][0]  # (B, H): the last step's output, or each text's last token with lengths
        top_h = nn.Dropout(self.fc_dropout, deterministic=not train)(top_h)
        mixed = self.dtype == jnp.bfloat16
        rounded = {"promote_dtype": lambda *xs, dtype: tuple(x if x is None else to_bfloat16(x) for x in xs)}
        logits = nn.Dense(1, dtype=self.dtype, param_dtype=pdtype, precision=self.precision, name="fc",
                          **(rounded if mixed else {}))(top_h)
        return (to_bfloat16(logits[:, 0]).astype(jnp.bfloat16) if mixed else logits[:, 0].astype(pdtype)), new_carry


def model_from_config(cfg, vocab_size: int, platform: str | None = None) -> SentimentRNN:
    """The model a :class:`common.config.Config` describes: compute dtype ``cfg.dtype``, matmul precision from
    ``cfg.allow_tf32``, and the LSTM implementation ``resolve_lstm_impl(cfg.lstm_impl, cfg.dtype, platform)`` with
    its own options bound (``bind_lstm``)."""
    dtype, precision = compute_dtype(cfg.dtype), matmul_precision(cfg.allow_tf32)
    lstm = bind_lstm(resolve_lstm_impl(cfg.lstm_impl, cfg.dtype, platform), dtype, precision, cfg.embed_fold)
    return SentimentRNN(vocab_size=vocab_size, embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
                        layers=cfg.layers, dropout=cfg.dropout, fc_dropout=cfg.fc_dropout, dtype=dtype, lstm=lstm,
                        precision=precision)

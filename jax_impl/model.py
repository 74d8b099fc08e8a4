"""The seed's sentiment classifier in Flax linen: Embed → LSTM stack → dropout → Dense(1). This is the path
that trains.

    logits, carry = model.apply({"params": p}, tokens (B, T) int32, carry, lengths=None, train=False,
                                rngs={"dropout": key})

:class:`SentimentRNN` holds the embedding table and hands it to :class:`LSTMStack`, which declares ``nn.LSTM``'s
parameters (PyTorch's names and layout) and dropout masks and runs them through one of :data:`STACKS`
(``--lstm-impl``, chosen by :mod:`jax_impl.recurrences.choice`). By default (``auto``) that is ``kernel`` in float32 on
one CPU device with AVX2 or AVX-512 (:mod:`jax_impl.recurrences.kernel`: our own recurrence kernel through XLA's
FFI, layer by layer), else ``fused``, :func:`jax_impl.recurrences.fused.embedding_lstm_stack`: two layers as one
wavefront loop with hand-written gradients. The others: ``scan`` and ``flax`` (:mod:`jax_impl.recurrences.stacks`,
Flax ``nn.RNN`` differentiated by JAX; ``scan`` is the reference the others are tested against and, under bfloat16,
computes as PyTorch's autocast does), ``cudnn`` (:mod:`jax_impl.recurrences.cudnn`, CUDA only) and ``onednn``
(:mod:`jax_impl.recurrences.onednn`, oneDNN's LSTM through XLA's FFI, CPU only). Any checkpoint runs under any of them.
Every matmul runs at the model's ``precision``: ``Precision.HIGHEST`` (full float32, so TF32 GPUs still agree with the
CPU and PyTorch) unless ``--allow-tf32`` makes it ``DEFAULT``, in both twins. The carry is a tuple of L pairs
``(h, c)``, each (B, H), where PyTorch keeps two (L, B, H) stacks.
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_impl.recurrences import choice, cudnn, fused, kernel, onednn, stacks
from jax_impl.numerics import PRECISION, compute_dtype, matmul_precision, param_dtype_for, to_bfloat16
from jax_impl.recurrences.stacks import Carry

Array = jax.Array

# --lstm-impl → (the stack, the options it takes of LSTMStack's). Each stack is (table (V, E), tokens (T, B), weights,
# carry, lengths, masks, **options) → the L final carries.
STACKS = {
    "fused": (fused.embedding_lstm_stack, ("embed_fold", "precision")),
    "scan": (stacks.scan_stack, ("dtype", "precision")),
    "flax": (stacks.flax_cell_stack, ("dtype", "precision")),
    "cudnn": (cudnn.cudnn_stack, ("precision",)),
    "onednn": (onednn.onednn_stack, ("dtype",)),
    "kernel": (kernel.kernel_stack, ("embed_fold", "precision")),
}


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
    impl: str = "fused"  # a key of STACKS
    dtype: Any = jnp.float32  # the compute dtype (scan, flax)
    param_dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION
    embed_fold: bool = True  # fused: layer 0's input projection from the projected table (--embed-fold)

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
        stack, options = STACKS[self.impl]
        return stack(table, tokens.T, weights, carry, lengths, masks, **{k: getattr(self, k) for k in options})


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
    lstm_impl: str = "fused"  # a key of STACKS
    precision: jax.lax.Precision = PRECISION
    embed_fold: bool = True

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
        lstm = LSTMStack(self.hidden_dim, self.layers, self.dropout, self.lstm_impl, self.dtype, pdtype,
                         self.precision, self.embed_fold, name="lstm")
        new_carry = lstm(embedding.embedding, tokens, carry, lengths, train)
        top_h = new_carry[-1][0]  # (B, H): the last step's output, or each text's last token with lengths
        top_h = nn.Dropout(self.fc_dropout, deterministic=not train)(top_h)
        mixed = self.dtype == jnp.bfloat16
        rounded = {"promote_dtype": lambda *xs, dtype: tuple(x if x is None else to_bfloat16(x) for x in xs)}
        logits = nn.Dense(1, dtype=self.dtype, param_dtype=pdtype, precision=self.precision, name="fc",
                          **(rounded if mixed else {}))(top_h)
        return (to_bfloat16(logits[:, 0]).astype(jnp.bfloat16) if mixed else logits[:, 0].astype(pdtype)), new_carry


def model_from_config(cfg, vocab_size: int, platform: str | None = None, devices: int = 1) -> SentimentRNN:
    """The model a :class:`common.config.Config` describes: compute dtype ``cfg.dtype``, matmul precision from
    ``cfg.allow_tf32``, and the LSTM implementation :func:`jax_impl.recurrences.choice.resolve` picks for ``platform``
    and a mesh of ``devices``."""
    return SentimentRNN(vocab_size=vocab_size, embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
                        layers=cfg.layers, dropout=cfg.dropout, fc_dropout=cfg.fc_dropout,
                        dtype=compute_dtype(cfg.dtype),
                        lstm_impl=choice.resolve(cfg.lstm_impl, choice.Run.of(cfg, platform, devices)),
                        precision=matmul_precision(cfg.allow_tf32), embed_fold=cfg.embed_fold)

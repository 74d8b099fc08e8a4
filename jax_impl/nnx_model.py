"""The seed's sentiment classifier written in Flax NNX, as a Flax user writes it today: ``nnx.Embed`` → per layer
``nnx.RNN`` over Flax's stock ``nnx.OptimizedLSTMCell`` (dropout between layers) → dropout → ``nnx.Linear(H, 1)``.

    model = SentimentRNN(V, E, H, L, dropout, fc_dropout, rngs=nnx.Rngs(0))
    logits, carry = model(tokens (B, T) int32, carry, lengths=None, train=False, key=None)

``--flax-api nnx`` trains it (:mod:`jax_impl.nnx_step`: ``nnx.jit``, ``nnx.Optimizer``); :mod:`jax_impl.model` is its
linen twin, whose ``--lstm-impl flax`` runs the same cell through ``nn.RNN``. The carry goes in and out explicitly, a
tuple of L pairs ``(h, c)``, each (B, H), as in the linen model; the cell itself carries ``(c, h)``.

It trains PyTorch's function. The stock cell computes each step's gates as ``dense_i(x) + dense_h(h)``, with one bias
(in ``dense_h``); PyTorch's LSTM has two, b_ih and b_hh, each a parameter with the same gradient, so Adam moves their
sum twice as far as one bias would move, and clipping counts that gradient twice. So each layer's ``dense_i`` (biasless
in the stock cell) is an ``nnx.Linear`` with a bias, PyTorch's b_ih: the cell's own code then computes
``(x W_ih^T + b_ih) + (h W_hh^T + b_hh)`` over PyTorch's parameters (:func:`jax_impl.convert.to_nnx`). The linen twin
gets the same effect by summing the two biases inside the differentiated function; NNX modules own their parameters.

Randomness is explicit: ``key`` (the step's dropout key) is split into L keys, one per mask between layers (each layer's
outputs (B, T, H)) and one for the mask before the head. Masks are ``nnx.Dropout``'s own, so they differ from the linen
model's draws (as each framework's do): dropout-free outputs are what the twins compare.

From the model to the code that computes the gates, 2 calls of ours and Flax's: ``SentimentRNN.__call__`` →
``nnx.RNN.__call__`` (a scan over the steps) → ``nnx.OptimizedLSTMCell.__call__``.
"""
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl.numerics import PRECISION, Carry, compute_dtype, matmul_precision, param_dtype_for

Array = jax.Array


def lstm_cell(in_features: int, hidden: int, dtype: Any, param_dtype: Any, rngs: nnx.Rngs) -> nnx.OptimizedLSTMCell:
    """Flax's stock ``nnx.OptimizedLSTMCell(in_features, hidden)``, its input ``Linear`` given PyTorch's b_ih (the
    module docstring says why): ``dense_i`` (D, 4H) with bias (4H,), ``dense_h`` (H, 4H) with bias (4H,)."""
    cell = nnx.OptimizedLSTMCell(in_features, hidden, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    cell.dense_i = nnx.Linear(in_features, 4 * hidden, use_bias=True, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    return cell


class SentimentRNN(nnx.Module):
    """Embed → ``layers`` LSTM layers → dropout → Linear(1): the logit of the top layer's final h.

    ``model(tokens (B, T) int32, carry, lengths=None, train=False, key=None)`` returns ``(logits (B,), new_carry)``.
    Dropout (training only, masks from ``key``) acts between LSTM layers (``dropout``) and on the final h before the
    Linear (``fc_dropout``). With ``lengths`` (B,) the batch is right-padded and the carry stops at each text's last
    token. Computes in ``dtype`` (float32 or float64; the parameters and the carry too); every matmul at
    ``precision``. Parameters are created by Flax's initialisers and replaced by the run's neutral ones.
    """

    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, dropout: float = 0.5,
                 fc_dropout: float = 0.3, *, dtype: Any = jnp.float32, precision: jax.lax.Precision = PRECISION,
                 rngs: nnx.Rngs):
        pdtype = param_dtype_for(dtype)
        self.hidden_dim, self.dtype, self.precision = hidden_dim, dtype, precision
        self.embedding = nnx.Embed(vocab_size, embed_dim, dtype=dtype, param_dtype=pdtype,
                                   embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
        # rngs=False: the carry always comes in, so the RNN keeps no random stream of its own for it.
        self.lstm = nnx.List([nnx.RNN(lstm_cell(embed_dim if k == 0 else hidden_dim, hidden_dim, dtype, pdtype, rngs),
                                      return_carry=True, rngs=False) for k in range(layers)])
        self.lstm_dropout = nnx.Dropout(dropout)  # on each layer's outputs but the top one's
        self.fc_dropout = nnx.Dropout(fc_dropout)
        self.fc = nnx.Linear(hidden_dim, 1, dtype=dtype, param_dtype=pdtype, precision=precision, rngs=rngs)

    def zero_carry(self, batch_size: int) -> Carry:
        """Zeros: one pair ``(h, c)`` per layer, each (batch_size, hidden_dim), in the parameters' dtype."""
        zeros = jnp.zeros((batch_size, self.hidden_dim), param_dtype_for(self.dtype))
        return tuple((zeros, zeros) for _ in self.lstm)

    def __call__(self, tokens: Array, carry: Carry, lengths: Array | None = None, *, train: bool = False,
                 key: Array | None = None) -> tuple[Array, Carry]:
        if len(carry) != len(self.lstm):
            raise ValueError(f"carry has {len(carry)} layers, the model {len(self.lstm)}")
        keys = list(jax.random.split(key, len(self.lstm))) if key is not None else [None] * len(self.lstm)
        xs = self.embedding(tokens)  # (B, T, E)
        new_carry = []
        with jax.default_matmul_precision(self.precision.name.lower()):  # the cell takes no precision of its own
            for k, (rnn, (h, c)) in enumerate(zip(self.lstm, carry)):
                if k > 0:
                    xs = self.lstm_dropout(xs, deterministic=not train, rngs=keys[k - 1])
                (c, h), xs = rnn(xs, initial_carry=(c, h), seq_lengths=lengths)  # xs: (B, T, H)
                new_carry.append((h, c))
            top_h = self.fc_dropout(new_carry[-1][0], deterministic=not train, rngs=keys[-1])  # (B, H)
            logits = self.fc(top_h)[:, 0]
        return logits.astype(param_dtype_for(self.dtype)), tuple(new_carry)


def model_from_config(cfg, vocab_size: int) -> SentimentRNN:
    """The NNX model a :class:`common.config.Config` describes (compute dtype ``cfg.dtype``, matmul precision from
    ``cfg.allow_tf32``), its parameters Flax's initial ones from ``cfg.seed``."""
    return SentimentRNN(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.dropout, cfg.fc_dropout,
                        dtype=compute_dtype(cfg.dtype), precision=matmul_precision(cfg.allow_tf32),
                        rngs=nnx.Rngs(cfg.seed))

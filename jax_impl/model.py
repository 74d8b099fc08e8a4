"""The seed's sentiment classifier in Flax linen: Embed → LSTM stack → dropout → Dense(1). This is the path that trains.

    logits, carry = model.apply({"params": p}, tokens (B, T) int32, carry, lengths=None, train=False,
                                rngs={"dropout": key})

The LSTM is :class:`jax_impl.recurrences.stack.RNNStack` (``nn.LSTM``'s parameters, PyTorch's names and layout, and
its dropout masks), run by the implementation ``lstm_impl`` names, a key of
:data:`jax_impl.recurrences.choice.REGISTRY` (``--lstm-impl``; ``auto``'s choice: ``kernel`` in float32 on one CPU
device with AVX2 or AVX-512, ``scan`` under bfloat16, else ``fused``). Any checkpoint runs under any of them. Every
matmul runs at ``precision``: ``Precision.HIGHEST`` (full float32) unless ``--allow-tf32`` makes it ``DEFAULT``. The
carry is a tuple of L pairs ``(h, c)``, each (B, H), where PyTorch keeps two (L, B, H) stacks.

From the model to the code that computes the gates, 4 calls. The default on a CPU: ``SentimentRNN.__call__`` →
``RNNStack.__call__`` → ``kernel.table_layer`` (layer 0, the embedding fold; ``kernel.lstm_layer`` above it) →
``kernel.lstm_recurrence`` (a ``custom_vjp``) → the FFI call into ``lstm_kernel``. ``fused``: ``SentimentRNN.__call__``
→ ``RNNStack.__call__`` → ``fused.two_layer_stack`` → ``fused._wave`` (a ``custom_vjp``) → ``_wave_forward``, its loop.
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax_impl.numerics import PRECISION, Carry, param_dtype_for, to_bfloat16
from jax_impl.recurrences.choice import REGISTRY
from jax_impl.recurrences.stack import RNNStack, Tokens

Array = jax.Array


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
    lstm_impl: str  # a key of jax_impl.recurrences.choice.REGISTRY
    dropout: float = 0.5
    fc_dropout: float = 0.3
    dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION
    embed_fold: bool = True  # layer 0's projection from the projected table where the implementation folds it

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
        lstm = RNNStack(self.embed_dim, self.hidden_dim, self.layers, REGISTRY[self.lstm_impl], "lstm", self.dropout,
                        self.dtype, pdtype, self.precision, self.embed_fold, name="lstm")
        _, new_carry = lstm(Tokens(embedding.embedding, tokens.T), carry, train, lengths)
        top_h = new_carry[-1][0]  # (B, H): the last step's output, or each text's last token with lengths
        top_h = nn.Dropout(self.fc_dropout, deterministic=not train)(top_h)
        mixed = self.dtype == jnp.bfloat16
        rounded = {"promote_dtype": lambda *xs, dtype: tuple(x if x is None else to_bfloat16(x) for x in xs)}
        logits = nn.Dense(1, dtype=self.dtype, param_dtype=pdtype, precision=self.precision, name="fc",
                          **(rounded if mixed else {}))(top_h)
        return (to_bfloat16(logits[:, 0]).astype(jnp.bfloat16) if mixed else logits[:, 0].astype(pdtype)), new_carry

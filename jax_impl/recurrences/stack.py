"""The one recurrent stack both workloads' models declare: ``nn.LSTM`` / ``nn.GRU(input_size, hidden_size, num_layers,
dropout)`` in PyTorch's parameter layout, run by the implementation the model names (a :data:`.choice.REGISTRY`
entry, :class:`.interface.Recurrence`).

    outputs, finals = RNNStack(E, H, L, REGISTRY["fused"], "lstm").apply(params, xs (T, B, E), carry, train, rngs=...)
    outputs, finals = RNNStack(...).apply(params, Tokens(table (V, E), tokens (T, B)), carry, train, lengths, rngs=...)

The second form (the classifier's) gives layer 0 token ids, which lets an implementation's overrides run (the
embedding fold, the two-layer wavefront, :mod:`.interface`); its ``outputs`` are None where the wavefront ran.
"""
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from common.params import GATES
from jax_impl.numerics import PRECISION, Array, Carry
from jax_impl.recurrences.interface import Recurrence


class Tokens(NamedTuple):
    """Layer 0's input as token ids: ``table[ids]`` (T, B, E), which an implementation may fold into its projection."""

    table: Array  # (V, E)
    ids: Array  # (T, B) int32


class RNNStack(nn.Module):
    """``(inputs, carry, train=False, lengths=None) → (the top layer's outputs (T, B, H) or None, the final carries)``.

    Parameters: ``weight_ih_l{k}`` (G·H, D_k), ``weight_hh_l{k}`` (G·H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}``
    (G·H,), D_0 = ``input_size`` and D_k = H above, initialised U(-1/√H, 1/√H) as PyTorch does. In training the input
    of each layer above the first is multiplied by a (T, B, H) mask of 0 and 1/(1-p) drawn from the 'dropout' rng, the
    same masks for every implementation. The carry: one per layer, bottom first, LSTM (h, c), GRU h, each (B, H); with
    ``lengths`` (B,) each row's carry is the one after its last token. ``embed_fold``: with token ids and V < T·B,
    layer 0 may gather its projection from the projected table (the same sums associated differently)."""

    input_size: int
    hidden_size: int
    num_layers: int
    recurrence: Recurrence  # what runs the layers: an entry of choice.REGISTRY
    cell: str = "lstm"
    dropout: float = 0.5
    dtype: Any = jnp.float32  # the compute dtype
    param_dtype: Any = jnp.float32
    precision: jax.lax.Precision = PRECISION
    embed_fold: bool = True

    @nn.compact
    def __call__(self, inputs: Array | Tokens, carry: Carry, train: bool = False,
                 lengths: Array | None = None) -> tuple[Array | None, Carry]:
        hidden, rows = self.hidden_size, GATES[self.cell] * self.hidden_size
        bound = 1.0 / hidden ** 0.5
        init = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)  # noqa: E731
        weights = []
        for k in range(self.num_layers):
            shapes = {"weight_ih": (rows, self.input_size if k == 0 else hidden), "weight_hh": (rows, hidden),
                      "bias_ih": (rows,), "bias_hh": (rows,)}
            weights.append(tuple(self.param(f"{name}_l{k}", init, shape, self.param_dtype)
                                 for name, shape in shapes.items()))
        steps, batch = (inputs.ids if isinstance(inputs, Tokens) else inputs).shape[:2]
        masks = None
        if train and self.dropout > 0 and self.num_layers > 1:
            keep = 1.0 - self.dropout
            keys = jax.random.split(self.make_rng("dropout"), self.num_layers - 1)
            masks = [jax.random.bernoulli(key, keep, (steps, batch, hidden)).astype(self.param_dtype) / keep
                     for key in keys]

        recurrence, options = self.recurrence, {"dtype": self.dtype, "precision": self.precision, "lengths": lengths}
        xs, fold = inputs, False
        if isinstance(inputs, Tokens):
            fold = self.embed_fold and inputs.table.shape[0] < steps * batch
            if recurrence.two_layer_stack is not None and self.num_layers == 2:
                return None, recurrence.two_layer_stack(*inputs, weights, carry, masks, fold=fold, **options)
            fold = fold and recurrence.embedded_layer is not None
            xs = inputs if fold else jnp.take(inputs.table, inputs.ids, axis=0)  # (T, B, E)
        finals = []
        for k in range(self.num_layers):  # nn.LSTM's order of work
            if k == 0 and fold:
                final, xs = recurrence.embedded_layer(*xs, weights[0], carry[0], **options)
            else:
                if k > 0 and masks is not None:
                    xs = xs * masks[k - 1].astype(xs.dtype)
                final, xs = recurrence.layers[self.cell](xs, weights[k], carry[k], **options)
            finals.append(final)
        return xs, tuple(finals)


def final_carries(recurrence: Recurrence, table: Array, tokens: Array, weights, carry: Carry,
                  lengths: Array | None = None, dropout_key: Array | None = None, **fields) -> Carry:
    """The classifier's stack as a function of explicit weights (L tuples ``(w_ih, w_hh, b_ih, b_hh)``): the final
    carries of :class:`RNNStack` ``(fields)`` run by ``recurrence`` over ``table[tokens]`` (tokens (T, B)), with dropout
    between the layers (``fields``' rate, 0.5 by default) drawn from ``dropout_key`` where one is given."""
    module = RNNStack(table.shape[1], weights[0][1].shape[1], len(weights), recurrence, **fields)
    params = {f"{name}_l{k}": w for k, layer in enumerate(weights)
              for name, w in zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"), layer)}
    return module.apply({"params": params}, Tokens(table, tokens), tuple(carry), dropout_key is not None, lengths,
                        rngs={} if dropout_key is None else {"dropout": dropout_key})[1]

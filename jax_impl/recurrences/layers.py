"""The one interface every recurrence serves the language model through: one layer over a sequence, every step's
output returned, ``layer(xs (T, B, D), (w_ih, w_hh, b_ih, b_hh), carry, *, dtype, precision) → (the final carry,
outputs (T, B, H))``, stacked by :func:`jax_impl.recurrences.stacks.stack_layers` (an LSTM layer's carry is (h, c),
a GRU layer's h, each (B, H)). ``--lstm-impl`` → cell → that layer; :mod:`jax_impl.recurrences.choice` refuses what
is missing here. The classifier's stacks start from the token ids instead (the embedding fold, the wavefront) and
return the final carries only: ``jax_impl.model.STACKS``."""
from jax_impl.recurrences import fused, kernel, onednn, stacks

LAYERS = {
    "scan": {"lstm": stacks.torch_lstm_layer, "gru": stacks.torch_gru_layer},
    "flax": {"lstm": stacks.flax_lstm_layer, "gru": stacks.flax_gru_layer},
    "fused": {"lstm": fused.sequence_layer},
    "onednn": {"lstm": onednn.sequence_layer},
    "kernel": {"lstm": kernel.sequence_layer},
}

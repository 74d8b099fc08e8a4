"""The language model's parameters (pytorch/examples' ``word_language_model``, its ``RNNModel``) in PyTorch's layout:
names, shapes, and the example's initial distributions drawn in numpy, so both twins start from the same numbers.

The neutral names *are* the model's parameter names: ``encoder.weight`` (V, E); per layer k ``rnn.weight_ih_l{k}``
(G·H, D_k), ``rnn.weight_hh_l{k}`` (G·H, H), ``rnn.bias_ih_l{k}`` and ``rnn.bias_hh_l{k}`` (G·H,), with D_0 = E,
D_k = H above, G = 4 for the LSTM (gate order i, f, g, o) and 3 for the GRU (r, z, n); ``decoder.weight`` (V, H) and
``decoder.bias`` (V,). Tied weights (``--tied``): the tree holds ``encoder.weight`` alone, no ``decoder.weight`` —
one array per parameter, as ``named_parameters()`` lists a tied model, so safetensors (which refuses two names
sharing memory) can save it and no load can meet two copies that disagree.
"""
import numpy as np

from common.errors import ConfigError
from common.params import Params

GATES = {"lstm": 4, "gru": 3}  # the gates of each cell, stacked in its weights' rows
INIT_RANGE = 0.1  # the example's init_weights: encoder and decoder weights U(-0.1, 0.1), decoder bias 0


def check_lm_sizes(embed_dim: int, hidden_dim: int, cell: str, tied: bool) -> None:
    """Refuse what the model cannot be: an unknown cell, or tied weights with E != H (the decoder reads the
    encoder's (V, E) table as its (V, H) weight)."""
    if cell not in GATES:
        raise ConfigError(f"the cell must be one of {', '.join(GATES)}, got {cell!r}")
    if tied and embed_dim != hidden_dim:
        raise ConfigError(f"tied weights need --embed-dim equal to --hidden-dim (the decoder reads the embedding "
                          f"table), got {embed_dim} and {hidden_dim}: set both to one size, or leave out --tied")


def lm_param_shapes(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str,
                    tied: bool) -> dict[str, tuple[int, ...]]:
    """Name → shape, in the order of ``RNNModel.named_parameters()`` (tied: without ``decoder.weight``)."""
    check_lm_sizes(embed_dim, hidden_dim, cell, tied)
    rows = GATES[cell] * hidden_dim
    shapes: dict[str, tuple[int, ...]] = {"encoder.weight": (vocab_size, embed_dim)}
    for k in range(layers):
        shapes |= {f"rnn.weight_ih_l{k}": (rows, embed_dim if k == 0 else hidden_dim),
                   f"rnn.weight_hh_l{k}": (rows, hidden_dim), f"rnn.bias_ih_l{k}": (rows,),
                   f"rnn.bias_hh_l{k}": (rows,)}
    if not tied:
        shapes["decoder.weight"] = (vocab_size, hidden_dim)
    return shapes | {"decoder.bias": (vocab_size,)}


def init_lm_params(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str, tied: bool,
                   seed: int) -> Params:
    """Initial float32 parameters, the example's: encoder and decoder weights U(-0.1, 0.1), decoder bias 0, the RNN
    keeping PyTorch's default U(-1/√H, 1/√H) for every weight and bias. Drawn in float64 from ``default_rng(seed)``
    in :func:`lm_param_shapes`'s order (the bias draws nothing), then rounded."""
    rng = np.random.default_rng(seed)
    rnn_bound = 1.0 / np.sqrt(hidden_dim)
    params: Params = {}
    for name, shape in lm_param_shapes(vocab_size, embed_dim, hidden_dim, layers, cell, tied).items():
        if name == "decoder.bias":
            drawn = np.zeros(shape)
        else:
            bound = rnn_bound if name.startswith("rnn.") else INIT_RANGE
            drawn = rng.uniform(-bound, bound, shape)
        params[name] = drawn.astype(np.float32)
    return params

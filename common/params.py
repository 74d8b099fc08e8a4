"""Both workloads' parameters in PyTorch's layout: names, shapes, and PyTorch's (or the example's) initial
distributions drawn in numpy, so both twins start from the same numbers. The neutral names *are* the models' parameter
names.

The classifier (the classic notebook's ``SentimentRNN``): ``embedding.weight`` (V, E); per layer k
``lstm.weight_ih_l{k}`` (4H, D_k), ``lstm.weight_hh_l{k}`` (4H, H), ``lstm.bias_ih_l{k}`` and ``lstm.bias_hh_l{k}``
(4H,), gate order i, f, g, o, two biases per layer; ``fc.weight`` (1, H) and ``fc.bias`` (1,).

The language model (pytorch/examples' ``word_language_model``, its ``RNNModel``): ``encoder.weight`` (V, E); per layer
k ``rnn.weight_ih_l{k}`` (G·H, D_k), ``rnn.weight_hh_l{k}`` (G·H, H), ``rnn.bias_ih_l{k}`` and ``rnn.bias_hh_l{k}``
(G·H,), G = 4 for the LSTM (i, f, g, o) and 3 for the GRU (r, z, n); ``decoder.weight`` (V, H) and ``decoder.bias``
(V,). Tied weights (``--tied``): the tree holds ``encoder.weight`` alone, no ``decoder.weight`` — one array per
parameter, as ``named_parameters()`` lists a tied model, so safetensors (which refuses two names sharing memory) can
save it and no load can meet two copies that disagree.

D_0 = E and D_k = H above, in both.
"""
import numpy as np

from common.errors import ConfigError

Params = dict[str, np.ndarray]
GATES = {"lstm": 4, "gru": 3}  # the gates of each cell, stacked in its weights' rows
INIT_RANGE = 0.1  # the example's init_weights: encoder and decoder weights U(-0.1, 0.1), decoder bias 0


def param_shapes(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int) -> dict[str, tuple[int, ...]]:
    """The classifier's name → shape, in the order of ``SentimentRNN.state_dict()``."""
    shapes: dict[str, tuple[int, ...]] = {"embedding.weight": (vocab_size, embed_dim)}
    for k in range(layers):
        shapes |= {f"lstm.weight_ih_l{k}": (4 * hidden_dim, embed_dim if k == 0 else hidden_dim),
                   f"lstm.weight_hh_l{k}": (4 * hidden_dim, hidden_dim),
                   f"lstm.bias_ih_l{k}": (4 * hidden_dim,), f"lstm.bias_hh_l{k}": (4 * hidden_dim,)}
    return shapes | {"fc.weight": (1, hidden_dim), "fc.bias": (1,)}


def shapes_for(cfg, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The shapes of ``cfg``'s model: the classifier's, or the language model's."""
    if cfg.workload == "lm":
        return lm_param_shapes(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.cell, cfg.tied)
    return param_shapes(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers)


def init_params(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, seed: int) -> Params:
    """The classifier's initial float32 parameters from PyTorch's default distributions: ``nn.Embedding`` N(0, 1);
    ``nn.LSTM`` every weight and bias U(-1/√H, 1/√H); ``nn.Linear`` weight (kaiming_uniform with a=√5) and bias both
    U(-1/√fan_in, 1/√fan_in). Drawn in float64 from ``default_rng(seed)`` in state-dict order, then rounded."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(hidden_dim)  # LSTM: 1/√H; fc: 1/√fan_in with fan_in = H
    drawn = {name: rng.standard_normal(shape) if name == "embedding.weight" else rng.uniform(-bound, bound, shape)
             for name, shape in param_shapes(vocab_size, embed_dim, hidden_dim, layers).items()}
    return {name: values.astype(np.float32) for name, values in drawn.items()}


def check_lm_sizes(embed_dim: int, hidden_dim: int, cell: str, tied: bool) -> None:
    """Refuse what the language model cannot be: an unknown cell, or tied weights with E != H (the decoder reads the
    encoder's (V, E) table as its (V, H) weight)."""
    if cell not in GATES:
        raise ConfigError(f"the cell must be one of {', '.join(GATES)}, got {cell!r}")
    if tied and embed_dim != hidden_dim:
        raise ConfigError(f"tied weights need --embed-dim equal to --hidden-dim (the decoder reads the embedding "
                          f"table), got {embed_dim} and {hidden_dim}: set both to one size, or leave out --tied")


def lm_param_shapes(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str,
                    tied: bool) -> dict[str, tuple[int, ...]]:
    """The language model's name → shape, in the order of ``RNNModel.named_parameters()`` (tied: without
    ``decoder.weight``)."""
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
    """The language model's initial float32 parameters, the example's: encoder and decoder weights U(-0.1, 0.1),
    decoder bias 0, the RNN keeping PyTorch's default U(-1/√H, 1/√H) for every weight and bias. Drawn in float64 from
    ``default_rng(seed)`` in :func:`lm_param_shapes`'s order (the bias draws nothing), then rounded."""
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

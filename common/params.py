"""The model's parameters in PyTorch's layout: names, shapes, and PyTorch's initial distributions in numpy.
The neutral names *are* the state-dict names of the classic notebook's ``SentimentRNN``: gate order i, f, g, o;
two biases per LSTM layer (``bias_ih`` and ``bias_hh``)."""
import numpy as np

Params = dict[str, np.ndarray]


def param_shapes(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int) -> dict[str, tuple[int, ...]]:
    """Name → shape, in the order of ``SentimentRNN.state_dict()``."""
    shapes: dict[str, tuple[int, ...]] = {"embedding.weight": (vocab_size, embed_dim)}
    for k in range(layers):
        shapes |= {f"lstm.weight_ih_l{k}": (4 * hidden_dim, embed_dim if k == 0 else hidden_dim),
                   f"lstm.weight_hh_l{k}": (4 * hidden_dim, hidden_dim),
                   f"lstm.bias_ih_l{k}": (4 * hidden_dim,), f"lstm.bias_hh_l{k}": (4 * hidden_dim,)}
    return shapes | {"fc.weight": (1, hidden_dim), "fc.bias": (1,)}


def shapes_for(cfg, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The shapes of ``cfg``'s model: the classifier's, or the language model's (:mod:`common.lm_params`)."""
    if cfg.workload == "lm":
        from common.lm_params import lm_param_shapes  # it imports Params from here
        return lm_param_shapes(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers, cfg.cell, cfg.tied)
    return param_shapes(vocab_size, cfg.embed_dim, cfg.hidden_dim, cfg.layers)


def init_params(vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, seed: int) -> Params:
    """Initial float32 parameters from PyTorch's default distributions: ``nn.Embedding`` N(0, 1); ``nn.LSTM``
    every weight and bias U(-1/√H, 1/√H); ``nn.Linear`` weight (kaiming_uniform with a=√5) and bias both
    U(-1/√fan_in, 1/√fan_in). Drawn in float64 from ``default_rng(seed)`` in state-dict order, then rounded."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(hidden_dim)  # LSTM: 1/√H; fc: 1/√fan_in with fan_in = H
    drawn = {name: rng.standard_normal(shape) if name == "embedding.weight" else rng.uniform(-bound, bound, shape)
             for name, shape in param_shapes(vocab_size, embed_dim, hidden_dim, layers).items()}
    return {name: values.astype(np.float32) for name, values in drawn.items()}

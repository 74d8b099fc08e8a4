"""Neutral parameters (PyTorch state-dict names and layouts) ⇄ the Flax params pytree.

    embedding.weight      (V, E)    ↔ embedding/embedding      (V, E)
    lstm.<name>           any       ↔ lstm/<name>              the same array (LSTMStack declares PyTorch's
                                                               weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k},
                                                               bias_hh_l{k} itself)
    fc.weight             (1, H)    ↔ fc/kernel                (H, 1)    transposed
    fc.bias               (1,)      ↔ fc/bias                  (1,)

``from_flax(to_flax(p))`` is bitwise ``p``.
"""
from typing import Any

import numpy as np

Neutral = dict[str, np.ndarray]
FlaxParams = dict[str, Any]


def to_flax(neutral: Neutral, dtype: Any = None) -> FlaxParams:
    """Neutral name → array dict to the Flax params pytree of numpy arrays (``dtype``: default unchanged)."""

    def take(name: str, transpose: bool = False) -> np.ndarray:
        arr = np.asarray(neutral[name])
        return np.array(arr.T if transpose else arr, dtype=dtype or arr.dtype, order="C")  # a contiguous copy

    lstm = {name[len("lstm."):]: take(name) for name in neutral if name.startswith("lstm.")}
    return {"embedding": {"embedding": take("embedding.weight")}, "lstm": lstm,
            "fc": {"kernel": take("fc.weight", True), "bias": take("fc.bias")}}


def from_flax(params: FlaxParams) -> Neutral:
    """The Flax params pytree (numpy or jax arrays, any float dtype) to neutral float32 arrays, in the order of
    ``common.params.param_shapes``."""

    def put(arr: Any, transpose: bool = False) -> np.ndarray:
        arr = np.asarray(arr)
        return np.array(arr.T if transpose else arr, dtype=np.float32, order="C")

    lstm = params["lstm"]
    layers = sum(1 for name in lstm if name.startswith("weight_ih_l"))
    neutral: Neutral = {"embedding.weight": put(params["embedding"]["embedding"])}
    for k in range(layers):
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            neutral[f"lstm.{name}_l{k}"] = put(lstm[f"{name}_l{k}"])
    neutral["fc.weight"] = put(params["fc"]["kernel"], True)
    neutral["fc.bias"] = put(params["fc"]["bias"])
    return neutral

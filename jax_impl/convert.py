"""Neutral parameters (PyTorch state-dict names and layouts) ⇄ the Flax params pytree. Transposes only.

    embedding.weight      (V, E)    ↔ embedding/embedding                 (V, E)
    lstm.weight_ih_l{k}   (4H, D)   ↔ lstm_l{k}/ih/kernel                 (D, 4H)   transposed
    lstm.bias_ih_l{k}     (4H,)     ↔ lstm_l{k}/ih/bias                   (4H,)
    lstm.weight_hh_l{k}   (4H, H)   ↔ lstm_l{k}/recurrence/cell/hh/kernel (H, 4H)   transposed
    lstm.bias_hh_l{k}     (4H,)     ↔ lstm_l{k}/recurrence/cell/hh/bias   (4H,)
    fc.weight             (1, H)    ↔ fc/kernel                           (H, 1)    transposed
    fc.bias               (1,)      ↔ fc/bias                             (1,)

Gate order (i, f, g, o) is the same on both sides, so rows need no reordering. ``from_flax(to_flax(p))``
is bitwise ``p``. The carry converts too: a tuple of L pairs ``(h, c)`` ⇄ PyTorch's ``(h, c)`` stacks (L, B, H).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

Neutral = dict[str, np.ndarray]
FlaxParams = dict[str, Any]


def num_layers(neutral: Neutral) -> int:
    return len([name for name in neutral if re.fullmatch(r"lstm\.weight_ih_l\d+", name)])


def to_flax(neutral: Neutral, dtype: Any = None) -> FlaxParams:
    """Neutral name → array dict to the Flax params pytree of numpy arrays (``dtype``: default unchanged)."""

    def take(name: str, transpose: bool = False) -> np.ndarray:
        arr = np.asarray(neutral[name])
        arr = arr.T if transpose else arr
        return np.array(arr, dtype=dtype or arr.dtype, order="C")  # a contiguous copy

    params: FlaxParams = {"embedding": {"embedding": take("embedding.weight")}}
    for k in range(num_layers(neutral)):
        params[f"lstm_l{k}"] = {
            "ih": {"kernel": take(f"lstm.weight_ih_l{k}", True), "bias": take(f"lstm.bias_ih_l{k}")},
            "recurrence": {"cell": {"hh": {"kernel": take(f"lstm.weight_hh_l{k}", True),
                                           "bias": take(f"lstm.bias_hh_l{k}")}}},
        }
    params["fc"] = {"kernel": take("fc.weight", True), "bias": take("fc.bias")}
    return params


def from_flax(params: FlaxParams) -> Neutral:
    """The Flax params pytree (numpy or jax arrays, any float dtype) to neutral float32 arrays, in the order of
    ``common.params.param_shapes``."""

    def put(arr: Any, transpose: bool = False) -> np.ndarray:
        arr = np.asarray(arr)
        return np.array(arr.T if transpose else arr, dtype=np.float32, order="C")

    layers = len([name for name in params if re.fullmatch(r"lstm_l\d+", name)])
    neutral: Neutral = {"embedding.weight": put(params["embedding"]["embedding"])}
    for k in range(layers):
        layer = params[f"lstm_l{k}"]
        hh = layer["recurrence"]["cell"]["hh"]
        neutral[f"lstm.weight_ih_l{k}"] = put(layer["ih"]["kernel"], True)
        neutral[f"lstm.weight_hh_l{k}"] = put(hh["kernel"], True)
        neutral[f"lstm.bias_ih_l{k}"] = put(layer["ih"]["bias"])
        neutral[f"lstm.bias_hh_l{k}"] = put(hh["bias"])
    neutral["fc.weight"] = put(params["fc"]["kernel"], True)
    neutral["fc.bias"] = put(params["fc"]["bias"])
    return neutral


def carry_to_stacked(carry: Any) -> tuple[np.ndarray, np.ndarray]:
    """The carry (a tuple of L pairs ``(h, c)``, each (B, H)) as PyTorch's ``(h_n, c_n)``, each (L, B, H)."""
    return (np.stack([np.asarray(h) for h, _ in carry]), np.stack([np.asarray(c) for _, c in carry]))


def carry_from_stacked(h: np.ndarray, c: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """PyTorch's ``(h_0, c_0)``, each (L, B, H), as the carry: a tuple of L pairs ``(h, c)``, each (B, H)."""
    return tuple((np.array(h[k]), np.array(c[k])) for k in range(np.shape(h)[0]))

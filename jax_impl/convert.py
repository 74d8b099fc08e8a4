"""Neutral parameters (PyTorch state-dict names and layouts) ⇄ the Flax params pytree.

    embedding.weight      (V, E)    ↔ embedding/embedding      (V, E)
    lstm.<name>           any       ↔ lstm/<name>              the same array (RNNStack declares PyTorch's
                                                               weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k},
                                                               bias_hh_l{k} itself)
    fc.weight             (1, H)    ↔ fc/kernel                (H, 1)    transposed
    fc.bias               (1,)      ↔ fc/bias                  (1,)

``from_flax(to_flax(p))`` is bitwise ``p``.

The classifier written in Flax NNX (:mod:`jax_impl.nnx_model`) holds Flax's stock cell's parameters, PyTorch's gate
order (i, f, g, o) along each 4H axis, layer k at ``lstm/k/cell``:

    lstm.weight_ih_l{k}   (4H, D_k) ↔ lstm/k/cell/dense_i/kernel   (D_k, 4H) transposed
    lstm.bias_ih_l{k}     (4H,)     ↔ lstm/k/cell/dense_i/bias     (4H,)      (one the stock cell lacks: nnx_model)
    lstm.weight_hh_l{k}   (4H, H)   ↔ lstm/k/cell/dense_h/kernel   (H, 4H)    transposed
    lstm.bias_hh_l{k}     (4H,)     ↔ lstm/k/cell/dense_h/bias     (4H,)
    embedding and fc as above

``from_nnx(to_nnx(p))`` is bitwise ``p`` too.
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


def to_nnx(neutral: Neutral, dtype: Any = None) -> FlaxParams:
    """Neutral name → array dict to the NNX model's parameters as a pure dict (``nnx.to_pure_dict``'s layout: layer k
    under the int key k), numpy arrays (``dtype``: default unchanged)."""
    flax = to_flax(neutral, dtype)
    lstm = flax.pop("lstm")
    layers = sum(1 for name in lstm if name.startswith("weight_ih_l"))
    flax["lstm"] = {k: {"cell": {
        "dense_i": {"kernel": np.ascontiguousarray(lstm[f"weight_ih_l{k}"].T), "bias": lstm[f"bias_ih_l{k}"]},
        "dense_h": {"kernel": np.ascontiguousarray(lstm[f"weight_hh_l{k}"].T), "bias": lstm[f"bias_hh_l{k}"]}}}
        for k in range(layers)}
    return flax


def from_nnx(params: FlaxParams) -> Neutral:
    """The NNX model's parameters as a pure dict (numpy or jax arrays, any float dtype) to neutral float32 arrays, in
    the order of ``common.params.param_shapes``."""
    lstm = {}
    for k, layer in sorted(params["lstm"].items(), key=lambda item: int(item[0])):
        cell = layer["cell"]
        (w_ih, b_ih), (w_hh, b_hh) = ((cell[d]["kernel"], cell[d]["bias"]) for d in ("dense_i", "dense_h"))
        lstm.update({f"weight_ih_l{k}": np.asarray(w_ih).T, f"bias_ih_l{k}": b_ih,
                     f"weight_hh_l{k}": np.asarray(w_hh).T, f"bias_hh_l{k}": b_hh})
    return from_flax({**params, "lstm": lstm})

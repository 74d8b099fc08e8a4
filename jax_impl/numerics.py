"""The JAX twin's float rules, shared by every LSTM implementation: the compute dtype a flag means, the matmul
precision (full float32 unless TF32 is allowed), one matmul at that precision, and rounding to bfloat16 where
PyTorch's autocast rounds. Also the arrays every implementation takes: a layer's weights and its carry."""
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from common.errors import ConfigError

Array = jax.Array
LayerCarry = tuple[Array, Array]  # (h, c), each (B, H)
LayerWeights = tuple[Array, Array, Array, Array]  # (w_ih (4H, D), w_hh (4H, H), b_ih (4H,), b_hh (4H,))
Carry = tuple[Any, ...]  # one carry per layer, bottom first: LSTM (h, c), GRU h
DeviceBatch = dict[str, Array]  # "tokens" (B, T) int32, "labels" (B,) float32, "lengths" (B,) int32[, "weights"]
PRECISION = lax.Precision.HIGHEST  # the default: full float32, as PyTorch with TF32 off


def compute_dtype(name: str) -> Any:
    """'float32' | 'bfloat16' | 'float64' → the jnp dtype. float64 needs JAX's x64 mode, which a program switches on
    where it starts (``python -m jax_impl.train --dtype float64`` does): refused (ConfigError) where it is off."""
    if name == "float64" and not jax.config.jax_enable_x64:
        raise ConfigError("--dtype float64 needs JAX's x64 mode, switched on where the program starts, before any JAX "
                          "array: jax.config.update('jax_enable_x64', True)")
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}[name]


def param_dtype_for(dtype: Any) -> Any:
    """Parameters (and the carry) stay float32 under bfloat16 compute, and are float64 under float64."""
    return jnp.promote_types(dtype, jnp.float32)


def matmul_precision(allow_tf32: bool) -> lax.Precision:
    """``--allow-tf32`` → the precision of every matmul: HIGHEST (full float32), or DEFAULT (TF32 on GPUs with it)."""
    return lax.Precision.DEFAULT if allow_tf32 else PRECISION


def dot(a: Array, b: Array, precision: lax.Precision) -> Array:
    """(..., K) @ (K, N) at ``precision``."""
    return jnp.matmul(a, b, precision=precision)


def round_to(x: Array, dtype) -> Array:
    """``x`` rounded to ``dtype``'s precision, in its own dtype (``x`` itself when ``dtype`` is not narrower). Not
    ``x.astype(dtype).astype(x.dtype)``: XLA:CPU, allowing itself excess precision, may drop such a round trip."""
    narrow, own = jnp.finfo(dtype), jnp.finfo(x.dtype)
    if narrow.nmant >= own.nmant:
        return x
    return lax.reduce_precision(x, exponent_bits=narrow.nexp, mantissa_bits=narrow.nmant)


def to_bfloat16(x: Array) -> Array:
    """Rounded to bfloat16, kept in float32 (:func:`round_to`)."""
    return round_to(x, jnp.bfloat16)


def bfloat16_dot(a: Array, b: Array, precision: lax.Precision) -> Array:
    """(..., K) @ (K, N) as autocast's matmuls compute it: both operands rounded to bfloat16, float32 sums."""
    a, b = (to_bfloat16(x).astype(jnp.bfloat16) for x in (a, b))
    return jnp.matmul(a, b, precision=precision, preferred_element_type=jnp.float32)

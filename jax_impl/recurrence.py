"""A fast PyTorch-semantics LSTM for XLA:CPU: pure functions whose recurrences have hand-written gradients.

What is computed is exactly ``torch.nn.LSTM`` (gate order i, f, g, o; two biases)::

    gates_t = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh
    c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)

in the inputs' dtype with every matmul at ``Precision.HIGHEST``; gradients are those of that function
(tests: against ``jax.grad`` of a plain ``lax.scan``, to float32 rounding and to 1e-12 in float64). Only
*how* it is computed differs from a plain scan of a cell, for speed on a small CPU (measurements and the
levers that did not help: ``benchmarks/PERFORMANCE.md``):

* Time-major: ``x`` is (T, B, D) and outputs are (T, B, H), so each step reads one contiguous (B, ·) slab
  (an embedding lookup gives time-major input for free: ``table[tokens.T]``).
* The input projection of all T steps is one large 2-D matmul outside the loop, so JAX derives its
  gradients (``dW_ih``, ``dx``, the biases') as large matmuls too.
* ``jax.custom_vjp`` around the recurrence: the backward loop does one (B, 4H)·(4H, ·) matmul per step and
  stores the gate gradients; ``dW_hh`` is then one (4H, T·B)·(T·B, H) matmul.
* Two layers run as a wavefront: one loop whose step advances layer 0 to time k and layer 1
  to time k-1 (layer 1's two matmuls as one, ``[u, h1] @ [W_ih; W_hh]^T``), so the forward and the
  backward each take T sequential steps instead of 2T.
* :func:`embedding_lstm_stack`, the entry point, folds the embedding into layer 0's input projection when
  the vocabulary is smaller than the batch's token count: ``(table W_ih^T)[tokens]`` equals ``table[tokens] W_ih^T`` and
  costs V·E·4H instead of T·B·E·4H multiply-adds, likewise in the backward. Without a gradient the rows
  are gathered step by step, so the (T, B, 4H) projection is never stored.
* Shapes chosen for what XLA:CPU vectorises: the four activations are one elementwise pass over the
  (B, 4H) block (``_activate``), and the backward reads each gate block with its own dynamic slice
  (``_gate_rows``); the usual split-per-gate forms of both compile to scalar code inside the loop.
* Little scratch memory, because every fresh page a step touches costs a page fault (roughly 0.5–1 ms
  per MB per step on the machine measured): the activated gates overwrite the input
  projection in place, tanh(c) is recomputed in the backward instead of stored, and the loop buffers are
  created so that XLA neither transposes nor copies them (``_weight_grad``, ``_scratch``).

Masked variable-length mode (``lengths``): at time steps ``t >= lengths[b]`` row b's carry stops changing
and its output is zero (``pack_padded_sequence`` / ``pad_packed_sequence``), so the final carry is each
row's state at its last token.
"""
from __future__ import annotations

from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array
LayerCarry = tuple[Array, Array]  # (h, c), each (B, H)
LayerWeights = tuple[Array, Array, Array, Array]  # (w_ih (4H, D), w_hh (4H, H), b_ih (4H,), b_hh (4H,))
PRECISION = lax.Precision.HIGHEST
UNROLL = 2  # time steps per loop iteration (2: measured 4 % faster training, 14 % faster inference than 1)


# --------------------------------------------------------------------------------------------------------
# Shared pieces: one cell step forward and backward on a (B, 4H) gate block.
# --------------------------------------------------------------------------------------------------------

def _dot(a: Array, b: Array) -> Array:
    """(..., K) @ (K, N) at full precision."""
    return jnp.matmul(a, b, precision=PRECISION)


def _project(x: Array, w_ih: Array, b_ih: Array, b_hh: Array) -> Array:
    """Every step's input projection at once: x (T, B, D) → x W_ih^T + b_ih + b_hh (T, B, 4H).

    As a 2-D (T·B, D) matmul: then its gradients are 2-D matmuls too, which XLA:CPU runs on transposed
    operands in place, where the 3-D form makes it copy both operands into a transposed layout first.
    """
    steps, batch, _ = x.shape
    return (_dot(x.reshape(steps * batch, -1), w_ih.T) + (b_ih + b_hh)).reshape(steps, batch, -1)


def _weight_grad(dz: Array, inputs: Array) -> Array:
    """Σ_t dz_t^T inputs_t as one (4H, T·B)·(T·B, D) matmul: dz (T, B, 4H), inputs (T, B, D) → (4H, D).
    (2-D for the reason given in ``_project``.)"""
    return _dot(dz.reshape(-1, dz.shape[-1]).T, inputs.reshape(-1, inputs.shape[-1]))


def _is_g_column(shape: tuple[int, ...]) -> Array:
    """Bool mask of the cell-candidate (g) columns of a (B, 4H) gate block."""
    hidden = shape[-1] // 4
    col = lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)
    return (col >= 2 * hidden) & (col < 3 * hidden)


def _activate(z: Array) -> Array:
    """Pre-activations (B, 4H) → ``[σ(i), σ(f), tanh(g), σ(o)]`` (B, 4H), one elementwise pass.

    σ(x) = (1 + tanh(x/2)) / 2 exactly, so one tanh per element serves every gate (half the transcendental
    work of evaluating both σ and tanh everywhere and selecting).
    """
    is_g = _is_g_column(z.shape)
    t = jnp.tanh(jnp.where(is_g, z, 0.5 * z))
    return jnp.where(is_g, t, 0.5 * t + 0.5)


def _split_gates(a: Array) -> tuple[Array, Array, Array, Array]:
    """(B, 4H) → its (i, f, g, o) blocks, each (B, H)."""
    hidden = a.shape[-1] // 4
    return tuple(a[:, k * hidden:(k + 1) * hidden] for k in range(4))


def _cell(a: Array, c: Array) -> tuple[Array, Array]:
    """Activated gates (B, 4H) and c_{t-1} (B, H) → (h_t, c_t), each (B, H)."""
    i, f, g, o = _split_gates(a)
    c_new = f * c + i * g
    return o * jnp.tanh(c_new), c_new


def _cell_backward(a: Array, gates: tuple[Array, Array, Array, Array], c_prev: Array, c: Array, dh: Array,
                   dc: Array) -> tuple[Array, Array]:
    """One step's gradients: (dL/dh_t, dL/dc_t) → (dL/dgates_t (B, 4H) pre-activation, dL/dc_{t-1}).

    ``a`` the step's activated gates (B, 4H) and the same as four (B, H) blocks ``gates`` (see
    ``_gate_rows``); ``c_prev``/``c`` the cell state before/after the step.
    """
    i, f, g, o = gates
    tanh_c = jnp.tanh(c)
    dc_total = dc + dh * o * (1 - tanh_c * tanh_c)
    upstream = jnp.concatenate([dc_total * g, dc_total * c_prev, dc_total * i, dh * tanh_c], axis=-1)
    slope = jnp.where(_is_g_column(a.shape), 1 - a * a, a * (1 - a))  # tanh' on g, σ' elsewhere
    return upstream * slope, dc_total * f


def _gate_rows(buffer: Array, k: Array) -> tuple[Array, tuple[Array, Array, Array, Array]]:
    """Row k of a (T, B, 4H) gate buffer, whole and as its four (B, H) gate blocks.

    Each block is read by its own dynamic slice of a (T, B, 4, H) view rather than sliced out of the
    row: XLA:CPU compiles a column slice of a dynamically indexed row into scalar code, a direct slice
    into vector code.
    """
    steps, batch, width = buffer.shape
    view = buffer.reshape(steps, batch, 4, width // 4)
    blocks = tuple(lax.dynamic_slice(view, (k, 0, j, 0), (1, batch, 1, width // 4)).reshape(batch, width // 4)
                   for j in range(4))
    return _row(buffer, k), blocks


def _keep_where(mask: Array | None, new: Array, old: Array) -> Array:
    """``new`` where ``mask`` (B, 1) is set, else ``old`` (masked variable-length mode); ``new`` if no mask."""
    return new if mask is None else jnp.where(mask, new, old)


def _time_mask(lengths: Array | None, steps: int) -> Array | None:
    """lengths (B,) → bool (T, B, 1): step t of row b is real iff t < lengths[b]."""
    if lengths is None:
        return None
    return (jnp.arange(steps)[:, None] < lengths[None, :])[:, :, None]


def _row(array: Array | None, index: Array) -> Array | None:
    """array[index] along the leading (time) axis, index clamped to [0, T-1]; None stays None."""
    return None if array is None else lax.dynamic_index_in_dim(array, index, keepdims=False)


def _scratch(like: Array, rows: int, width: int, tag: int) -> Array:
    """A (rows, B, width) buffer that a loop fills row by row (its initial values are never read).

    Each buffer gets its own fill value ``tag``: XLA merges identical zero-filled buffers into one and then
    copies it for every loop that writes into it (tens of MB per step); distinct fills keep them apart.
    """
    return jnp.full((rows, like.shape[-2], width), tag, like.dtype)


def _put(buffers: tuple[Array, ...], k: Array, rows: tuple[Array, ...]) -> tuple[Array, ...]:
    """Write rows[i] (B, ·) into buffers[i] at time index k."""
    return tuple(lax.dynamic_update_index_in_dim(b, r, k, 0) for b, r in zip(buffers, rows))


def _c_before(c_rows: Array, c_init: Array, k: Array) -> Array:
    """The cell state before step k: c_rows[k-1], or the initial state at k = 0."""
    return jnp.where(k == 0, c_init, _row(c_rows, jnp.maximum(k - 1, 0)))


# --------------------------------------------------------------------------------------------------------
# One layer's recurrence, given its input projection.
# --------------------------------------------------------------------------------------------------------

def _recurrence_forward(gates_x, w_hh, h0, c0, mask):
    """gates_x (T, B, 4H) with both biases → ((outputs (T, B, H), (h_T, c_T)), residuals)."""
    w_hh_t = w_hh.T  # (H, 4H)
    steps, hidden = gates_x.shape[0], w_hh.shape[1]
    # Rows written by the loop: the output, h before the step, c after it.
    buffers = tuple(_scratch(gates_x, steps, hidden, tag) for tag in (1, 2, 3))

    def step(carry, inputs):
        gates, buffers, h, c = carry
        k, m = inputs
        a = _activate(_row(gates, k) + _dot(h, w_hh_t))
        h_new, c_new = _cell(a, c)
        h_new, c_new = _keep_where(m, h_new, h), _keep_where(m, c_new, c)
        y = h_new if m is None else jnp.where(m, h_new, 0)
        gates = lax.dynamic_update_index_in_dim(gates, a, k, 0)  # the activations replace the projection
        return (gates, _put(buffers, k, (y, h, c_new)), h_new, c_new), None

    (a, (ys, h_prev, c_rows), h_t, c_t), _ = lax.scan(
        step, (gates_x, buffers, h0, c0), (jnp.arange(steps), mask), unroll=UNROLL)
    return (ys, (h_t, c_t)), (w_hh, c0, a, h_prev, c_rows, mask)


def _recurrence_backward(residuals, cotangents):
    w_hh, c0, a, h_prev, c_rows, mask = residuals
    d_ys, (dh, dc) = cotangents

    def step(carry, inputs):
        dh, dc = carry
        k, dy, m = inputs
        dh_in = dh + (dy if m is None else jnp.where(m, dy, 0))
        dz, dc_prev = _cell_backward(*_gate_rows(a, k), _c_before(c_rows, c0, k), _row(c_rows, k), dh_in, dc)
        if m is not None:
            dz = jnp.where(m, dz, 0)
        dh_prev = _keep_where(m, _dot(dz, w_hh), dh_in)  # the one matmul per step: (B, 4H)·(4H, H)
        return (dh_prev, _keep_where(m, dc_prev, dc)), dz

    (dh0, dc0), dz = lax.scan(step, (dh, dc), (jnp.arange(a.shape[0]), d_ys, mask), reverse=True, unroll=UNROLL)
    d_w_hh = _weight_grad(dz, h_prev)
    return dz, d_w_hh, dh0, dc0, None


@jax.custom_vjp
def _recurrence(gates_x, w_hh, h0, c0, mask):
    return _recurrence_forward(gates_x, w_hh, h0, c0, mask)[0]


_recurrence.defvjp(_recurrence_forward, _recurrence_backward)


# --------------------------------------------------------------------------------------------------------
# Two layers as a wavefront: loop step k advances layer 0 to time k and layer 1 to time k-1.
# --------------------------------------------------------------------------------------------------------

def _source_gates(source) -> Array:
    """Layer 0's input projection (T, B, 4H) from its source: the array itself, or (table_gates (V, 4H),
    tokens (T, B)) whose rows it gathers."""
    if isinstance(source, tuple):
        table_gates, tokens = source
        return jnp.take(table_gates, tokens, axis=0)
    return source


def _source_row(source, k: Array) -> Array:
    """Row k (B, 4H) of layer 0's input projection, without materialising the others."""
    if isinstance(source, tuple):
        table_gates, tokens = source
        return jnp.take(table_gates, _row(tokens, k), axis=0)
    return _row(source, k)


def _wave_forward(source, w_hh0, p1, carry0, carry1, mask, drop, return_outputs, keep_residuals=True):
    """Two stacked layers given layer 0's input projection (both biases included) as ``source``: a
    (T, B, 4H) array, or (table_gates (V, 4H), tokens (T, B)) meaning ``table_gates[tokens]``.

    ``p1`` layer 1's (w_ih, w_hh, b_ih, b_hh); ``mask`` (T, B, 1) bool or None; ``drop`` (T, B, H)-
    broadcastable multiplier of layer 1's input, or None. Loop step k (0..T-1) computes layer 0 at time k
    and layer 1 at time k-1 (nothing at k = 0); layer 1's last step (time T-1) follows the loop. The two
    matmuls of a step are independent: both read the state at the step's start. ``keep_residuals=False``
    (evaluation: no backward follows) stores nothing per step and gathers each step's input rows as needed.
    """
    w_ih1, w_hh1, b_ih1, b_hh1 = p1
    steps = (source[1] if isinstance(source, tuple) else source).shape[0]
    hidden = w_hh0.shape[1]
    w0 = w_hh0.T  # (H, 4H)
    w1 = jnp.concatenate([w_ih1.T, w_hh1.T], axis=0)  # (2H, 4H): [u, h1] @ w1 is both of layer 1's matmuls
    b1 = b_ih1 + b_hh1
    # Row k of prev_mask is mask[k-1] (False at k = 0, when layer 1 has no step yet).
    prev_mask = None if mask is None else jnp.concatenate([jnp.zeros_like(mask[:1]), mask[:-1]])

    def layer1_input(h0, k):
        return h0 if drop is None else h0 * _row(drop, k).astype(h0.dtype)

    if keep_residuals:
        gates0 = _source_gates(source)  # becomes layer 0's activated gates, row by row
        # Rows written by the loop: layer 1's activated gates (row k: time k-1), h0 before step k, c0 after
        # step k, layer 1's matmul input [u, h1] and c1 after its step (both at time k-1).
        buffers = (_scratch(gates0, steps, 4 * hidden, 1), _scratch(gates0, steps, hidden, 2),
                   _scratch(gates0, steps, hidden, 3), _scratch(gates0, steps, 2 * hidden, 4),
                   _scratch(gates0, steps, hidden, 5))
    else:
        gates0, buffers = None, ()
    if return_outputs:  # layer 1's output (row k: time k-1)
        buffers += (_scratch(carry1[0][None], steps, hidden, 6),)

    def step(carry, inputs):
        gates0, buffers, (h0, c0), (h1, c1) = carry
        k, m0, m1 = inputs
        v = jnp.concatenate([layer1_input(h0, jnp.maximum(k - 1, 0)), h1], axis=-1)  # (B, 2H)
        x0 = _row(gates0, k) if keep_residuals else _source_row(source, k)
        a0 = _activate(x0 + _dot(h0, w0))
        a1 = _activate(_dot(v, w1) + b1)
        h0_new, c0_new = _cell(a0, c0)
        h1_new, c1_new = _cell(a1, c1)
        h0_new, c0_new = _keep_where(m0, h0_new, h0), _keep_where(m0, c0_new, c0)
        layer1_runs = (k > 0) if m1 is None else m1
        h1_new, c1_new = jnp.where(layer1_runs, h1_new, h1), jnp.where(layer1_runs, c1_new, c1)
        y1 = h1_new if m1 is None else jnp.where(m1, h1_new, 0)  # layer 1's output at time k-1
        rows = (a1, h0, c0_new, v, c1_new) if keep_residuals else ()
        if keep_residuals:
            gates0 = lax.dynamic_update_index_in_dim(gates0, a0, k, 0)  # activations replace the projection
        buffers = _put(buffers, k, rows + ((y1,) if return_outputs else ()))
        return (gates0, buffers, (h0_new, c0_new), (h1_new, c1_new)), None

    (a0, buffers, (h0_t, c0_t), (h1, c1)), _ = lax.scan(
        step, (gates0, buffers, carry0, carry1), (jnp.arange(steps), mask, prev_mask), unroll=UNROLL)
    # Layer 1 at time T-1.
    m_last = None if mask is None else mask[-1]
    v_last = jnp.concatenate([layer1_input(h0_t, steps - 1), h1], axis=-1)
    a1_last = _activate(_dot(v_last, w1) + b1)
    h1_t, c1_t = _cell(a1_last, c1)
    h1_t, c1_t = _keep_where(m_last, h1_t, h1), _keep_where(m_last, c1_t, c1)
    outputs = None
    if return_outputs:
        y1_last = h1_t if m_last is None else jnp.where(m_last, h1_t, 0)
        outputs = jnp.concatenate([buffers[-1][1:], y1_last[None]])  # (T, B, H), aligned with time
    result = (outputs, ((h0_t, c0_t), (h1_t, c1_t)))
    if not keep_residuals:
        return result, None
    last = (a1_last, v_last, c1, c1_t)
    table = source if isinstance(source, tuple) else None
    residuals = (w_hh0, p1, carry0[1], a0, buffers[0], buffers[1:5], last, mask, prev_mask, drop, table)
    return result, residuals


def _wave_backward(return_outputs, residuals, cotangents):
    w_hh0, (w_ih1, w_hh1, _, _), c0_init, a0, a1, rows, last, mask, prev_mask, drop, table = residuals
    h0_prev, c0_rows, v, c1_rows = rows
    a1_last, v_last, c1_prev_last, c1_last = last
    d_outputs, ((dh0, dc0), (dh1, dc1)) = cotangents
    steps, hidden = a0.shape[0], w_hh0.shape[1]
    w1_back = jnp.concatenate([w_ih1, w_hh1], axis=1)  # (4H, 2H): dz1 @ w1_back = [du, dh1_prev]

    def drop_row(k):
        return None if drop is None else _row(drop, k).astype(a0.dtype)

    # Layer 1 at time T-1 (the forward's last, peeled step).
    m_last = None if mask is None else mask[-1]
    dh1_in = dh1 if d_outputs is None else dh1 + _keep_where(m_last, d_outputs[-1], 0)
    dz1_last, dc1_prev = _cell_backward(a1_last, _split_gates(a1_last), c1_prev_last, c1_last, dh1_in, dc1)
    if m_last is not None:
        dz1_last = jnp.where(m_last, dz1_last, 0)
    back = _dot(dz1_last, w1_back)
    du, dh1_prev = back[:, :hidden], back[:, hidden:]
    dh1 = _keep_where(m_last, dh1_prev, dh1_in)
    dc1 = _keep_where(m_last, dc1_prev, dc1)
    d = drop_row(steps - 1)
    dh0 = dh0 + (du if d is None else du * d)

    def step(carry, inputs):
        grads, dh0, dc0, dh1, dc1 = carry
        k, m0, m1 = inputs
        before = jnp.maximum(k - 1, 0)
        # Layer 0 at time k.
        dz0, dc0_prev = _cell_backward(*_gate_rows(a0, k), _c_before(c0_rows, c0_init, k), _row(c0_rows, k), dh0,
                                       dc0)
        if m0 is not None:
            dz0 = jnp.where(m0, dz0, 0)
        # Layer 1 at time k-1 (no step at k = 0; c1_rows[0] is then layer 1's initial c).
        layer1_ran = (k > 0) if m1 is None else m1
        dy = 0 if d_outputs is None else jnp.where(layer1_ran, _row(d_outputs, before), 0)
        dh1_in = dh1 + dy
        dz1, dc1_prev = _cell_backward(*_gate_rows(a1, k), _row(c1_rows, before), _row(c1_rows, k), dh1_in, dc1)
        dz1 = jnp.where(layer1_ran, dz1, 0)
        back = _dot(dz1, w1_back)  # (B, 2H)
        du, dh1_prev = back[:, :hidden], back[:, hidden:]
        d = drop_row(before)
        dh0_prev = _keep_where(m0, _dot(dz0, w_hh0), dh0) + (du if d is None else du * d)
        return (_put(grads, k, (dz0, dz1)), dh0_prev, _keep_where(m0, dc0_prev, dc0),
                jnp.where(layer1_ran, dh1_prev, dh1_in), jnp.where(layer1_ran, dc1_prev, dc1)), None

    # (Writing the gradients over a0 / a1 in place would save memory, but XLA then copies the whole buffer
    # every step, because one step's kernels read a row's four gates while another writes that row.)
    grads = (_scratch(a0, steps, 4 * hidden, 7), _scratch(a0, steps, 4 * hidden, 8))
    ((dz0, dz1), dh0, dc0, dh1, dc1), _ = lax.scan(
        step, (grads, dh0, dc0, dh1, dc1), (jnp.arange(steps), mask, prev_mask), reverse=True, unroll=UNROLL)
    d_w_hh0 = _weight_grad(dz0, h0_prev)
    # Layer 1: rows hold times -1..T-2 (row 0 is zero), plus the peeled last step.
    d_w1 = _weight_grad(dz1, v) + _dot(dz1_last.T, v_last)  # (4H, 2H) = [dW_ih1 | dW_hh1]
    d_b1 = dz1.sum(axis=(0, 1)) + dz1_last.sum(axis=0)
    d_p1 = (d_w1[:, :hidden], d_w1[:, hidden:], d_b1, d_b1)
    if table is None:
        d_source = dz0
    else:  # the gradient of a gather: every time-step row adds into its token's row
        table_gates, tokens = table
        d_source = (jnp.zeros_like(table_gates).at[tokens].add(dz0), None)
    return d_source, d_w_hh0, d_p1, (dh0, dc0), (dh1, dc1), None, None


@partial(jax.custom_vjp, nondiff_argnums=(7,))
def _wave(source, w_hh0, p1, carry0, carry1, mask, drop, return_outputs):
    return _wave_forward(source, w_hh0, p1, carry0, carry1, mask, drop, return_outputs, keep_residuals=False)[0]


def _wave_fwd(source, w_hh0, p1, carry0, carry1, mask, drop, return_outputs):
    return _wave_forward(source, w_hh0, p1, carry0, carry1, mask, drop, return_outputs)


_wave.defvjp(_wave_fwd, _wave_backward)


# --------------------------------------------------------------------------------------------------------
# Stacks.
# --------------------------------------------------------------------------------------------------------

def _stack_from_gates(source, layer_params, carries, lengths, dropout_masks, return_outputs, wavefront):
    """The stack given layer 0's input projection (both biases included): (T, B, 4H), or
    (table_gates (V, 4H), tokens (T, B)) meaning table_gates[tokens]."""
    if dropout_masks is not None and len(dropout_masks) != len(layer_params) - 1:
        raise ValueError(f"need {len(layer_params) - 1} dropout masks, got {len(dropout_masks)}")
    if dropout_masks is not None:
        dropout_masks = [lax.stop_gradient(m) for m in dropout_masks]  # constants: no gradient flows to them
    steps = (source[1] if isinstance(source, tuple) else source).shape[0]
    mask = _time_mask(lengths, steps)
    if wavefront and len(layer_params) == 2:
        return _wave(source, layer_params[0][1], tuple(layer_params[1]), tuple(carries[0]), tuple(carries[1]),
                     mask, None if dropout_masks is None else dropout_masks[0], return_outputs)
    gates0 = _source_gates(source)
    finals = []
    for k, (params, (h0, c0)) in enumerate(zip(layer_params, carries)):
        if k > 0:
            x = x if dropout_masks is None else x * dropout_masks[k - 1].astype(x.dtype)
            gates0 = _project(x, params[0], params[2], params[3])
        x, final = _recurrence(gates0, params[1], h0, c0, mask)
        finals.append(final)
    return (x if return_outputs else None), tuple(finals)


def embedding_lstm_stack(table: Array, tokens: Array, layer_params: Sequence[LayerWeights],
                         carries: Sequence[LayerCarry], lengths: Array | None = None,
                         dropout_masks: Sequence[Array] | None = None, *, return_outputs: bool = True,
                         wavefront: bool = True) -> tuple[Array | None, tuple[LayerCarry, ...]]:
    """``nn.LSTM(num_layers=L)`` over the embedded tokens ``table[tokens]``, time-major.

    table (V, E) the embedding; tokens (T, B) int (``batch_tokens.T``); ``layer_params[k] = (w_ih, w_hh, b_ih,
    b_hh)`` in PyTorch's layout; ``carries[k] = (h0, c0)`` each (B, H); lengths (B,) int32 or None (masked
    variable-length mode, every layer); ``dropout_masks``: None (no dropout) or L-1 arrays, the k-th
    multiplying the input of layer k+1, each (T, B, H) or broadcastable to it with a leading time axis, holding
    0 or 1/(1-p) (drawn by the caller, so this function is deterministic; no gradient flows to them).
    Returns (top layer outputs (T, B, H), or None when ``return_outputs`` is False; per-layer final carries).
    Two layers run as one wavefront loop (``wavefront=True``), other depths layer by layer.

    When V < T·B, layer 0's input projection is computed as ``(table W_ih^T)[tokens]``: V·E·4H multiply-adds
    instead of T·B·E·4H, and the same saving in the backward (the table's and W_ih's gradients come from the
    (V, 4H) gradient of the projected table). The values are the same sums, associated differently.
    """
    w_ih0, _, b_ih0, b_hh0 = layer_params[0]
    if table.shape[0] < tokens.size:
        source = (_dot(table, w_ih0.T) + (b_ih0 + b_hh0), tokens)  # gathered inside, row by row if it can
    else:
        source = _project(jnp.take(table, tokens, axis=0), w_ih0, b_ih0, b_hh0)
    return _stack_from_gates(source, layer_params, carries, lengths, dropout_masks, return_outputs, wavefront)

"""``fused``: PyTorch's ``nn.LSTM`` for XLA as pure JAX functions whose recurrences have hand-written gradients.

What is computed is exactly ``torch.nn.LSTM`` (gate order i, f, g, o; two biases; weights in PyTorch's layout)::

    gates_t = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh
    c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)

in the inputs' dtype with every matmul at ``precision``; gradients are those of that function (held to ``scan``'s,
values and gradients, in ``jax_impl/tests/test_fused.py``). One layer (:func:`lstm_layer`) is the input projection
as one GEMM, then :func:`_recurrence` (a custom VJP). The classifier's overrides: :func:`embedded_layer` (layer 0
from the projected table, the embedding fold) and :func:`two_layer_stack`, two layers as one wavefront loop,
:func:`_wave` (a custom VJP: forward :func:`_wave_forward`, backward :func:`_wave_backward`). With ``lengths``, from
step ``lengths[b]`` on, row b's carry stops changing (``pack_padded_sequence``). How it is built and why it is fast:
``docs/performance.md``.
"""
from functools import partial
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jax_impl.numerics import PRECISION, Array, Carry, LayerCarry, LayerWeights, dot
from jax_impl.recurrences.interface import Recurrence

UNROLL = 2  # time steps per loop iteration (why 2: docs/performance.md)


# --- Shared pieces: one cell step forward and backward on a (B, 4H) gate block, loop buffers ---------------------

def _project(x: Array, w_ih: Array, b_ih: Array, b_hh: Array, precision: lax.Precision) -> Array:
    """Every step's input projection at once: x (T, B, D) → x W_ih^T + b_ih + b_hh (T, B, 4H), as a 2-D
    (T·B, D) matmul, whose gradients XLA:CPU runs without transposed copies of the operands."""
    steps, batch, _ = x.shape
    return (dot(x.reshape(steps * batch, -1), w_ih.T, precision) + (b_ih + b_hh)).reshape(steps, batch, -1)


def _weight_grad(dz: Array, inputs: Array, precision: lax.Precision) -> Array:
    """Σ_t dz_t^T inputs_t as one 2-D matmul (as in ``_project``): dz (T, B, 4H), inputs (T, B, D) → (4H, D)."""
    return dot(dz.reshape(-1, dz.shape[-1]).T, inputs.reshape(-1, inputs.shape[-1]), precision)


def _is_g_column(shape: tuple[int, ...]) -> Array:
    """Bool mask of the cell-candidate (g) columns of a (B, 4H) gate block."""
    hidden = shape[-1] // 4
    col = lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)
    return (col >= 2 * hidden) & (col < 3 * hidden)


def _keep_where(mask: Array | None, new: Array, old: Array) -> Array:
    """``new`` where ``mask`` (B, 1) is set, else ``old`` (masked variable-length mode); ``new`` if no mask."""
    return new if mask is None else jnp.where(mask, new, old)


def _split_gates(a: Array) -> tuple[Array, Array, Array, Array]:
    """(B, 4H) → its (i, f, g, o) blocks, each (B, H)."""
    hidden = a.shape[-1] // 4
    return tuple(a[:, k * hidden:(k + 1) * hidden] for k in range(4))


def _cell(z: Array, h: Array, c: Array, mask: Array | None) -> tuple[Array, LayerCarry]:
    """One step: pre-activations z (B, 4H) and the carry (h, c), each (B, H) → (activated gates
    ``[σ(i), σ(f), tanh(g), σ(o)]`` (B, 4H), the next carry); rows whose ``mask`` (B, 1) is unset keep (h, c).
    The activations are one elementwise pass over the block (per-gate slices compile to scalar code in the
    loop); σ(x) = (1 + tanh(x/2)) / 2 exactly, so one tanh per element serves every gate."""
    is_g = _is_g_column(z.shape)
    t = jnp.tanh(jnp.where(is_g, z, 0.5 * z))
    a = jnp.where(is_g, t, 0.5 * t + 0.5)
    i, f, g, o = _split_gates(a)
    c_new = f * c + i * g
    return a, (_keep_where(mask, o * jnp.tanh(c_new), h), _keep_where(mask, c_new, c))


def _cell_backward(a: Array, gates: tuple[Array, Array, Array, Array], c_prev: Array, c: Array, dh: Array,
                   dc: Array, mask: Array | None) -> tuple[Array, Array]:
    """One step back: (dL/dh_t, dL/dc_t) → (dL/dz_t (B, 4H), dL/dc_{t-1} (B, H)), z the pre-activations.
    ``a`` the step's activated gates (B, 4H), ``gates`` the same as four (B, H) blocks (see ``_gate_rows``);
    ``c_prev``/``c`` the cell state before/after the step; rows whose ``mask`` is unset get dz = 0 and pass dc
    through unchanged. tanh(c) is recomputed rather than stored."""
    i, f, g, o = gates
    tanh_c = jnp.tanh(c)
    dc_total = dc + dh * o * (1 - tanh_c * tanh_c)
    upstream = jnp.concatenate([dc_total * g, dc_total * c_prev, dc_total * i, dh * tanh_c], axis=-1)
    dz = upstream * jnp.where(_is_g_column(a.shape), 1 - a * a, a * (1 - a))  # tanh' on g, σ' elsewhere
    return _keep_where(mask, dz, 0), _keep_where(mask, dc_total * f, dc)


def _row(array: Array | None, index: Array) -> Array | None:
    """array[index] along the leading (time) axis, index clamped to [0, T-1]; None stays None."""
    return None if array is None else lax.dynamic_index_in_dim(array, index, keepdims=False)


def _dropped(x: Array, drop: Array | None, k: Array) -> Array:
    """x (B, H) times row k of the dropout multiplier ``drop`` ((T, B, H)-broadcastable); x if ``drop`` is None."""
    return x if drop is None else x * _row(drop, k).astype(x.dtype)


def _gate_rows(buffer: Array, k: Array) -> tuple[Array, tuple[Array, Array, Array, Array]]:
    """Row k of a (T, B, 4H) gate buffer, whole and as its four (B, H) gate blocks, each read by its own dynamic
    slice of a (T, B, 4, H) view: column slices of a dynamically indexed row compile to scalar code."""
    steps, batch, width = buffer.shape
    view = buffer.reshape(steps, batch, 4, width // 4)
    blocks = tuple(lax.dynamic_slice(view, (k, 0, j, 0), (1, batch, 1, width // 4)).reshape(batch, width // 4)
                   for j in range(4))
    return _row(buffer, k), blocks


def _scratch(like: Array, rows: int, width: int, tag: int) -> Array:
    """A (rows, B, width) buffer that a loop fills row by row; its fill value ``tag`` is never read, but distinct
    per buffer: XLA merges identical zero-filled buffers into one and then copies it for every loop writing it."""
    return jnp.full((rows, like.shape[-2], width), tag, like.dtype)


def _put(buffers: tuple[Array, ...], k: Array, rows: tuple[Array, ...]) -> tuple[Array, ...]:
    """Write rows[i] (B, ·) into buffers[i] at time index k."""
    return tuple(lax.dynamic_update_index_in_dim(b, r, k, 0) for b, r in zip(buffers, rows))


def _c_before(c_rows: Array, c_init: Array, k: Array) -> Array:
    """The cell state before step k: c_rows[k-1], or the initial state at k = 0."""
    return jnp.where(k == 0, c_init, _row(c_rows, jnp.maximum(k - 1, 0)))


# --- One layer's recurrence, given its input projection (the layer-by-layer path) -------------------------------

class LayerResiduals(NamedTuple):
    """What ``_recurrence_forward`` keeps for ``_recurrence_backward``."""

    w_hh: Array  # (4H, H) the recurrent weights
    c_init: Array  # (B, H) the initial cell state
    gates: Array  # (T, B, 4H) activated gates [σ(i), σ(f), tanh(g), σ(o)] of every step
    h_before: Array  # (T, B, H) h before each step: the recurrent matmul's input
    c_after: Array  # (T, B, H) c after each step
    mask: Array | None  # (T, B, 1) bool, step t of row b is real; None without lengths


def _recurrence_forward(gates_x, w_hh, h0, c0, mask, precision):
    """gates_x (T, B, 4H) with both biases → ((outputs (T, B, H), (h_T, c_T)), residuals)."""
    w_hh_t = w_hh.T  # (H, 4H)
    steps, hidden = gates_x.shape[0], w_hh.shape[1]
    buffers = tuple(_scratch(gates_x, steps, hidden, tag) for tag in (1, 2, 3))  # rows: output, h before, c after

    def step(carry, inputs):
        gates, buffers, h, c = carry
        k, m = inputs
        a, (h_new, c_new) = _cell(_row(gates, k) + dot(h, w_hh_t, precision), h, c, m)
        gates = lax.dynamic_update_index_in_dim(gates, a, k, 0)  # the activations replace the projection in place
        return (gates, _put(buffers, k, (_keep_where(m, h_new, 0), h, c_new)), h_new, c_new), None

    (a, (ys, h_prev, c_rows), h_t, c_t), _ = lax.scan(
        step, (gates_x, buffers, h0, c0), (jnp.arange(steps), mask), unroll=UNROLL)
    return (ys, (h_t, c_t)), LayerResiduals(w_hh=w_hh, c_init=c0, gates=a, h_before=h_prev, c_after=c_rows,
                                            mask=mask)


def _recurrence_backward(precision, r: LayerResiduals, cotangents):
    d_ys, (dh, dc) = cotangents

    def step(carry, inputs):
        dh, dc = carry
        k, dy, m = inputs
        dh_in = dh + _keep_where(m, dy, 0)
        dz, dc_prev = _cell_backward(*_gate_rows(r.gates, k), _c_before(r.c_after, r.c_init, k), _row(r.c_after, k),
                                     dh_in, dc, m)
        # The one matmul per step: (B, 4H)·(4H, H).
        return (_keep_where(m, dot(dz, r.w_hh, precision), dh_in), dc_prev), dz

    (dh0, dc0), dz = lax.scan(step, (dh, dc), (jnp.arange(r.gates.shape[0]), d_ys, r.mask), reverse=True,
                              unroll=UNROLL)
    return dz, _weight_grad(dz, r.h_before, precision), dh0, dc0, None


@partial(jax.custom_vjp, nondiff_argnums=(5,))
def _recurrence(gates_x, w_hh, h0, c0, mask, precision):
    return _recurrence_forward(gates_x, w_hh, h0, c0, mask, precision)[0]


_recurrence.defvjp(_recurrence_forward, _recurrence_backward)


def _mask(lengths: Array | None, steps: int) -> Array | None:
    """Step t of row b is real iff t < lengths[b]: (T, B, 1) bool, or None without lengths."""
    return None if lengths is None else (jnp.arange(steps)[:, None] < lengths[None, :])[:, :, None]


def lstm_layer(xs: Array, weights: LayerWeights, carry: LayerCarry, *, dtype=None,
               precision: lax.Precision = PRECISION, lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """One LSTM layer (:mod:`.interface`), computed in the inputs' dtype: the input projected in one GEMM, then the
    recurrence as an XLA loop with hand-written gradients."""
    w_ih, w_hh, b_ih, b_hh = weights
    ys, final = _recurrence(_project(xs, w_ih, b_ih, b_hh, precision), w_hh, *carry, _mask(lengths, xs.shape[0]),
                            precision)
    return final, ys


def xla_recurrence(source, w_hh: Array, h0: Array, c0: Array, lengths: Array | None,
                   precision: lax.Precision) -> tuple[Array, LayerCarry]:
    """One layer's recurrence as an XLA loop: its input projection with both biases from ``source`` (see
    ``_source_rows``), w_hh (4H, H), h0 and c0 (B, H), lengths (B,) or None → (outputs (T, B, H), (h_T, c_T))."""
    gates_x = _source_rows(source)
    return _recurrence(gates_x, w_hh, h0, c0, _mask(lengths, gates_x.shape[0]), precision)


# --- Two layers as a wavefront: loop step k advances layer 0 to time k and layer 1 to time k-1 -----------------

class WaveResiduals(NamedTuple):
    """What ``_wave_forward`` keeps for ``_wave_backward``. Row k of a (T, ...) field is the loop's step k: layer 0
    at time k, layer 1 at time k-1; layer 1's step at time T-1 follows the loop and is kept in the ``*_last``
    fields."""

    w_hh0: Array  # (4H, H) layer 0's recurrent weights
    w_ih1: Array  # (4H, H) layer 1's input weights
    w_hh1: Array  # (4H, H) layer 1's recurrent weights
    c0_init: Array  # (B, H) layer 0's initial cell state
    gates0: Array  # (T, B, 4H) layer 0's activated gates [σ(i), σ(f), tanh(g), σ(o)] at time k
    gates1: Array  # (T, B, 4H) layer 1's activated gates at time k-1 (row 0 masked off: no step at k = 0)
    h0_before: Array  # (T, B, H) layer 0's h before its step at time k: its recurrent matmul's input
    c0_after: Array  # (T, B, H) layer 0's c after its step at time k
    layer1_inputs: Array  # (T, B, 2H) layer 1's matmul input [dropped-out h0, h1] at time k-1
    c1_after: Array  # (T, B, H) layer 1's c after its step at time k-1 (row 0: its initial c)
    gates1_last: Array  # (B, 4H) layer 1's activated gates at time T-1
    layer1_inputs_last: Array  # (B, 2H) layer 1's matmul input at time T-1
    c1_before_last: Array  # (B, H) layer 1's c before its step at time T-1
    c1_last: Array  # (B, H) layer 1's c after its step at time T-1
    mask: Array | None  # (T, B, 1) bool, step t of row b is real; None without lengths
    prev_mask: Array | None  # (T, B, 1) bool, row k is mask[k-1] (row 0 False); None without lengths
    drop: Array | None  # layer 1's input multiplier, (T, B, H)-broadcastable; None without dropout
    table_source: tuple[Array, Array] | None  # (table_gates (V, 4H), tokens (T, B)) on the table path, else None


def _source_rows(source, k: Array | None = None) -> Array:
    """Layer 0's input projection from its source, a (T, B, 4H) array or (table_gates (V, 4H), tokens (T, B))
    meaning ``table_gates[tokens]``: all of it (T, B, 4H), or only row k (B, 4H) without gathering the others."""
    if isinstance(source, tuple):
        table_gates, tokens = source
        return jnp.take(table_gates, tokens if k is None else _row(tokens, k), axis=0)
    return source if k is None else _row(source, k)


def _wave_forward(source, w_hh0, p1, carry0, carry1, mask, drop, precision, keep_residuals=True):
    """Two stacked layers → (((h0_T, c0_T), (h1_T, c1_T)), residuals). ``source``: layer 0's input projection,
    both biases included (see ``_source_rows``); ``p1`` layer 1's (w_ih, w_hh, b_ih, b_hh); ``mask`` (T, B, 1)
    bool or None; ``drop`` layer 1's input multiplier, (T, B, H)-broadcastable, or None. Step k's two matmuls
    read the state at its start; layer 1's last step (time T-1) follows the loop. ``keep_residuals=False``
    (evaluation: no backward follows) stores nothing per step and gathers each step's input row as needed."""
    w_ih1, w_hh1, b_ih1, b_hh1 = p1
    steps = (source[1] if isinstance(source, tuple) else source).shape[0]
    hidden = w_hh0.shape[1]
    w0 = w_hh0.T  # (H, 4H)
    w1 = jnp.concatenate([w_ih1.T, w_hh1.T], axis=0)  # (2H, 4H): [u, h1] @ w1 is both of layer 1's matmuls
    b1 = b_ih1 + b_hh1
    # Row k of prev_mask is mask[k-1] (False at k = 0, when layer 1 has no step yet).
    prev_mask = None if mask is None else jnp.concatenate([jnp.zeros_like(mask[:1]), mask[:-1]])
    if keep_residuals:
        gates0 = _source_rows(source)  # becomes layer 0's activated gates, row by row
        # Rows written by the loop: layer 1's activated gates (row k: time k-1), h0 before step k, c0 after
        # step k, layer 1's matmul input [u, h1] and c1 after its step (both at time k-1).
        buffers = tuple(_scratch(gates0, steps, width, tag)
                        for tag, width in enumerate((4 * hidden, hidden, hidden, 2 * hidden, hidden), start=1))
    else:
        gates0, buffers = None, ()

    def step(carry, inputs):
        gates0, buffers, (h0, c0), (h1, c1) = carry
        k, m0, m1 = inputs
        v = jnp.concatenate([_dropped(h0, drop, jnp.maximum(k - 1, 0)), h1], axis=-1)  # (B, 2H)
        x0 = _row(gates0, k) if keep_residuals else _source_rows(source, k)
        a0, new0 = _cell(x0 + dot(h0, w0, precision), h0, c0, m0)
        a1, new1 = _cell(dot(v, w1, precision) + b1, h1, c1, (k > 0) if m1 is None else m1)
        if keep_residuals:
            gates0 = lax.dynamic_update_index_in_dim(gates0, a0, k, 0)  # activations replace the projection
            buffers = _put(buffers, k, (a1, h0, new0[1], v, new1[1]))
        return (gates0, buffers, new0, new1), None

    (a0, buffers, final0, (h1, c1)), _ = lax.scan(
        step, (gates0, buffers, carry0, carry1), (jnp.arange(steps), mask, prev_mask), unroll=UNROLL)
    v_last = jnp.concatenate([_dropped(final0[0], drop, steps - 1), h1], axis=-1)  # layer 1 at time T-1
    a1_last, final1 = _cell(dot(v_last, w1, precision) + b1, h1, c1, _row(mask, steps - 1))
    if not keep_residuals:
        return (final0, final1), None
    a1, h0_prev, c0_rows, v, c1_rows = buffers
    return (final0, final1), WaveResiduals(
        w_hh0=w_hh0, w_ih1=w_ih1, w_hh1=w_hh1, c0_init=carry0[1], gates0=a0, gates1=a1, h0_before=h0_prev,
        c0_after=c0_rows, layer1_inputs=v, c1_after=c1_rows, gates1_last=a1_last, layer1_inputs_last=v_last,
        c1_before_last=c1, c1_last=final1[1], mask=mask, prev_mask=prev_mask, drop=drop,
        table_source=source if isinstance(source, tuple) else None)


def _wave_backward(precision, r: WaveResiduals, cotangents):
    (dh0, dc0), (dh1, dc1) = cotangents
    steps = r.gates0.shape[0]
    w1_back = jnp.concatenate([r.w_ih1, r.w_hh1], axis=1)  # (4H, 2H): dz1 @ w1_back = [du, dh1_prev]

    # Layer 1 at time T-1 (the forward's last, peeled step).
    m_last = _row(r.mask, steps - 1)
    dz1_last, dc1 = _cell_backward(r.gates1_last, _split_gates(r.gates1_last), r.c1_before_last, r.c1_last, dh1,
                                   dc1, m_last)
    du, dh1_prev = jnp.split(dot(dz1_last, w1_back, precision), 2, axis=-1)
    dh0, dh1 = dh0 + _dropped(du, r.drop, steps - 1), _keep_where(m_last, dh1_prev, dh1)

    def step(carry, inputs):
        grads, dh0, dc0, dh1, dc1 = carry
        k, m0, m1 = inputs
        before = jnp.maximum(k - 1, 0)
        # Layer 0 at time k; layer 1 at time k-1 (no step at k = 0; c1_rows[0] is then layer 1's initial c).
        dz0, dc0 = _cell_backward(*_gate_rows(r.gates0, k), _c_before(r.c0_after, r.c0_init, k),
                                  _row(r.c0_after, k), dh0, dc0, m0)
        layer1_ran = (k > 0) if m1 is None else m1
        dz1, dc1 = _cell_backward(*_gate_rows(r.gates1, k), _row(r.c1_after, before), _row(r.c1_after, k), dh1,
                                  dc1, layer1_ran)
        du, dh1_prev = jnp.split(dot(dz1, w1_back, precision), 2, axis=-1)
        dh0 = _keep_where(m0, dot(dz0, r.w_hh0, precision), dh0) + _dropped(du, r.drop, before)
        return (_put(grads, k, (dz0, dz1)), dh0, dc0, jnp.where(layer1_ran, dh1_prev, dh1), dc1), None

    # Fresh buffers rather than overwriting a0 / a1 in place: in place, XLA copies the whole buffer every step,
    # because one step's kernels read a row's four gates while another writes that row.
    width = r.gates0.shape[-1]
    grads = (_scratch(r.gates0, steps, width, 7), _scratch(r.gates0, steps, width, 8))
    ((dz0, dz1), dh0, dc0, dh1, dc1), _ = lax.scan(
        step, (grads, dh0, dc0, dh1, dc1), (jnp.arange(steps), r.mask, r.prev_mask), reverse=True, unroll=UNROLL)
    # Layer 1: rows hold times -1..T-2 (row 0 is zero), plus the peeled last step.
    d_w1 = (_weight_grad(dz1, r.layer1_inputs, precision)
            + dot(dz1_last.T, r.layer1_inputs_last, precision))  # (4H, 2H) = [dW_ih1 | dW_hh1]
    d_b1 = dz1.sum(axis=(0, 1)) + dz1_last.sum(axis=0)
    d_p1 = (*jnp.split(d_w1, 2, axis=-1), d_b1, d_b1)
    # On the table path the gradient of a gather: every time-step row adds into its token's row.
    table = r.table_source
    d_source = dz0 if table is None else (jnp.zeros_like(table[0]).at[table[1]].add(dz0), None)
    return d_source, _weight_grad(dz0, r.h0_before, precision), d_p1, (dh0, dc0), (dh1, dc1), None, None


@partial(jax.custom_vjp, nondiff_argnums=(7,))
def _wave(source, w_hh0, p1, carry0, carry1, mask, drop, precision):
    return _wave_forward(source, w_hh0, p1, carry0, carry1, mask, drop, precision, keep_residuals=False)[0]


_wave.defvjp(_wave_forward, _wave_backward)


# --- The classifier's overrides: layer 0 from token ids, two layers as one wavefront -----------------------------

def _layer0_source(table: Array, tokens: Array, weights: LayerWeights, fold: bool, precision: lax.Precision):
    """Layer 0's input projection with both biases (see ``_source_rows``): with ``fold``, the projected table and
    the tokens, ``(table W_ih^T + b)[tokens]`` gathered row by row in the loop (fewer multiply-adds, the same sums
    associated differently); else ``table[tokens] W_ih^T + b`` (T, B, 4H), as in ``nn.LSTM``."""
    w_ih, _, b_ih, b_hh = weights
    if fold:
        return dot(table, w_ih.T, precision) + (b_ih + b_hh), tokens
    return _project(jnp.take(table, tokens, axis=0), w_ih, b_ih, b_hh, precision)


def embedded_layer(table: Array, tokens: Array, weights: LayerWeights, carry: LayerCarry, *, dtype=None,
                   precision: lax.Precision = PRECISION, lengths: Array | None = None) -> tuple[LayerCarry, Array]:
    """Layer 0 over ``table[tokens]`` with the embedding folded: table (V, E), tokens (T, B) → ((h_T, c_T),
    outputs (T, B, H))."""
    ys, final = xla_recurrence(_layer0_source(table, tokens, weights, True, precision), weights[1], *carry, lengths,
                               precision)
    return final, ys


def two_layer_stack(table: Array, tokens: Array, weights: Sequence[LayerWeights], carry: Carry,
                    masks: Sequence[Array] | None, *, fold: bool, dtype=None, precision: lax.Precision = PRECISION,
                    lengths: Array | None = None) -> Carry:
    """Two layers over ``table[tokens]`` as one wavefront loop → both layers' final (h, c). ``masks``: None or the
    one multiplier of layer 1's input, (T, B, H) or broadcastable to it with a leading time axis (a constant: no
    gradient flows to it); ``fold``: layer 0's projection from the projected table (``_layer0_source``)."""
    drop = None if masks is None else lax.stop_gradient(masks[0])
    return _wave(_layer0_source(table, tokens, weights[0], fold, precision), weights[0][1], tuple(weights[1]),
                 tuple(carry[0]), tuple(carry[1]), _mask(lengths, tokens.shape[0]), drop, precision)


RECURRENCE = Recurrence(
    "fused", "XLA's fused LSTM: loops with hand-written gradients, two layers as one wavefront",
    {"lstm": lstm_layer}, dtypes=("float32", "float64"),
    why={"dtype": "it does not implement bfloat16's mixed precision (float32 parameters and carry); use scan or auto"},
    embedded_layer=embedded_layer, two_layer_stack=two_layer_stack)

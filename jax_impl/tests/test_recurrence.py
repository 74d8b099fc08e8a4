"""The fast recurrence (jax_impl.recurrence) computes what a plain lax.scan of PyTorch's LSTM cell computes,
and its hand-written gradients equal jax.grad of that plain scan. The fast stack returns each layer's final
carry (h_T, c_T) only; the per-step outputs of a layer reach it as the next layer's input (and, in masked mode,
the final carry is each row's state at its last token).

Tolerances: in float32 the two differ only by rounding (different association of the same sums, and
σ/tanh evaluated through different but equally accurate formulas), so values and gradients agree to a few
ulps of their scale: we allow 2e-5 relative to each array's largest magnitude. In float64 the same
differences shrink to ~1e-15, so 1e-12 relative catches any real formula error.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jax_impl.recurrence import embedding_lstm_stack

T, B, D, H = 7, 3, 5, 4
PRECISION = lax.Precision.HIGHEST


def lstm_stack(x, layer_params, carries, lengths=None, dropout_masks=None, **options):
    """The fast stack's final carries over a given (T, B, D) input: ``embedding_lstm_stack`` gathering x's own
    rows (a table of T·B rows is not smaller than the token count, so the input projection is the plain one)."""
    steps, batch, width = x.shape
    rows = jnp.arange(steps * batch, dtype=jnp.int32).reshape(steps, batch)
    return embedding_lstm_stack(x.reshape(steps * batch, width), rows, layer_params, carries, lengths,
                                dropout_masks, **options)


def lstm_layer(x, w_ih, w_hh, b_ih, b_hh, h0, c0, lengths=None):
    """One fast layer's (h_T, c_T): a stack of one."""
    (final,) = lstm_stack(x, [(w_ih, w_hh, b_ih, b_hh)], [(h0, c0)], lengths)
    return final


# --- the plain reference: a lax.scan of PyTorch's cell, differentiated by JAX -------------------------------

def reference_layer(x, w_ih, w_hh, b_ih, b_hh, h0, c0, lengths=None):
    """x (T, B, D) → (outputs (T, B, H), (h_T, c_T)); masked mode as pack_padded_sequence."""
    mask = None if lengths is None else (jnp.arange(x.shape[0])[:, None] < lengths[None, :])[:, :, None]

    def step(carry, inputs):
        h, c = carry
        x_t, m = inputs
        gates = (jnp.matmul(x_t, w_ih.T, precision=PRECISION) + b_ih
                 + jnp.matmul(h, w_hh.T, precision=PRECISION) + b_hh)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
        if m is None:
            return (h_new, c_new), h_new
        return (jnp.where(m, h_new, h), jnp.where(m, c_new, c)), jnp.where(m, h_new, 0)

    (h_t, c_t), ys = lax.scan(step, (h0, c0), (x, mask))
    return ys, (h_t, c_t)


def reference_stack(x, layer_params, carries, lengths=None, dropout_masks=None):
    """Each layer's final (h_T, c_T), the outputs of one layer being the input of the next."""
    finals = []
    for k, (params, (h0, c0)) in enumerate(zip(layer_params, carries)):
        if k > 0 and dropout_masks is not None:
            x = x * dropout_masks[k - 1]
        x, final = reference_layer(x, *params, h0, c0, lengths)
        finals.append(final)
    return tuple(finals)


# --- fixtures built in code ---------------------------------------------------------------------------------

def _layer_args(seed, dtype, d_in=D):
    rng = np.random.default_rng(seed)
    bound = 1 / np.sqrt(H)
    u = lambda *shape: jnp.asarray(rng.uniform(-bound, bound, shape), dtype)  # noqa: E731
    x = jnp.asarray(rng.standard_normal((T, B, d_in)), dtype)
    h0 = jnp.asarray(0.5 * rng.standard_normal((B, H)), dtype)  # a nonzero initial carry
    c0 = jnp.asarray(0.5 * rng.standard_normal((B, H)), dtype)
    return x, u(4 * H, d_in), u(4 * H, H), u(4 * H), u(4 * H), h0, c0


LENGTHS = np.array([T, 1, 4], np.int32)  # full, a single token, and a middle length


def _loss_of_final_carry(fn, seed, dtype):
    """A scalar touching the whole final carry: Σ w·h_T + Σ w·c_T with fixed random weights, so the
    cotangents of h_T and c_T are nonzero and distinct."""
    rng = np.random.default_rng(seed + 100)
    wh, wc = (jnp.asarray(rng.standard_normal((B, H)), dtype) for _ in range(2))

    def loss(*args):
        h_t, c_t = fn(*args)
        return jnp.sum(wh * h_t) + jnp.sum(wc * c_t)
    return loss


def _assert_close(actual, expected, rel):
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape
        scale = max(float(np.abs(e).max()), 1e-30)
        assert float(np.abs(a - e).max()) <= rel * scale, (float(np.abs(a - e).max()), scale)


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


# --- one layer ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "masked"])
def test_layer_final_carry_equals_the_plain_scan_in_float32(lengths):
    args = _layer_args(0, jnp.float32)
    lens = None if lengths is None else jnp.asarray(lengths)
    _assert_close(jax.jit(lstm_layer)(*args, lens), reference_layer(*args, lens)[1], rel=2e-5)


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "masked"])
def test_layer_gradients_equal_jax_grad_of_the_plain_scan_in_float32(lengths):
    args = _layer_args(1, jnp.float32)
    lens = None if lengths is None else jnp.asarray(lengths)
    argnums = tuple(range(7))  # x, w_ih, w_hh, b_ih, b_hh, h0, c0
    fast = jax.jit(jax.grad(_loss_of_final_carry(lambda *a: lstm_layer(*a, lens), 1, jnp.float32), argnums))
    slow = jax.grad(_loss_of_final_carry(lambda *a: reference_layer(*a, lens)[1], 1, jnp.float32), argnums)
    _assert_close(fast(*args), slow(*args), rel=2e-5)


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "masked"])
def test_layer_gradients_equal_jax_grad_of_the_plain_scan_in_float64(float64, lengths):
    args = _layer_args(2, jnp.float64)
    lens = None if lengths is None else jnp.asarray(lengths)
    argnums = tuple(range(7))
    fast = jax.jit(jax.grad(_loss_of_final_carry(lambda *a: lstm_layer(*a, lens), 2, jnp.float64), argnums))
    slow = jax.grad(_loss_of_final_carry(lambda *a: reference_layer(*a, lens)[1], 2, jnp.float64), argnums)
    grads = fast(*args)
    assert all(g.dtype == jnp.float64 for g in grads)
    _assert_close(grads, slow(*args), rel=1e-12)


def test_masked_layer_final_carry_is_each_rows_state_at_its_last_token():
    """Row b's (h_T, c_T) with lengths equals the unmasked run over its first lengths[b] steps only."""
    x, *params = _layer_args(3, jnp.float32)
    h_t, c_t = lstm_layer(x, *params, jnp.asarray(LENGTHS))
    for b, n in enumerate(LENGTHS):
        _, (h_ref, c_ref) = reference_layer(x[:n, b:b + 1], *params[:4], params[4][b:b + 1], params[5][b:b + 1])
        np.testing.assert_allclose(h_t[b], h_ref[0], rtol=0, atol=2e-6)
        np.testing.assert_allclose(c_t[b], c_ref[0], rtol=0, atol=2e-6)


# --- stacks with dropout between the layers --------------------------------------------------------------

def _stack_args(seed, dtype, layers=2):
    """x, per-layer params and carries, and layers-1 inverted-dropout masks (p = 0.5), each (T, B, H)."""
    x, *p0 = _layer_args(seed, dtype)
    upper = [_layer_args(seed + k, dtype, d_in=H)[1:] for k in range(1, layers)]
    params = [tuple(p0[:4])] + [tuple(p[:4]) for p in upper]
    carries = [tuple(p0[4:])] + [tuple(p[4:]) for p in upper]
    rng = np.random.default_rng(seed + layers)
    masks = [jnp.asarray((rng.random((T, B, H)) >= 0.5) / 0.5, dtype) for _ in range(layers - 1)]
    return x, params, carries, masks


def _stack_loss(fn, seed, dtype, lengths, masks):
    """Like _loss_of_final_carry for a stack of up to 3 layers: touches every layer's final (h, c)."""
    rng = np.random.default_rng(seed + 100)
    wf = [jnp.asarray(rng.standard_normal((B, H)), dtype) for _ in range(6)]

    def loss(x, params, carries):
        flat = [v for pair in fn(x, params, carries, lengths, masks) for v in pair]
        return sum(jnp.sum(w * v) for w, v in zip(wf, flat))
    return loss


WAVEFRONT = pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layerwise"])


@WAVEFRONT
@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "masked"])
def test_stack_final_carries_equal_the_plain_scan_in_float32(lengths, wavefront):
    """Without a gradient (the wavefront then stores nothing per step), with dropout."""
    x, params, carries, masks = _stack_args(3, jnp.float32)
    lens = None if lengths is None else jnp.asarray(lengths)
    got = jax.jit(partial(lstm_stack, wavefront=wavefront))(x, params, carries, lens, masks)
    _assert_close(got, reference_stack(x, params, carries, lens, masks), rel=2e-5)


@WAVEFRONT
@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "masked"])
@pytest.mark.parametrize("dropout", [False, True], ids=["eval", "dropout"])
def test_stack_gradients_equal_jax_grad_of_the_plain_scan_in_float32(lengths, dropout, wavefront):
    x, params, carries, masks = _stack_args(4, jnp.float32)
    lens = None if lengths is None else jnp.asarray(lengths)
    masks = masks if dropout else None
    argnums = (0, 1, 2)
    stack = partial(lstm_stack, wavefront=wavefront)
    fast = jax.jit(jax.value_and_grad(_stack_loss(stack, 4, jnp.float32, lens, masks), argnums))
    slow = jax.value_and_grad(_stack_loss(reference_stack, 4, jnp.float32, lens, masks), argnums)
    _assert_close(fast(x, params, carries), slow(x, params, carries), rel=2e-5)


@WAVEFRONT
@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "masked"])
def test_stack_gradients_equal_jax_grad_of_the_plain_scan_in_float64(float64, lengths, wavefront):
    x, params, carries, masks = _stack_args(5, jnp.float64)
    lens = None if lengths is None else jnp.asarray(lengths)
    argnums = (0, 1, 2)
    stack = partial(lstm_stack, wavefront=wavefront)
    fast = jax.jit(jax.value_and_grad(_stack_loss(stack, 5, jnp.float64, lens, masks), argnums))
    slow = jax.value_and_grad(_stack_loss(reference_stack, 5, jnp.float64, lens, masks), argnums)
    _assert_close(fast(x, params, carries), slow(x, params, carries), rel=1e-12)


def test_three_layer_stack_final_carries_and_gradients_equal_the_plain_scan_in_float32():
    """Depths other than 2 run layer by layer: each layer's outputs, dropped out, feed the next."""
    x, params, carries, masks = _stack_args(12, jnp.float32, layers=3)
    lens = jnp.asarray(LENGTHS)
    argnums = (0, 1, 2)
    fast = (jax.jit(lstm_stack)(x, params, carries, lens, masks),
            jax.jit(jax.grad(_stack_loss(lstm_stack, 12, jnp.float32, lens, masks), argnums))(x, params, carries))
    slow = (reference_stack(x, params, carries, lens, masks),
            jax.grad(_stack_loss(reference_stack, 12, jnp.float32, lens, masks), argnums)(x, params, carries))
    _assert_close(fast, slow, rel=2e-5)


def test_wavefront_and_layer_by_layer_give_the_same_final_carries_and_gradients():
    """The wavefront is the two-layer stack evaluated in another order: the same sums, associated differently."""
    x, params, carries, masks = _stack_args(8, jnp.float32)
    lens = jnp.asarray(LENGTHS)

    def run(wavefront):
        loss = _stack_loss(partial(lstm_stack, wavefront=wavefront), 8, jnp.float32, lens, masks)
        return jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(x, params, carries)

    _assert_close(run(True), run(False), rel=1e-6)


# --- the embedding folded into layer 0, and edge cases ------------------------------------------------------

@pytest.mark.parametrize("vocab", [6, 40], ids=["projected-table", "projected-rows"])  # V < T·B = 21, V > T·B
def test_embedding_stack_gradients_equal_jax_grad_of_the_plain_scan_in_float32(vocab):
    """The table path ((table W^T)[tokens]) and the row path (table[tokens] W^T) both give the plain scan's
    loss and gradients, the table's included (repeated tokens accumulate)."""
    _, params, carries, masks = _stack_args(6, jnp.float32)
    rng = np.random.default_rng(7)
    table = jnp.asarray(rng.standard_normal((vocab, D)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, vocab, (T, B)), jnp.int32)
    lens = jnp.asarray(LENGTHS)

    # _stack_loss's first argument is here the table
    fast = _stack_loss(lambda t, *rest: embedding_lstm_stack(t, tokens, *rest), 6, jnp.float32, lens, masks)
    slow = _stack_loss(lambda t, *rest: reference_stack(jnp.take(t, tokens, axis=0), *rest), 6, jnp.float32,
                       lens, masks)
    argnums = (0, 1, 2)
    _assert_close(jax.jit(jax.value_and_grad(fast, argnums))(table, params, carries),
                  jax.value_and_grad(slow, argnums)(table, params, carries), rel=2e-5)


@pytest.mark.parametrize("vocab", [6, 40], ids=["projected-table", "projected-rows"])
def test_embedding_stack_evaluation_equals_the_plain_scan(vocab):
    """Without a gradient the table path gathers each step's rows inside the loop: same values."""
    _, params, carries, _ = _stack_args(10, jnp.float32)
    rng = np.random.default_rng(11)
    table = jnp.asarray(rng.standard_normal((vocab, D)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, vocab, (T, B)), jnp.int32)
    lens = jnp.asarray(LENGTHS)
    got = jax.jit(embedding_lstm_stack)(table, tokens, params, carries, lens)
    _assert_close(got, reference_stack(jnp.take(table, tokens, axis=0), params, carries, lens), rel=2e-5)


def test_single_step_sequence_matches_the_plain_scan():
    """T = 1: the wavefront loop runs once with layer 1 only in its final step."""
    x, params, carries, masks = _stack_args(9, jnp.float32)
    x, masks = x[:1], [m[:1] for m in masks]
    got = jax.jit(lstm_stack)(x, params, carries, None, masks)
    _assert_close(got, reference_stack(x, params, carries, None, masks), rel=2e-5)

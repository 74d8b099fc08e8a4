"""The fused recurrence (jax_impl.recurrences.fused), run as the classifier runs it (RNNStack from token ids: the
two-layer wavefront, the embedding fold, layer by layer), computes what the reference, ``scan`` (Flax ``nn.RNN`` over
PyTorch's cell), computes, and its hand-written gradients equal jax.grad of the reference. Both get the same embedding
table and tokens (T, B), weights, carries and dropout masks (drawn from one key); both return each layer's final carry
(h_T, c_T) only (and, in masked mode, each row's state at its last token).

Tolerances: in float32 the two differ only by rounding (different association of the same sums, and
σ/tanh evaluated through different but equally accurate formulas), so values and gradients agree to a few
ulps of their scale: we allow 2e-5 relative to each array's largest magnitude. In float64 the same
differences shrink to ~1e-15, so 1e-12 relative catches any real formula error.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jax_impl.recurrences.choice import REGISTRY
from jax_impl.recurrences.stack import final_carries

T, B, D, H = 7, 3, 5, 4
PRECISION = lax.Precision.HIGHEST
TOLERANCE = {"float32": 2e-5, "float64": 1e-12}  # relative to each array's largest magnitude (module docstring)
LENGTHS = np.array([T, 1, 4], np.int32)  # full, a single token, and a middle length
DROPOUT_KEY = jax.random.key(11)


def stack_of(impl: str, *, wavefront: bool = True, embed_fold: bool = True, dtype=None):
    """``impl``'s stack as the classifier runs it: ``(table, tokens (T, B), weights, carries, lengths=None,
    masks=None) → the final carries``, ``masks`` None or True (dropout 0.5 between layers, drawn from one key, the
    same masks whatever runs). ``wavefront=False``: the implementation without its two-layer override."""
    def run(table, tokens, weights, carries, lengths=None, masks=None):
        recurrence = REGISTRY[impl] if wavefront else dataclasses.replace(REGISTRY[impl], two_layer_stack=None)
        return final_carries(recurrence, table, tokens, weights, carries, lengths,
                             None if masks is None else DROPOUT_KEY, dtype=dtype or table.dtype,
                             param_dtype=table.dtype, precision=PRECISION, embed_fold=embed_fold)
    return run


reference_stack = stack_of("scan")
fused_stack = stack_of("fused")


# --- fixtures built in code ---------------------------------------------------------------------------------

def _layer_weights(rng, dtype, d_in):
    """(w_ih (4H, d_in), w_hh (4H, H), b_ih (4H,), b_hh (4H,)) ~ U(-1/√H, 1/√H), as PyTorch initialises them."""
    bound = 1 / np.sqrt(H)
    shapes = ((4 * H, d_in), (4 * H, H), (4 * H,), (4 * H,))
    return tuple(jnp.asarray(rng.uniform(-bound, bound, shape), dtype) for shape in shapes)


def _stack_args(seed, dtype, layers=2):
    """(table (T·B, D), tokens (T, B), per-layer weights, per-layer carries, True: dropout between the layers, see
    :func:`stack_of`). Every token is distinct, so table[tokens] is an arbitrary (T, B, D) input and the
    fused stack keeps the plain input projection (its table is not smaller than the token count)."""
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.standard_normal((T * B, D)), dtype)
    tokens = jnp.arange(T * B, dtype=jnp.int32).reshape(T, B)
    weights = [_layer_weights(rng, dtype, D if k == 0 else H) for k in range(layers)]
    # A nonzero initial carry.
    carries = [tuple(jnp.asarray(0.5 * rng.standard_normal((B, H)), dtype) for _ in range(2)) for _ in range(layers)]
    return table, tokens, weights, carries, True


def _stack_loss(stack, seed, dtype, tokens, lengths, masks, layers):
    """(table, weights, carries) → (a scalar touching every layer's final (h, c), those final carries): Σ w·v
    with fixed random w per array, so the cotangents of every h_T and c_T are nonzero and distinct."""
    rng = np.random.default_rng(seed + 100)
    wf = [jnp.asarray(rng.standard_normal((B, H)), dtype) for _ in range(2 * layers)]

    def loss(table, weights, carries):
        finals = stack(table, tokens, weights, carries, lengths, masks)
        return sum(jnp.sum(w * v) for w, v in zip(wf, (v for pair in finals for v in pair))), finals
    return loss


def assert_stack_matches_reference(stack, layers, lengths, rel):
    """``stack``'s loss, final carries and gradients (jitted) equal the reference's to ``rel``, on the fixtures of
    :func:`_stack_args` (seed 0) with their dropout masks, ``lengths`` (B,) or None."""
    table, tokens, weights, carries, masks = _stack_args(0, jnp.float32, layers)
    loss, reference = (_stack_loss(s, 0, jnp.float32, tokens, lengths, masks if layers > 1 else None, layers)
                       for s in (stack, reference_stack))
    (value, finals), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
        table, weights, carries)
    (value_r, finals_r), grads_r = jax.value_and_grad(reference, argnums=(0, 1, 2), has_aux=True)(
        table, weights, carries)
    _assert_close(finals, finals_r, rel)
    _assert_close(grads, grads_r, rel)
    assert abs(float(value) - float(value_r)) <= rel * abs(float(value_r))


def _assert_close(actual, expected, rel):
    """Every leaf agrees to ``rel`` times the expected leaf's largest magnitude."""
    actual, expected = jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, a.dtype, e.shape, e.dtype)
        # A scalar is a loss, a sum of O(1) terms that may cancel: its rounding is relative to the terms.
        scale = max(float(np.abs(e).max()), 1.0 if e.ndim == 0 else 1e-30)
        assert float(np.abs(a - e).max()) <= rel * scale, (float(np.abs(a - e).max()), scale)


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    """The test in float32 and in float64 (x64 enabled for the test's duration)."""
    with jax.enable_x64(request.param == "float64"):
        yield jnp.dtype(request.param)


def _stacks(dtype, dropout_variants):
    """(dtype, layers, wavefront, dropout) cases: 1 layer (no dropout between layers), 2 layers as the wavefront
    and layer by layer, 3 layers (always layer by layer)."""
    cases = []
    for layers, wavefront, name in ((1, True, "1-layer"), (2, True, "2-layer-wavefront"),
                                    (2, False, "2-layer-layerwise"), (3, True, "3-layer")):
        for dropout in (False,) if layers == 1 else dropout_variants:
            case_id = f"{dtype}-{name}-{'dropout' if dropout else 'no-dropout'}"
            cases.append(pytest.param(dtype, layers, wavefront, dropout, id=case_id))
    return cases


LENGTH_MODES = pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "masked"])
# float32 runs every case with and without dropout; float64, there to catch formula errors that float32's rounding
# could hide, runs the dropout cases only (their formulas are the no-dropout ones with the masks multiplied in),
# as each case compiles the fused gradient, seconds on XLA:CPU.
GRADIENT_CASES = pytest.mark.parametrize("dtype, layers, wavefront, dropout",
                                         _stacks("float32", (False, True)) + _stacks("float64", (True,)),
                                         indirect=["dtype"])


# --- the fused stack against the reference -------------------------------------------------------------------

@LENGTH_MODES
@GRADIENT_CASES
def test_final_carries_and_gradients_equal_jax_grad_of_the_reference(dtype, lengths, layers, wavefront, dropout):
    """Differentiated: every layer's final (h, c), the loss, and its gradients w.r.t. the table (the inputs),
    every weight and every initial carry."""
    table, tokens, weights, carries, masks = _stack_args(4, dtype, layers)
    lens = None if lengths is None else jnp.asarray(lengths)
    masks = masks if dropout else None
    fused = stack_of("fused", wavefront=wavefront)
    got, expected = (jax.jit(jax.value_and_grad(_stack_loss(stack, 4, dtype, tokens, lens, masks, layers),
                                                (0, 1, 2), has_aux=True))(table, weights, carries)
                     for stack in (fused, reference_stack))
    assert all(leaf.dtype == dtype for leaf in jax.tree_util.tree_leaves(got))
    _assert_close(got, expected, TOLERANCE[dtype.name])


@LENGTH_MODES
@pytest.mark.parametrize("dropout", [False, True], ids=["no-dropout", "dropout"])
def test_wavefront_evaluation_final_carries_equal_the_reference(dtype, lengths, dropout):
    """Without a gradient the wavefront stores nothing per step, a forward of its own; layer by layer, the
    forward is the same with or without a gradient, which the test above checks."""
    table, tokens, weights, carries, masks = _stack_args(3, dtype)
    lens = None if lengths is None else jnp.asarray(lengths)
    masks = masks if dropout else None
    got = jax.jit(fused_stack)(table, tokens, weights, carries, lens, masks)
    _assert_close(got, jax.jit(reference_stack)(table, tokens, weights, carries, lens, masks), TOLERANCE[dtype.name])


def test_masked_final_carry_is_each_rows_state_at_its_last_token():
    """Row b's (h_T, c_T) with lengths equals the reference's unmasked run over its first lengths[b] tokens only.
    h and c are O(1) here, so 2e-6 absolute is ~16 float32 ulps: rounding, not a step too many or too few."""
    table, tokens, weights, carries, _ = _stack_args(3, jnp.float32, layers=1)
    ((h_t, c_t),) = fused_stack(table, tokens, weights, carries, jnp.asarray(LENGTHS))
    for b, n in enumerate(LENGTHS):
        ((h_ref, c_ref),) = reference_stack(table, tokens[:n, b:b + 1], weights,
                                            [(h[b:b + 1], c[b:b + 1]) for h, c in carries])
        np.testing.assert_allclose(h_t[b], h_ref[0], rtol=0, atol=2e-6)
        np.testing.assert_allclose(c_t[b], c_ref[0], rtol=0, atol=2e-6)


def test_wavefront_and_layer_by_layer_give_the_same_final_carries_and_gradients():
    """The wavefront is the two-layer stack evaluated in another order: the same sums, associated differently."""
    table, tokens, weights, carries, masks = _stack_args(8, jnp.float32)
    lens = jnp.asarray(LENGTHS)

    def run(wavefront):
        loss = _stack_loss(stack_of("fused", wavefront=wavefront), 8, jnp.float32, tokens, lens, masks, 2)
        return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(table, weights, carries)

    _assert_close(run(True), run(False), rel=1e-6)


# --- the embedding folded into layer 0, and edge cases ------------------------------------------------------

def _embedding_args(seed, vocab):
    """2 layers' weights, carries and a dropout mask, and a (vocab, D) table with random tokens (T, B) into it."""
    _, _, weights, carries, masks = _stack_args(seed, jnp.float32)
    rng = np.random.default_rng(seed + 1)
    table = jnp.asarray(rng.standard_normal((vocab, D)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, vocab, (T, B)), jnp.int32)
    return table, tokens, weights, carries, masks


@pytest.mark.parametrize("vocab", [6, 40], ids=["projected-table", "projected-rows"])  # V < T·B = 21, V > T·B
def test_embedding_stack_gradients_equal_jax_grad_of_the_reference(vocab):
    """The table path (embed_fold: (table W^T)[tokens]) and the row path (table[tokens] W^T) both give
    the reference's loss and gradients, the table's included (repeated tokens accumulate)."""
    table, tokens, weights, carries, masks = _embedding_args(6, vocab)
    lens = jnp.asarray(LENGTHS)
    fused = stack_of("fused", embed_fold=True)
    got, expected = (jax.jit(jax.value_and_grad(_stack_loss(stack, 6, jnp.float32, tokens, lens, masks, 2),
                                                (0, 1, 2), has_aux=True))(table, weights, carries)
                     for stack in (fused, reference_stack))
    _assert_close(got, expected, rel=2e-5)


@pytest.mark.parametrize("vocab", [6, 40], ids=["projected-table", "projected-rows"])
def test_embedding_stack_evaluation_equals_the_reference(vocab):
    """Without a gradient the table path gathers each step's rows inside the loop: same values."""
    table, tokens, weights, carries, _ = _embedding_args(10, vocab)
    lens = jnp.asarray(LENGTHS)
    got = jax.jit(stack_of("fused", embed_fold=True))(table, tokens, weights, carries, lens)
    _assert_close(got, jax.jit(reference_stack)(table, tokens, weights, carries, lens), rel=2e-5)


def test_single_step_sequence_equals_the_reference():
    """T = 1: the wavefront loop runs once with layer 1 only in its final step."""
    table, tokens, weights, carries, masks = _stack_args(9, jnp.float32)
    tokens = tokens[:1]
    got = jax.jit(fused_stack)(table, tokens, weights, carries, None, masks)
    _assert_close(got, jax.jit(reference_stack)(table, tokens, weights, carries, None, masks), rel=2e-5)

"""Every implementation's layer against PyTorch's cell equations (jax_impl.recurrences.cells, under ``scan``): one
layer over a sequence from a non-zero carry, its outputs, final carry and gradients, per implementation and cell; and
the reference itself against the equations written out in float64 numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_impl.numerics import PRECISION
from jax_impl.recurrences.choice import REGISTRY, Run, obstacle

T, B, D, H = 6, 3, 5, 4
LENGTHS = np.array([T, 1, 4], np.int32)
CASES = [(name, cell) for name, r in REGISTRY.items() for cell in r.layers]


def _args(cell: str, seed: int = 0):
    """xs (T, B, D), the layer's weights ~ U(-1/√H, 1/√H), a non-zero carry, all float32."""
    rng = np.random.default_rng(seed)
    rows = {"lstm": 4, "gru": 3}[cell] * H
    weights = tuple(jnp.asarray(rng.uniform(-0.5, 0.5, shape), jnp.float32)
                    for shape in ((rows, D), (rows, H), (rows,), (rows,)))
    state = [jnp.asarray(np.tanh(rng.standard_normal((B, H))), jnp.float32) for _ in range(2)]
    xs = jnp.asarray(rng.standard_normal((T, B, D)), jnp.float32)
    return xs, weights, tuple(state) if cell == "lstm" else state[0]


def _loss(layer, lengths):
    """(xs, weights, carry) → (Σ fixed weights · every output and final carry, (final carry, outputs))."""
    def loss(xs, weights, carry):
        final, ys = layer(xs, weights, carry, dtype=jnp.float32, precision=PRECISION, lengths=lengths)
        if lengths is not None:  # the outputs past a row's length are padding, whose value is not the interface's
            ys = ys * (jnp.arange(T)[:, None] < lengths[None, :])[:, :, None]
        probe = [jnp.cos(jnp.arange(v.size, dtype=jnp.float32).reshape(v.shape)) for v in jax.tree_util.tree_leaves(
            (final, ys))]
        return sum(jnp.sum(p * v) for p, v in zip(probe, jax.tree_util.tree_leaves((final, ys)))), (final, ys)
    return loss


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("name,cell", CASES)
def test_each_layer_computes_pytorchs_cell_values_and_gradients(name, cell, lengths):
    why = obstacle(name, Run("lm", platform="cpu", cell=cell, padding="left" if lengths is None else "right"))
    if why:
        pytest.skip(f"{name}: {why}")
    lens = None if lengths is None else jnp.asarray(lengths)
    args = _args(cell)
    got, want = (jax.jit(jax.value_and_grad(_loss(layer, lens), argnums=(0, 1, 2), has_aux=True))(*args)
                 for layer in (REGISTRY[name].layers[cell], REGISTRY["scan"].layers[cell]))
    # The same float32 function associated differently: rounding, 1e-5 of each array's scale.
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, float(np.abs(b).max()))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_reference_is_pytorchs_equations(cell):
    xs, (w_ih, w_hh, b_ih, b_hh), carry = (jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), x)
                                           for x in _args(cell, seed=1))
    sigmoid = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    h, c = carry if cell == "lstm" else (carry, None)
    outputs = []
    for x in xs:
        if cell == "lstm":
            i, f, g, o = np.split(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh, 4, axis=-1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
        else:
            x_r, x_z, x_n = np.split(x @ w_ih.T + b_ih, 3, axis=-1)
            h_r, h_z, h_n = np.split(h @ w_hh.T + b_hh, 3, axis=-1)
            r, z = sigmoid(x_r + h_r), sigmoid(x_z + h_z)
            h = (1 - z) * np.tanh(x_n + r * h_n) + z * h
        outputs.append(h)
    final, ys = REGISTRY["scan"].layers[cell](*_args(cell, seed=1), dtype=jnp.float32, precision=PRECISION)
    # float32 against float64 over 6 steps: ~1e-6.
    np.testing.assert_allclose(np.asarray(ys), np.stack(outputs), atol=2e-6)
    np.testing.assert_allclose(np.asarray(final[1] if cell == "lstm" else final), c if cell == "lstm" else h,
                               atol=2e-6)

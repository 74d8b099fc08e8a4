"""The Flax model, under each LSTM implementation: shapes, the explicit carry, dropout only in training, masked
variable-length mode, PyTorch's equations; and the implementations agree with each other."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_impl.convert import to_flax
from common.errors import ConfigError, UnsupportedError
from common.config import Config
from jax_impl.recurrences.choice import REGISTRY, Run, auto, resolve
from jax_impl.classifier import model_from_config
from jax_impl.model import SentimentRNN

B, T, V, E, H, L = 3, 7, 11, 8, 16, 2
CPU_IMPLEMENTATIONS = sorted(set(REGISTRY) - {"cudnn"})  # cudnn: jax_impl/tests/test_cudnn.py


def refusal(impl: str, dtype: str = "float32", padding: str = "left") -> str | None:
    """The model's own one-line refusal of ``impl`` on the CPU at ``dtype`` and ``padding`` (right padding: sequence
    lengths), or None where it computes them. A test of what a stack cannot compute is skipped with that line; the
    refusal itself is tested beside the stack (test_onednn.py)."""
    try:
        resolve(impl, Run(dtype=dtype, platform="cpu", padding=padding))
    except UnsupportedError as error:
        return str(error)
    return None


def skip_unless_computed(impl: str, dtype: str = "float32", padding: str = "left") -> None:
    reason = refusal(impl, dtype, padding)
    if reason:
        pytest.skip(reason)


def zeros(dtype=jnp.float32):
    """The zero carry: L pairs (h, c), each (B, H), in ``dtype``."""
    return SentimentRNN(V, E, H, L, "scan", dtype=dtype).zero_carry(B)


@pytest.fixture(scope="module", params=CPU_IMPLEMENTATIONS)
def setup(request):
    from common.params import init_params
    skip_unless_computed(request.param)  # a native stack whose library was not built: the build's reason
    model = SentimentRNN(V, E, H, L, dropout=0.5, fc_dropout=0.3, lstm_impl=request.param)
    params = jax.tree_util.tree_map(jnp.asarray, to_flax(init_params(V, E, H, L, seed=1)))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, V, (B, T)), jnp.int32)
    apply = jax.jit(lambda p, t, c, k, train: model.apply({"params": p}, t, c, train=train, rngs={"dropout": k}),
                    static_argnums=4)
    return model, params, tokens, apply


def test_logits_and_carry_have_the_documented_shapes(setup):
    model, params, tokens, apply = setup
    logits, carry = apply(params, tokens, zeros(), jax.random.key(0), False)
    assert logits.shape == (B,) and logits.dtype == jnp.float32
    assert len(carry) == L
    for h, c in carry:
        assert h.shape == (B, H) and c.shape == (B, H) and h.dtype == jnp.float32


def test_flax_init_gives_the_same_tree_as_the_conversion(setup):
    model, params, tokens, _ = setup
    initialised = jax.eval_shape(model.init, jax.random.key(0), tokens, zeros())["params"]
    shapes = jax.tree_util.tree_map(jnp.shape, initialised)
    assert shapes == jax.tree_util.tree_map(jnp.shape, params)


def test_the_carry_is_threaded_into_the_next_batch(setup):
    model, params, tokens, apply = setup
    key = jax.random.key(0)
    _, carry1 = apply(params, tokens, zeros(), key, False)
    second = tokens[:, ::-1]
    from_carry, _ = apply(params, second, carry1, key, False)
    from_zeros, _ = apply(params, second, zeros(), key, False)
    # The second batch's logits depend on the first batch's final state.
    assert np.max(np.abs(np.asarray(from_carry) - np.asarray(from_zeros))) > 1e-4


def test_the_new_carry_is_the_top_layers_final_state_that_the_logit_reads(setup):
    model, params, tokens, apply = setup
    logits, carry = apply(params, tokens, zeros(), jax.random.key(0), False)
    top_h = np.asarray(carry[-1][0])
    expected = top_h @ np.asarray(params["fc"]["kernel"])[:, 0] + np.asarray(params["fc"]["bias"])[0]
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-6)


def test_same_inputs_give_bit_identical_outputs(setup):
    model, params, tokens, apply = setup
    key = jax.random.key(3)
    a = apply(params, tokens, zeros(), key, True)
    b = apply(params, tokens, zeros(), key, True)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert np.array_equal(np.asarray(x), np.asarray(y))


def test_dropout_acts_only_in_training_and_follows_the_key(setup):
    model, params, tokens, apply = setup
    carry = zeros()
    eval_a, _ = apply(params, tokens, carry, jax.random.key(0), False)
    eval_b, _ = apply(params, tokens, carry, jax.random.key(1), False)
    train_a, _ = apply(params, tokens, carry, jax.random.key(0), True)
    train_b, _ = apply(params, tokens, carry, jax.random.key(1), True)
    assert np.array_equal(np.asarray(eval_a), np.asarray(eval_b))
    assert not np.array_equal(np.asarray(train_a), np.asarray(train_b))
    assert not np.array_equal(np.asarray(train_a), np.asarray(eval_a))


def test_masked_mode_ignores_everything_past_each_texts_length(setup):
    model, params, tokens, _ = setup
    skip_unless_computed(model.lstm_impl, padding="right")
    lengths = jnp.array([2, 5, 7], jnp.int32)
    apply = jax.jit(lambda t: model.apply({"params": params}, t, zeros(), lengths))
    garbage = jnp.where(jnp.arange(T)[None, :] < lengths[:, None], tokens, (tokens * 7 + 3) % V)
    a_logits, a_carry = apply(tokens)
    b_logits, b_carry = apply(garbage)
    # The tokens past a text's end change nothing: the carry stopped there.
    assert np.array_equal(np.asarray(a_logits), np.asarray(b_logits))
    for x, y in zip(jax.tree_util.tree_leaves(a_carry), jax.tree_util.tree_leaves(b_carry)):
        assert np.array_equal(np.asarray(x), np.asarray(y))


def reference_forward(params, tokens: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, list]:
    """PyTorch's LSTM equations in float64 numpy, one text at a time, stopping at each text's length."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    sigmoid = lambda x: 1 / (1 + np.exp(-x))
    logits, states = [], []
    for row, n in zip(tokens, lengths):
        xs = p["embedding"]["embedding"][row[:n]]
        for k in range(L):
            w = {name: p["lstm"][f"{name}_l{k}"] for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
            h, c, outs = np.zeros(H), np.zeros(H), []
            for x in xs:
                gates = w["weight_ih"] @ x + w["bias_ih"] + w["weight_hh"] @ h + w["bias_hh"]
                i, f, g, o = np.split(gates, 4)
                c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
                h = sigmoid(o) * np.tanh(c)
                outs.append(h)
            xs = np.stack(outs)
        logits.append(h @ p["fc"]["kernel"][:, 0] + p["fc"]["bias"][0])
        states.append((h, c))
    return np.array(logits), states


def test_forward_matches_pytorchs_lstm_equations(setup):
    model, params, tokens, apply = setup
    logits, carry = apply(params, tokens, zeros(), jax.random.key(0), False)
    expected, states = reference_forward(params, np.asarray(tokens), [T] * B)
    # float32 against float64 over 7 steps and 2 layers: agreement to ~1e-6.
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(carry[-1][1]), np.stack([c for _, c in states]), rtol=1e-5, atol=1e-6)


def test_masked_mode_reads_each_texts_own_last_state(setup):
    model, params, tokens, _ = setup
    skip_unless_computed(model.lstm_impl, padding="right")
    lengths = [2, 5, 7]
    logits, carry = jax.jit(lambda t, n: model.apply({"params": params}, t, zeros(), n))(
        tokens, jnp.asarray(lengths, jnp.int32))
    expected, states = reference_forward(params, np.asarray(tokens), lengths)
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(carry[-1][0]), np.stack([h for h, _ in states]), rtol=1e-5, atol=1e-6)


def test_bfloat16_gives_bfloat16_logits_and_a_float32_carry_of_bfloat16_values(setup):
    _, params, tokens, _ = setup
    model = SentimentRNN(V, E, H, L, dropout=0.0, fc_dropout=0.0, dtype=jnp.bfloat16, lstm_impl="scan")
    logits, carry = jax.jit(model.apply)({"params": params}, tokens, zeros())
    reference, _ = setup[3](params, tokens, zeros(), jax.random.key(0), False)
    assert logits.dtype == jnp.bfloat16 and carry[0][0].dtype == carry[0][1].dtype == jnp.float32
    # oneDNN's rules: h and the carried c hold bfloat16 values (exactly: a cast there and back changes nothing).
    for h, c in carry:
        for x in (h, c):
            np.testing.assert_array_equal(np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32)), np.asarray(x))
    # bfloat16 keeps 8 bits of mantissa: the logits agree to a few hundredths.
    np.testing.assert_allclose(np.asarray(logits, np.float32), np.asarray(reference), atol=0.05)
    assert not np.array_equal(np.asarray(logits, np.float32), np.asarray(reference))


def test_float64_under_x64_computes_in_float64(setup):
    from common.params import init_params
    skip_unless_computed(setup[0].lstm_impl, dtype="float64")
    with jax.enable_x64(True):
        model = setup[0].clone(dropout=0.0, fc_dropout=0.0, dtype=jnp.float64)
        params = jax.tree_util.tree_map(jnp.asarray, to_flax(init_params(V, E, H, L, seed=1), dtype=np.float64))
        logits, carry = model.apply({"params": params}, setup[2], zeros(jnp.float64))
        assert logits.dtype == jnp.float64 and carry[-1][0].dtype == jnp.float64


def test_each_implementation_agrees_with_scan_in_logits_carry_and_gradients_with_dropout_on(setup):
    model, params, tokens, _ = setup
    # Right-padded (lengths) where the implementation computes it, else left-padded, full length.
    lengths = None if refusal(model.lstm_impl, padding="right") else jnp.array([7, 1, 4], jnp.int32)

    def run(impl):
        model = SentimentRNN(V, E, H, L, dropout=0.5, fc_dropout=0.3, lstm_impl=impl)

        def loss(p):
            logits, carry = model.apply({"params": p}, tokens, zeros(), lengths, train=True,
                                        rngs={"dropout": jax.random.key(5)})
            return jnp.sum(logits), (logits, carry)
        return jax.jit(jax.grad(loss, has_aux=True))(params)

    # The same function and the same dropout masks, associated differently: float32 rounding, 1e-6 of scale.
    for a, b in zip(jax.tree_util.tree_leaves(run(model.lstm_impl)), jax.tree_util.tree_leaves(run("scan"))):
        a, b = np.asarray(a), np.asarray(b)
        assert np.abs(a - b).max() <= 1e-6 * max(1.0, np.abs(b).max())


@pytest.mark.parametrize("dtype,platform,devices,chosen,why", [
    ("bfloat16", "cpu", 1, "scan", "bfloat16: the scan stack computes PyTorch's mixed precision"),
    ("bfloat16", "gpu", 1, "scan", "bfloat16: the scan stack computes PyTorch's mixed precision"),
    ("float64", "cpu", 1, "fused", "XLA's fused recurrence, not our kernel: it computes float32 only, not float64; "
                                   "use scan or auto"),
    ("float32", "gpu", 1, "fused", "XLA's fused recurrence, not our kernel: it is a CPU kernel, and this backend is "
                                   "gpu"),
    ("float32", "cpu", 2, "fused", "XLA's fused recurrence, not our kernel: it runs on one device: XLA cannot split "
                                   "a custom call over a mesh"),
])
def test_auto_picks_scan_under_bfloat16_and_fused_wherever_the_kernel_does_not_run(dtype, platform, devices, chosen,
                                                                                    why):
    assert auto(Run(dtype=dtype, platform=platform, devices=devices)) == (chosen, why)
    assert resolve("auto", Run(dtype=dtype, platform=platform, devices=devices)) == chosen


@pytest.mark.parametrize("impl", ["onednn", "kernel"])
def test_a_native_kernel_named_over_a_mesh_is_refused_in_one_line(impl):
    skip_unless_computed(impl)
    with pytest.raises(UnsupportedError, match=rf"^--lstm-impl {impl}: it runs on one device: XLA cannot split a "
                                               r"custom call over a mesh$"):
        resolve(impl, Run(platform="cpu", devices=2))


def test_a_named_implementation_resolves_to_itself():
    assert resolve("scan", Run()) == "scan"
    assert resolve("fused", Run(platform="cpu", devices=2)) == "fused"


def test_fused_under_bfloat16_is_refused_in_one_line_naming_the_alternatives():
    with pytest.raises(ConfigError, match=r"^--lstm-impl fused: it does not implement bfloat16.*use scan or auto"):
        resolve("fused", Run(dtype="bfloat16"))


@pytest.mark.parametrize("allow_tf32,name", [(False, "HIGHEST"), (True, "DEFAULT")])
def test_every_matmul_forward_and_backward_runs_at_the_configured_precision(setup, allow_tf32, name):
    _, params, tokens, _ = setup
    model = model_from_config(Config(embed_dim=E, hidden_dim=H, allow_tf32=allow_tf32, lstm_impl=setup[0].lstm_impl),
                              V)

    def loss(p):
        logits, _ = model.apply({"params": p}, tokens, zeros(), train=True,
                                rngs={"dropout": jax.random.key(0)})
        return jnp.sum(logits)
    jaxpr = str(jax.make_jaxpr(jax.grad(loss))(params))
    # HIGHEST: full float32 on every backend; DEFAULT: TF32 where a GPU has it (the CPU computes float32 anyway).
    assert jaxpr.count("dot_general") == jaxpr.count(f"precision=(Precision.{name}, Precision.{name})")
    if setup[0].lstm_impl == "onednn":
        # The LSTM's matmuls are oneDNN's, inside one FFI call per layer and pass (float32 on the CPU); XLA's are
        # the Dense's, forward and backward.
        assert jaxpr.count("onednn_lstm_forward") == jaxpr.count("onednn_lstm_backward") == L
        assert jaxpr.count("dot_general") >= 2
    elif setup[0].lstm_impl == "kernel":
        # The recurrences, the input projections and the embedding fold are the kernel's, one FFI call per layer and
        # pass; XLA's are the Dense's, forward and its two gradients.
        assert jaxpr.count("lstm_kernel_forward") == jaxpr.count("lstm_kernel_backward") == L
        assert jaxpr.count("dot_general") == 3
    else:
        assert jaxpr.count("dot_general") >= 10

"""The cuDNN LSTM layer: its weight packing (checked on the CPU through jax.experimental.rnn's own unpacking and
reference LSTM), the one-line refusal where there is no CUDA GPU, and on a GPU the stack run on it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import rnn

from common.errors import UnsupportedError
from common.params import init_params
from jax_impl.recurrences.cudnn import pack_weights
from jax_impl.recurrences.choice import REGISTRY, Run, resolve
from jax_impl.recurrences.stack import final_carries
from jax_impl.train import main

V, E, H, L, B, T = 13, 6, 5, 2, 3, 9
NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
GPUS = [d for d in jax.devices() if d.platform == "gpu"]


def pack_lstm_weights(params, layer: int) -> jax.Array:
    """``nn.LSTM`` state-dict arrays of one layer → the flat vector ``jax.experimental.rnn.lstm`` takes."""
    return pack_weights(tuple(jnp.asarray(params[f"lstm.{n}_l{layer}"]) for n in NAMES))


@pytest.fixture(scope="module")
def setup():
    """Neutral params (float32), tokens (T, B), a non-zero carry, lengths of a right-padded batch."""
    params = init_params(V, E, H, L, seed=3)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, V, (T, B)), jnp.int32)
    carry = tuple((jnp.asarray(np.tanh(rng.standard_normal((B, H))), jnp.float32),
                   jnp.asarray(rng.standard_normal((B, H)), jnp.float32)) for _ in range(L))
    weights = [tuple(jnp.asarray(params[f"lstm.{n}_l{k}"]) for n in NAMES) for k in range(L)]
    return params, tokens, carry, weights, jnp.array([T, 1, 4], jnp.int32)


def test_packed_weights_unpack_to_pytorchs_arrays(setup):
    params = setup[0]
    for k, inputs in enumerate((E, H)):
        packed = pack_lstm_weights(params, k)
        assert packed.shape == (rnn.get_num_params_in_lstm(inputs, H, 1, False),)
        for name, part in zip(NAMES, rnn.unpack_lstm_weights(packed, inputs, H, 1, False)):
            assert np.array_equal(np.asarray(part[0]), params[f"lstm.{name}_l{k}"]), (name, k)


@pytest.mark.parametrize("masked", [False, True])
def test_jaxs_reference_lstm_on_the_packed_weights_is_the_projects_recurrence(setup, masked):
    params, tokens, carry, weights, lengths = setup
    lengths = lengths if masked else jnp.full((B,), T, jnp.int32)
    table = jnp.asarray(params["embedding.weight"])
    xs, finals = jnp.take(table, tokens.T, axis=0), final_carries(REGISTRY["fused"], table, tokens, weights, carry,
                                                                  lengths if masked else None)
    # Layer by layer, as the cudnn layer calls it: one layer's packed weights per call.
    for k, inputs in enumerate((E, H)):
        unpacked = rnn.unpack_lstm_weights(pack_lstm_weights(params, k), inputs, H, 1, False)
        xs, h_n, c_n = rnn.lstm_ref(xs, carry[k][0][None], carry[k][1][None], *unpacked, lengths, inputs, H, 1, 0.0,
                                    False)
    # Two float32 computations of the same recurrence, associated differently: rounding, well within 1e-5.
        np.testing.assert_allclose(np.asarray(h_n[0]), np.asarray(finals[k][0]), atol=1e-5)
        np.testing.assert_allclose(np.asarray(c_n[0]), np.asarray(finals[k][1]), atol=1e-5)


def test_cudnn_without_a_cuda_gpu_is_refused_naming_the_backend():
    with pytest.raises(UnsupportedError, match=r"^--lstm-impl cudnn: it needs a CUDA GPU, and this backend is cpu$"):
        resolve("cudnn", Run(platform="cpu"))
    with pytest.raises(UnsupportedError, match="computes float32 only"):
        resolve("cudnn", Run(dtype="float64", platform="gpu"))


def test_cudnn_under_bfloat16_is_unsupported_in_the_librarys_own_words():
    words = r'jax.experimental.rnn says "bfloat16 support not implemented for LSTM"'
    with pytest.raises(UnsupportedError, match=words):
        resolve("cudnn", Run(dtype="bfloat16", platform="gpu"))


def test_cudnn_on_the_cpu_is_one_line_and_exit_status_2(capsys):
    assert main(["--lstm-impl", "cudnn", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == "error: --lstm-impl cudnn: it needs a CUDA GPU, and this backend is cpu\n"


@pytest.mark.gpu
@pytest.mark.skipif(not GPUS, reason=f"needs a CUDA GPU seen by JAX (its platforms here: "
                                     f"{sorted({d.platform for d in jax.devices()})})")
@pytest.mark.parametrize("masked", [False, True], ids=["full", "ragged"])
@pytest.mark.parametrize("dropout", [False, True], ids=["no-dropout", "dropout"])
def test_cudnn_stack_computes_the_fused_stacks_carries_and_gradients(setup, masked, dropout):
    params, tokens, carry, weights, lengths = setup
    lengths = lengths if masked else None
    table = jnp.asarray(params["embedding.weight"])
    key = jax.random.key(1) if dropout else None  # the same masks whatever runs

    def loss(impl, table, weights, carry):
        finals = final_carries(REGISTRY[impl], table, tokens, weights, carry, lengths, key)
        return sum(jnp.sum(h * (k + 1)) + jnp.sum(c) for k, (h, c) in enumerate(finals)), finals

    device = GPUS[0]
    args = jax.device_put((table, weights, carry), device)
    fused = jax.jit(jax.grad(lambda *a: loss("fused", *a), argnums=(0, 1, 2), has_aux=True))(*args)
    cudnn = jax.jit(jax.grad(lambda *a: loss("cudnn", *a), argnums=(0, 1, 2), has_aux=True))(*args)
    # Both full float32 (HIGHEST: no TF32), cuDNN's kernels summing in their own order: float32 rounding.
    for a, b in zip(jax.tree_util.tree_leaves(cudnn), jax.tree_util.tree_leaves(fused)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * max(1.0, float(np.abs(b).max())))

"""The pure jitted steps: truncation by stop_gradient, truncated BPTT, purity, one compilation per shape,
non-finite steps, and padded evaluation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.batches import batches
from common.precision import BFLOAT16_RULES
from common import loop
from jax_impl.classifier import forward, make_loss_fn, model_from_config, padded_eval_batch, to_device
from jax_impl.step import TrainState, create_train_state, make_train_step
from jax_impl.train import JaxTwin
from jax_impl.convert import to_flax
from jax_impl.loss import bce_per_example


def evaluate(tiny, params, split):
    """``common.loop.evaluate`` through the JAX twin, running the session's compiled ``eval_step``."""
    twin = JaxTwin(tiny.cfg, len(tiny.data.vocab), tiny.device)
    twin.evaluate = tiny.eval_step
    return loop.evaluate(twin, TrainState(params=params, opt_state=None, step=None), split, tiny.cfg)


def first_batches(tiny, n=2):
    it = batches(tiny.data.train, tiny.cfg.batch_size, shuffle_seed=tiny.cfg.seed, epoch=0)
    return [to_device(next(it), tiny.device) for _ in range(n)]


def params_of(tiny):
    return jax.device_put(to_flax(tiny.neutral), tiny.device)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.fixture(scope="module")
def two_batches(tiny):
    """The first two training batches and a non-zero carry: the state after the first."""
    b1, b2 = first_batches(tiny)
    _, carry = jax.jit(tiny.model.apply)({"params": params_of(tiny)}, b1["tokens"], tiny.model.zero_carry(4))
    return b1, b2, jax.device_put(carry, tiny.device)


def gradients(tiny, carry, batch, truncate_chunks=True, **changes):
    """``(loss, d loss/d params, d loss/d carry)`` of one training batch, dropout off (so runs compare)."""
    cfg = tiny.cfg.replace(dropout=0.0, fc_dropout=0.0, **changes)
    loss_fn = make_loss_fn(model_from_config(cfg, len(tiny.data.vocab)), cfg, truncate_chunks=truncate_chunks)
    value_and_grad = jax.jit(jax.value_and_grad(lambda p, c: loss_fn(p, c, batch, jax.random.key(0))[0],
                                                argnums=(0, 1)))
    loss, (grad_params, grad_carry) = value_and_grad(params_of(tiny), carry)
    return float(loss), leaves(grad_params), leaves(grad_carry)


@pytest.fixture(scope="module")
def by_detach(tiny, two_batches):
    _, b2, carry = two_batches
    return {detach: gradients(tiny, carry, b2, detach=detach) for detach in (True, False)}


def test_stop_gradient_zeroes_the_gradient_into_the_incoming_carry(by_detach):
    _, _, with_stop = by_detach[True]
    _, _, without = by_detach[False]
    assert max(float(np.abs(g).max()) for g in with_stop) == 0.0
    assert max(float(np.abs(g).max()) for g in without) > 1e-6


def test_detach_does_not_change_the_parameter_gradient_in_jax(by_detach):
    # The carry is an input, not a graph into the previous batch: the parameter gradient is the same.
    for a, b in zip(by_detach[True][1], by_detach[False][1]):
        assert np.array_equal(a, b)


@pytest.mark.slow
def test_tbptt_gradient_is_truncated_only_by_the_stop_gradient_at_chunk_boundaries(tiny, two_batches, by_detach):
    _, b2, carry = two_batches
    full_loss, full, _ = by_detach[True]
    # K = 5 over T = 12: a scan over two chunks of 5, then a last chunk of 2.
    open_loss, untruncated, _ = gradients(tiny, carry, b2, truncate_chunks=False, tbptt=5)
    cut_loss, truncated, _ = gradients(tiny, carry, b2, tbptt=5)
    # The chunked forward is the same function (matmuls of other shapes may round differently: 1e-6).
    assert open_loss == pytest.approx(full_loss, rel=1e-6) and cut_loss == pytest.approx(full_loss, rel=1e-6)
    # Without the boundary stop_gradient, chunking changes nothing: the full-BPTT gradient.
    for a, b in zip(full, untruncated):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    # With it, the gradient through the earlier chunks is gone: clearly different.
    assert max(float(np.abs(a - b).max()) for a, b in zip(full, truncated)) > 1e-4


@pytest.mark.parametrize("chunk", [4, 5])  # 4 divides T = 12 (a scan of 3); 5 leaves a last chunk of 2
def test_tbptt_forward_is_the_whole_sequences_forward(tiny, two_batches, chunk):
    b1, _, _ = two_batches
    params = params_of(tiny)
    carry0 = tiny.model.zero_carry(4)
    whole = jax.jit(lambda: forward(tiny.model, params, b1, carry0, jax.random.key(0), train=False,
                                    use_lengths=False))()
    chunked = jax.jit(lambda: forward(tiny.model, params, b1, carry0, jax.random.key(0), train=False,
                                      use_lengths=False, tbptt=chunk))()
    for a, b in zip(leaves(whole), leaves(chunked)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


GPUS = [d for d in jax.devices() if d.platform == "gpu"]


@pytest.mark.parametrize("platform", ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not GPUS, reason=f"needs a GPU seen by JAX (platforms here: {sorted({d.platform for d in jax.devices()})})")])])
def test_train_step_is_pure(tiny, two_batches, platform):
    device = jax.devices(platform)[0]
    b1, _, carry = jax.device_put(two_batches, device)
    key = jax.device_put(jax.random.key(7), device)  # placed as train() places it
    outputs = []
    for _ in range(2):  # the state is donated: a fresh one each time
        state = create_train_state(tiny.model, tiny.cfg, tiny.neutral, device)
        outputs.append(leaves(tiny.train_step(state, carry, b1, key)))
    for a, b in zip(*outputs):
        if platform == "cpu":
            assert np.array_equal(a, b)  # XLA:CPU runs the same program the same way: bit for bit
        else:
            # GPU kernels (atomic scatter-adds, autotuned reductions) do not promise bits, only the same function:
            # float32 rounding, 1e-6 of each array's scale.
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * max(1.0, float(np.abs(b).max())))


def test_dropout_key_follows_the_step_counter(tiny, two_batches):
    b1, _, _ = two_batches
    key = jax.device_put(jax.random.key(7), tiny.device)
    losses = []
    for step in (0, 1):
        state = create_train_state(tiny.model, tiny.cfg, tiny.neutral, tiny.device)
        state = state.replace(step=jax.device_put(np.int32(step), tiny.device))
        carry = jax.device_put(tiny.model.zero_carry(4), tiny.device)
        losses.append(float(tiny.train_step(state, carry, b1, key)[2].loss))
    assert losses[0] != losses[1]  # same params and batch, another dropout mask


def test_train_and_eval_steps_compile_once_per_shape_across_an_epoch(tiny):
    cfg = tiny.cfg
    state = create_train_state(tiny.model, cfg, tiny.neutral, tiny.device)
    carry = jax.device_put(tiny.model.zero_carry(cfg.batch_size), tiny.device)
    key = jax.device_put(jax.random.key(0), tiny.device)
    sizes = []
    for batch in batches(tiny.data.train, cfg.batch_size, shuffle_seed=cfg.seed, epoch=0):
        state, carry, metrics = tiny.train_step(state, carry, to_device(batch, tiny.device), key)
        sizes.append(tiny.train_step._cache_size())
    assert len(sizes) > 10 and sizes[-1] == sizes[0]  # nothing compiled after the first batch
    assert len(tiny.data.val) % cfg.batch_size != 0  # the last validation batch is smaller, then padded
    evaluate(tiny, state.params, tiny.data.val)
    before = tiny.eval_step._cache_size()
    evaluate(tiny, state.params, tiny.data.val)
    evaluate(tiny, state.params, tiny.data.test)
    assert tiny.eval_step._cache_size() == before


def test_padded_evaluation_equals_the_unpadded_mean(tiny):
    params = params_of(tiny)
    split = tiny.data.val
    loss, accuracy = evaluate(tiny, params, split)
    logits, _ = jax.jit(lambda t: tiny.model.apply({"params": params}, t, tiny.model.zero_carry(len(split))))(
        split.tokens)
    per_example = np.asarray(bce_per_example(logits, jnp.asarray(split.labels)), np.float64)
    assert loss == pytest.approx(per_example.mean(), rel=1e-6)
    p = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
    assert accuracy == pytest.approx(np.mean((p > 0.5) == (split.labels == 1)))


def test_padded_eval_batch_marks_padding_with_weight_zero(tiny):
    batch = list(batches(tiny.data.val, tiny.cfg.batch_size))[-1]
    padded = padded_eval_batch(batch, tiny.cfg.batch_size)
    assert padded["tokens"].shape == (tiny.cfg.batch_size, tiny.cfg.seq_len)
    assert np.asarray(padded["weights"]).tolist() == [1.0] * batch.size + [0.0] * (tiny.cfg.batch_size - batch.size)


def test_skip_nonfinite_leaves_params_optimizer_state_and_carry_unchanged(tiny, two_batches):
    cfg = tiny.cfg.replace(skip_nonfinite=True)
    train_step = make_train_step(make_loss_fn(tiny.model, cfg), cfg)
    _, b2, carry = two_batches
    state = create_train_state(tiny.model, cfg, tiny.neutral, tiny.device)
    before = leaves((state.params, state.opt_state, carry))
    bad = dict(b2, labels=jnp.full_like(b2["labels"], jnp.nan))  # a NaN label makes loss and gradient NaN
    key = jax.device_put(jax.random.key(0), tiny.device)
    new_state, new_carry, metrics = train_step(state, carry, bad, key)
    assert not bool(metrics.finite) and int(new_state.step) == 1
    for a, b in zip(before, leaves((new_state.params, new_state.opt_state, new_carry))):
        assert np.array_equal(a, b)
    # A good batch afterwards is applied as usual.
    newer_state, _, metrics = train_step(new_state, new_carry, b2, key)
    assert bool(metrics.finite)
    assert not np.array_equal(leaves(newer_state.params)[0], before[0])


@pytest.mark.parametrize("allow_tf32,precision", [(False, "highest"), (True, "default")])
def test_the_run_record_states_the_precision_and_the_xla_environment(tiny, allow_tf32, precision):
    record = JaxTwin(tiny.cfg.replace(allow_tf32=allow_tf32), len(tiny.data.vocab), tiny.device).record
    assert (record["allow_tf32"], record["matmul_precision"]) == (allow_tf32, precision)
    assert isinstance(record["xla_scatter_workaround"], bool) and isinstance(record["xla_flags"], str)


@pytest.mark.parametrize("padding, rules", [("left", "onednn"), ("right", "native")])
def test_bfloat16_trains_float32_parameters_and_records_what_it_computes_in_bfloat16(tiny, padding, rules):
    cfg = tiny.cfg.replace(dtype="bfloat16", padding=padding)
    twin = JaxTwin(cfg, len(tiny.data.vocab), tiny.device)
    state = twin.init_state(tiny.neutral)
    batch = next(batches(tiny.data.train, cfg.batch_size, shuffle_seed=0))
    state, carry, loss = twin.train_step(state, twin.init_carry(), batch)
    assert np.isfinite(loss) and twin.record["lstm_impl"] == "scan"
    floats = {x.dtype for x in leaves((state.params, state.opt_state, carry)) if x.dtype.kind == "f"}
    assert floats == {np.dtype(np.float32)}
    assert twin.record["bfloat16"] == BFLOAT16_RULES[rules]

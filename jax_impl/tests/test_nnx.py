"""The classifier written in Flax NNX (``--flax-api nnx``): the linen model's function from the same neutral
parameters, the linen twin's training steps, its checkpoints, and what it refuses.

The linen twin compared with is ``--lstm-impl flax``: the same stock cell under linen's ``nn.RNN``, fed PyTorch's
weights. Both compute every gate in float32 from the same numbers, summed in other orders (linen's cell: one Dense per
gate with the bias b_ih + b_hh; NNX's: two fused (D, 4H) Linears, one bias each), so they agree to float32 rounding,
not bit for bit.
"""
from itertools import islice

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from common.batches import batches
from common.data import prepare_data
from common.errors import ConfigError, UnsupportedError
from common.loop import train_steps
from common.runstate import Progress, step_dir
from jax_impl import convert, nnx_step
from jax_impl.classifier import model_from_config
from jax_impl.nnx_model import SentimentRNN
from jax_impl.recurrences.choice import Run, auto, nnx_obstacle, resolve
from jax_impl.train import JaxTwin, NnxTwin, twin_maker

# On an older Flax the NNX twin is refused (test_choice checks the refusal): nothing here can run.
pytestmark = pytest.mark.skipif(nnx_obstacle(Run(flax_api="nnx")) is not None,
                                reason=str(nnx_obstacle(Run(flax_api="nnx"))))

# The forward pass: logits and carries of size ~1 from T 12 steps of two layers; measured max |diff| 6e-8 (one float32
# ulp at 0.5), held at 1e-6.
FORWARD_TOL = 1e-6
# Five Adam steps at lr 1e-3 from the same weights. Losses near ln 2: measured equal to the last bit in every mode, held
# at 1e-6. Parameters that moved ~5e-3: measured within 6e-8, 1.4e-6 under --tbptt (Adam divides each moment by its
# root, so an element whose gradient is at rounding level can move a few ulps of the embedding's N(0, 1) values
# apart); held at 1e-5, far below the 1e-3 one step moves a parameter.
LOSS_TOL, PARAMS_TOL = 1e-6, 1e-5


def twin(cfg, vocab_size: int):
    """The twin ``python -m jax_impl.train`` builds for ``cfg``."""
    with twin_maker(cfg) as make:
        return make(cfg, vocab_size)


def losses_and_params(cfg, data, neutral, steps: int) -> tuple[np.ndarray, dict]:
    """``steps`` training steps of the twin for ``cfg`` through the loop's driver: the losses and the final neutral
    parameters."""
    t = twin(cfg, len(data.vocab))
    out = list(islice(train_steps(t, t.init_state(neutral), data.train, cfg), steps))
    return np.array([s.loss for s in out]), t.export_params(out[-1].state)


def test_neutral_parameters_go_into_the_nnx_model_and_come_back_bitwise(tiny):
    assert all(np.array_equal(tiny.neutral[k], v) and v.dtype == np.float32
               for k, v in convert.from_nnx(convert.to_nnx(tiny.neutral)).items())
    t = twin(tiny.cfg.replace(flax_api="nnx"), len(tiny.data.vocab))
    exported = t.export_params(t.init_state(tiny.neutral))
    assert list(exported) == list(tiny.neutral)  # common.params' order
    assert all(np.array_equal(tiny.neutral[k], exported[k]) for k in tiny.neutral)


def test_each_layer_holds_the_stock_cell_with_pytorchs_two_biases(tiny):
    model = twin(tiny.cfg.replace(flax_api="nnx"), len(tiny.data.vocab)).model
    assert isinstance(model, SentimentRNN) and all(isinstance(rnn.cell, nnx.OptimizedLSTMCell) for rnn in model.lstm)
    shapes = jax.tree_util.tree_map(jnp.shape, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    e, h = tiny.cfg.embed_dim, tiny.cfg.hidden_dim
    assert shapes["lstm"][0]["cell"] == {"dense_i": {"kernel": (e, 4 * h), "bias": (4 * h,)},
                                         "dense_h": {"kernel": (h, 4 * h), "bias": (4 * h,)}}
    assert shapes["lstm"][1]["cell"]["dense_i"] == {"kernel": (h, 4 * h), "bias": (4 * h,)}


@pytest.mark.parametrize("padding", ["left", "right"])
def test_the_nnx_model_computes_the_linen_flax_models_logits_and_carry(tiny, padding):
    cfg = tiny.cfg.replace(padding=padding)
    data = prepare_data(cfg)  # right padding encodes the texts otherwise
    batch = next(batches(data.train, cfg.batch_size, shuffle_seed=0, epoch=0))
    lengths = batch.lengths if padding == "right" else None
    rng = np.random.default_rng(1)  # a non-zero incoming carry, in the ranges a trained LSTM produces
    carry = tuple((np.tanh(rng.standard_normal((cfg.batch_size, cfg.hidden_dim))).astype(np.float32),
                   rng.standard_normal((cfg.batch_size, cfg.hidden_dim)).astype(np.float32)) for _ in range(2))
    linen = model_from_config(cfg.replace(lstm_impl="flax"), len(tiny.data.vocab), "cpu")
    logits_l, carry_l = jax.jit(linen.apply)({"params": convert.to_flax(tiny.neutral)}, batch.tokens, carry, lengths)
    state = nnx_step.create_train_state(twin(cfg.replace(flax_api="nnx"), len(tiny.data.vocab)).model, cfg,
                                        tiny.neutral)
    logits_n, carry_n = nnx.jit(lambda m, *args: m(*args))(state.model, batch.tokens, carry, lengths)
    assert logits_n.shape == (cfg.batch_size,) and max_diff(logits_l, logits_n) < FORWARD_TOL
    assert max_diff(carry_l, carry_n) < FORWARD_TOL  # (h, c) of both layers


def max_diff(a, b) -> float:
    """The largest |a - b| over two pytrees of arrays of one structure."""
    return max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_dropout_masks_come_from_the_key_alone_and_only_in_training(tiny):
    cfg = tiny.cfg.replace(flax_api="nnx", dropout=0.5, fc_dropout=0.3)
    model = nnx_step.create_train_state(twin(cfg, len(tiny.data.vocab)).model, cfg, tiny.neutral).model
    tokens, carry = np.asarray(tiny.data.train.tokens[:cfg.batch_size]), model.zero_carry(cfg.batch_size)
    run = nnx.jit(lambda m, key, train: m(tokens, carry, train=train, key=key)[0], static_argnums=2)
    one, two = jax.random.key(1), jax.random.key(2)
    assert np.array_equal(run(model, one, True), run(model, one, True))  # the same key, the same masks
    assert not np.allclose(run(model, one, True), run(model, two, True))
    assert np.array_equal(run(model, one, False), run(model, two, False))  # evaluation: no masks


@pytest.mark.parametrize("mode", [{}, {"padding": "right"}, {"tbptt": 5}, {"carry": "reset", "clip": 0.02}],
                         ids=["seed", "padding-right", "tbptt-5", "reset-clip-binds"])
def test_the_nnx_twin_trains_the_linen_flax_twins_steps(tiny, mode):
    """Dropout 0 (each model draws its own masks). Clip 0.02 binds on every step here (the gradient norms measured
    0.05 to 0.6), so the clip's norm must count both biases' gradients in both."""
    cfg = tiny.cfg.replace(dropout=0.0, fc_dropout=0.0, lstm_impl="flax", **mode)
    losses_l, params_l = losses_and_params(cfg, tiny.data, tiny.neutral, 5)
    losses_n, params_n = losses_and_params(cfg.replace(flax_api="nnx", lstm_impl="auto"), tiny.data, tiny.neutral, 5)
    assert max_diff(losses_l, losses_n) < LOSS_TOL and max_diff(params_l, params_n) < PARAMS_TOL
    assert max_diff(params_l, tiny.neutral) > 100 * PARAMS_TOL  # it trained


def test_a_non_finite_step_leaves_parameters_optimizer_and_carry_as_they_were(tiny):
    cfg = tiny.cfg.replace(flax_api="nnx", skip_nonfinite=True)
    state = nnx_step.create_train_state(twin(cfg, len(tiny.data.vocab)).model, cfg, tiny.neutral)
    grads = jax.tree_util.tree_map(lambda a: jnp.full_like(a, jnp.nan), nnx.state(state.model, nnx.Param))
    before = jax.device_get((state.params, state.opt_state))
    carry, new_carry = state.model.zero_carry(cfg.batch_size), state.model.zero_carry(cfg.batch_size)
    new_carry = jax.tree_util.tree_map(lambda a: a + 1, new_carry)
    carry_out, metrics = nnx.jit(nnx_step.make_update(cfg))(state.model, state.optimizer, grads, jnp.float32(0.7),
                                                          carry, new_carry)
    assert not bool(metrics.finite) and int(state.step) == 1  # counted, as the linen state counts it
    same = jax.tree_util.tree_map(np.array_equal, before, jax.device_get((state.params, state.opt_state)))
    assert all(jax.tree_util.tree_leaves(same))
    assert all(not np.any(np.asarray(a)) for a in jax.tree_util.tree_leaves(carry_out))  # the incoming zeros


def test_training_state_saved_by_orbax_resumes_the_same_steps(tiny, tmp_path):
    cfg = tiny.cfg.replace(flax_api="nnx")
    t = twin(cfg, len(tiny.data.vocab))
    run = list(islice(train_steps(t, t.init_state(tiny.neutral), tiny.data.train, cfg), 4))
    first = list(islice(train_steps(t, t.init_state(tiny.neutral), tiny.data.train, cfg), 2))
    t.save_state(tmp_path, Progress(2, 0, 2), first[-1].state, first[-1].carry, keep=1)
    progress, (state, carry) = t.restore_state(step_dir(tmp_path, 2), t.init_state(tiny.neutral), t.init_carry())
    assert progress.step == 2 and int(state.step) == 2
    rest = list(islice(train_steps(t, state, tiny.data.train, cfg, start=progress, carry=carry), 2))
    assert [s.loss for s in rest] == [s.loss for s in run[2:]]  # bit for bit: the same program on the same numbers


def test_set_lr_changes_the_rate_the_optimizer_state_holds(tiny):
    t = twin(tiny.cfg.replace(flax_api="nnx"), len(tiny.data.vocab))
    state = t.set_lr(t.init_state(tiny.neutral), 2.5e-4)
    assert float(state.opt_state[1].hyperparams["learning_rate"]) == np.float32(2.5e-4)


def test_under_nnx_auto_is_flaxs_stock_cell():
    assert resolve("auto", Run(platform="cpu", flax_api="nnx")) == "flax"
    assert resolve("flax", Run(platform="cpu", dtype="float64", padding="right", flax_api="nnx")) == "flax"
    assert auto(Run(platform="cpu", flax_api="nnx"))[1].startswith("Flax NNX: nnx.RNN over Flax's stock")


@pytest.mark.parametrize("impl,run,error,message", [
    ("fused", Run(platform="cpu", flax_api="nnx"), ConfigError,
     "--lstm-impl fused is linen's: under --flax-api nnx the LSTM is nnx.RNN over Flax's stock cell (leave "
     "--lstm-impl auto, or pass --flax-api linen)"),
    ("auto", Run(platform="cpu", dtype="bfloat16", flax_api="nnx"), UnsupportedError,
     "--flax-api nnx: it computes float32 or float64: PyTorch's bfloat16 autocast rules are implemented in linen's "
     "scan stack only (use --flax-api linen)"),
    ("auto", Run("lm", platform="cpu", flax_api="nnx"), UnsupportedError,
     "--flax-api nnx: it is the classifier's; the language model is written in linen (leave --flax-api linen)"),
    ("auto", Run(platform="cpu", devices=2, flax_api="nnx"), UnsupportedError,
     "--flax-api nnx: it runs on one device, not a mesh of 2 (pass --devices 1, or --flax-api linen)"),
], ids=["lstm-impl", "bfloat16", "lm", "devices"])
def test_what_nnx_cannot_run_is_refused_in_one_line(impl, run, error, message):
    with pytest.raises(error) as refused:
        resolve(impl, run)
    assert type(refused.value) is error and str(refused.value) == message


def test_the_twin_maker_builds_the_nnx_twin_only_for_flax_api_nnx(tiny):
    assert type(twin(tiny.cfg, len(tiny.data.vocab))) is JaxTwin
    nnx_twin = twin(tiny.cfg.replace(flax_api="nnx"), len(tiny.data.vocab))
    assert type(nnx_twin) is NnxTwin
    assert {k: nnx_twin.record[k] for k in ("flax_api", "lstm_impl")} == {"flax_api": "nnx", "lstm_impl": "flax"}

"""``python -m jax_impl.predict CKPT_DIR "text" ... [--json] [--device D]``: P(positive) from a classifier's neutral
checkpoint; from a language model's, ``CKPT_DIR "中国 人民" --words N`` continues the prompt greedily."""
from typing import Sequence

import jax
import numpy as np

from common import interrupts
from common.checkpoint import Checkpoint
from common.predict import encode_for, predict_main
from jax_impl import classifier, lm, xla_env
from jax_impl.loss import sigmoid
from jax_impl.step import resolve_device


def predict_probs(ckpt: Checkpoint, texts: Sequence[str], device: jax.Device | None = None) -> np.ndarray:
    """(N,) float64 P(positive) of each text, scored as one batch of N from a zero carry with dropout off."""
    tokens, lengths = encode_for(ckpt, texts)
    model = classifier.model_from_config(ckpt.config.replace(dtype="float32"), len(ckpt.vocab))
    args = jax.device_put((classifier.to_flax(ckpt.params), tokens, model.zero_carry(len(texts)), lengths), device)
    logits, _ = jax.jit(lambda p, t, c, n: model.apply({"params": p}, t, c, n, train=False))(*args)
    return np.asarray(sigmoid(logits), dtype=np.float64)


def greedy_ids(ckpt: Checkpoint, prompt: np.ndarray, words: int, device: jax.Device | None = None) -> list[int]:
    """The ids of the ``words`` words that follow ``prompt`` (ids (t,)) greedily: the prompt read from a zero carry,
    then each word the argmax of the last logits (the lowest id on a tie, as torch's), fed back in. Dropout off."""
    model = lm.model_from_config(ckpt.config.replace(dtype="float32"), len(ckpt.vocab))

    @jax.jit  # compiled twice: for the prompt's length, then for one word
    def next_word(params, tokens, carry):
        logits, carry = model.apply({"params": params}, tokens, carry, train=False)
        return jax.numpy.argmax(logits[-1], axis=-1)[None, :].astype(tokens.dtype), carry  # (1, 1)

    params, carry = jax.device_put((lm.to_flax(ckpt.params), model.zero_carry(1)), device)
    tokens, found = jax.device_put(np.asarray(prompt, np.int32)[:, None], device), []  # (t, 1)
    for _ in range(words):
        tokens, carry = next_word(params, tokens, carry)
        found.append(int(tokens[0, 0]))
    return found


def _resolve_device(name: str) -> jax.Device:
    xla_env.configure()  # before the first backend starts (resolve_device starts it)
    return resolve_device(name)


main = predict_main("python -m jax_impl.predict", _resolve_device, predict_probs, greedy_ids)

if __name__ == "__main__":
    interrupts.exit_process(main())

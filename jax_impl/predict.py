"""``python -m jax_impl.predict CKPT_DIR "text" ... [--json] [--device D]``: P(positive) from a neutral checkpoint."""
from __future__ import annotations

import sys
from typing import Sequence

import jax
import numpy as np

from common.checkpoint import Checkpoint, load_checkpoint
from common.data import encode_texts
from common.errors import cli_main
from common.predict import format_predictions, predict_parser
from jax_impl.convert import to_flax
from jax_impl.loss import sigmoid
from jax_impl.model import model_from_config
from jax_impl.step import resolve_device, zero_carry

PROG = "python -m jax_impl.predict"


def predict_probs(ckpt: Checkpoint, texts: Sequence[str], device: jax.Device | None = None) -> np.ndarray:
    """(N,) float P(positive) of each text: tokenized and encoded as in training, scored from a zero carry
    with dropout off (one batch of N)."""
    cfg = ckpt.config.replace(dtype="float32")
    tokens, lengths = encode_texts(texts, ckpt.vocab, ckpt.tokenizer, cfg.seq_len, cfg.padding)
    model = model_from_config(cfg, len(ckpt.vocab))
    params = jax.device_put(to_flax(ckpt.params), device)
    carry = jax.device_put(zero_carry(model, len(texts)), device)
    lengths = np.maximum(lengths, 1) if cfg.padding == "right" else None  # an empty text reads one <pad>
    logits, _ = jax.jit(lambda p, t, c, n: model.apply({"params": p}, t, c, n, train=False))(
        params, jax.device_put(tokens, device), carry, None if lengths is None else jax.device_put(lengths, device))
    return np.asarray(sigmoid(logits), dtype=np.float64)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = predict_parser(PROG).parse_args(argv)
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint)
    probs = predict_probs(ckpt, args.texts, device)
    print(format_predictions(args.texts, probs, args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Score texts with a saved model: ``python -m torch_impl.predict CKPT_DIR "text" ... [--json] [--device]``.

The checkpoint brings its own vocabulary, tokenizer, ``seq_len`` and padding, so a text is encoded exactly
as the training data was. Every text starts from a zero hidden state.
"""
from __future__ import annotations

import sys
from typing import Sequence

import numpy as np
import torch

from common.checkpoint import Checkpoint, load_checkpoint
from common.data import encode_texts
from common.errors import cli_main
from common.predict import format_predictions, predict_parser
from torch_impl.model import SentimentRNN, load_params, model_from_config
from torch_impl.step import resolve_device

PROG = "python -m torch_impl.predict"


def model_from_checkpoint(ckpt: Checkpoint, device: torch.device) -> SentimentRNN:
    model = model_from_config(ckpt.config, len(ckpt.vocab))
    load_params(model, ckpt.params)
    return model.to(device).eval()


@torch.no_grad()
def predict(model: SentimentRNN, ckpt: Checkpoint, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """P(positive) for each text, (N,) float."""
    cfg = ckpt.config
    tokens, lengths = encode_texts(texts, ckpt.vocab, ckpt.tokenizer, cfg.seq_len, cfg.padding)
    lengths = np.maximum(lengths, 1)  # an empty text is read as one <pad>, as in training
    device = model.fc.weight.device
    probs = []
    for lo in range(0, len(texts), batch_size):
        x = torch.from_numpy(tokens[lo: lo + batch_size]).to(device).long()  # (B, T)
        n = torch.from_numpy(lengths[lo: lo + batch_size])
        out, _ = model(x, model.init_hidden(x.shape[0]), n if cfg.padding == "right" else None)
        probs.append(out.float().cpu().numpy())
    return np.concatenate(probs)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = predict_parser(PROG).parse_args(argv)
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint)
    model = model_from_checkpoint(ckpt, device)
    print(format_predictions(args.texts, predict(model, ckpt, args.texts), args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())

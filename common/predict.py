"""The predict command line both twins share; a twin adds only ``probs(ckpt, texts, device)`` → (N,) P(positive)."""
import argparse
import json
from dataclasses import fields
from typing import Callable, Sequence

import numpy as np

from common import interrupts
from common.checkpoint import Checkpoint, load_checkpoint
from common.config import Config, Parser
from common.data import encode_texts
from common.errors import cli_main
from common.text import tokenize

DEVICE_CHOICES = next(f.metadata["choices"] for f in fields(Config) if f.name == "device")


def is_positive(probs) -> np.ndarray:
    """The one decision rule, for prediction and for accuracy alike: positive iff P(positive) > 0.5. It is the
    seed's ``torch.round(p)``: round-half-to-even sends exactly 0.5 to 0, negative."""
    return np.asarray(probs) > 0.5


def predict_parser(prog: str) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description="Probability that each text is positive, from a neutral checkpoint.")
    parser.add_argument("checkpoint", help="neutral checkpoint directory (config.json, vocab.json, model.safetensors)")
    parser.add_argument("texts", nargs="+", help="texts to score")
    parser.add_argument("--json", action="store_true", help="print a JSON list of {text, prob, label, unknown_words}")
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES)
    return parser


def encode_for(ckpt: Checkpoint, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray | None]:
    """``texts`` encoded as the checkpoint's training data was (its vocabulary, tokenizer, ``seq_len`` and padding):
    tokens (N, T) int32, and lengths (N,) int32 for right padding (≥ 1: an empty text reads one <pad>), else None."""
    tokens, lengths = encode_texts(texts, ckpt.vocab, ckpt.tokenizer, ckpt.config.seq_len, ckpt.config.padding)
    return tokens, np.maximum(lengths, 1) if ckpt.config.padding == "right" else None


def unknown_words(ckpt: Checkpoint, texts: Sequence[str]) -> list[int]:
    """Per text, its tokens outside the checkpoint's vocabulary: read as <unk>, or skipped (``ckpt.vocab``'s rule)."""
    return ckpt.vocab.unknown_counts(tokenize(texts, ckpt.tokenizer))


def format_predictions(texts: Sequence[str], probs: Sequence[float], as_json: bool,
                       unknown: Sequence[int] | None = None) -> str:
    """``prob`` is P(positive); ``label`` is 'positive' when :func:`is_positive`, else 'negative'; with ``unknown``
    (a count per text) each JSON record also has ``unknown_words``."""
    rows = [{"text": t, "prob": float(p), "label": "positive" if is_positive(p) else "negative"}
            | ({} if unknown is None else {"unknown_words": int(unknown[i])})
            for i, (t, p) in enumerate(zip(texts, probs))]
    return (json.dumps(rows, ensure_ascii=False) if as_json
            else "\n".join(f"{r['prob']:.4f}\t{r['label']}\t{r['text']}" for r in rows))


def predict_main(prog: str, resolve_device: Callable, probs: Callable) -> Callable[..., int]:
    """A twin's ``main(argv)``: flags, ``resolve_device(--device)``, the checkpoint, then one row per text."""
    @cli_main
    def main(argv: Sequence[str] | None = None) -> int:
        args = predict_parser(prog).parse_args(argv)
        device, ckpt = resolve_device(args.device), load_checkpoint(args.checkpoint)
        found = probs(ckpt, args.texts, device)
        interrupts.check()  # a Ctrl-C remembered while JAX collected garbage: stop before printing, not after
        print(format_predictions(args.texts, found, args.json, unknown_words(ckpt, args.texts)))
        return 0

    return main

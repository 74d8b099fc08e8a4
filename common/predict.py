"""The predict command line both twins share: argument parsing, the decision rule and the output format."""
from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Sequence

import numpy as np

from common.config import Config, Parser

DEVICE_CHOICES = next(f.metadata["choices"] for f in fields(Config) if f.name == "device")


def is_positive(probs) -> np.ndarray:
    """The one decision rule, for prediction and for accuracy alike: positive iff P(positive) > 0.5. It is the
    seed's ``torch.round(p)``: round-half-to-even sends exactly 0.5 to 0, negative."""
    return np.asarray(probs) > 0.5


def predict_parser(prog: str) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description="Probability that each text is positive, from a neutral checkpoint.")
    parser.add_argument("checkpoint", help="neutral checkpoint directory (config.json, vocab.json, model.safetensors)")
    parser.add_argument("texts", nargs="+", help="texts to score")
    parser.add_argument("--json", action="store_true", help="print a JSON list of {text, prob, label}")
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES)
    return parser


def format_predictions(texts: Sequence[str], probs: Sequence[float], as_json: bool) -> str:
    """``prob`` is P(positive); ``label`` is 'positive' when :func:`is_positive`, else 'negative'."""
    rows = [{"text": t, "prob": float(p), "label": "positive" if is_positive(p) else "negative"}
            for t, p in zip(texts, probs)]
    if as_json:
        return json.dumps(rows, ensure_ascii=False)
    return "\n".join(f"{r['prob']:.4f}\t{r['label']}\t{r['text']}" for r in rows)

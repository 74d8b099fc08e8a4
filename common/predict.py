"""The predict command line both twins share: argument parsing and output format."""
from __future__ import annotations

import argparse
import json
from typing import Sequence

from common.config import _Parser


def predict_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Probability that each text is positive, from a neutral checkpoint.")
    parser.add_argument("checkpoint", help="neutral checkpoint directory (config.json, vocab.json, model.safetensors)")
    parser.add_argument("texts", nargs="+", help="texts to score")
    parser.add_argument("--json", action="store_true", help="print a JSON list of {text, prob, label}")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu", "cuda", "tpu"))
    return parser


def format_predictions(texts: Sequence[str], probs: Sequence[float], as_json: bool) -> str:
    """``prob`` is P(positive); ``label`` is 'positive' when prob >= 0.5."""
    rows = [{"text": t, "prob": float(p), "label": "positive" if p >= 0.5 else "negative"}
            for t, p in zip(texts, probs)]
    if as_json:
        return json.dumps(rows, ensure_ascii=False)
    return "\n".join(f"{r['prob']:.4f}\t{r['label']}\t{r['text']}" for r in rows)

"""The predict command line both twins share. A twin adds only ``probs(ckpt, texts, device)`` → (N,) P(positive) for
a classifier's checkpoint, and ``next_ids(ckpt, prompt ids, words, device)`` → the greedy continuation's ids for a
language model's: the prompt read from a zero state, then each next word the most probable one (``argmax`` of the
logits, the lowest id on a tie), fed back in."""
import argparse
from dataclasses import fields
from typing import Callable, Sequence

import numpy as np

from common import interrupts
from common.checkpoint import Checkpoint, load_checkpoint
from common.config import Config, Parser, int_at_least
from common.data import encode_texts
from common.errors import cli_main
from common.files import to_json
from common.lm_data import EOS
from common.text import tokenize

DEFAULT_WORDS = 20  # a language model's continuation, when --words is not given
# The longest continuation: each word is one step of the model, in sequence, and nothing is printed until every
# prompt's words are done (ten thousand take seconds to a minute on a CPU; a billion, days).
MAX_WORDS = 10_000
DEVICE_CHOICES = next(f.metadata["choices"] for f in fields(Config) if f.name == "device")


def is_positive(probs) -> np.ndarray:
    """The one decision rule, for prediction and for accuracy alike: positive iff P(positive) > 0.5. It is the
    seed's ``torch.round(p)``: round-half-to-even sends exactly 0.5 to 0, negative."""
    return np.asarray(probs) > 0.5


def predict_parser(prog: str) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description="A classifier's checkpoint: the probability that each text is positive. A "
                    "language model's: each prompt (words separated by spaces) continued greedily by --words words.")
    parser.add_argument("checkpoint", help="neutral checkpoint directory (config.json, vocab.json, model.safetensors)")
    parser.add_argument("texts", nargs="+", help="texts to score, or prompts to continue")
    parser.add_argument("--words", type=int_at_least(1, MAX_WORDS), default=None,
                        help=f"language model: words to generate after each prompt (default {DEFAULT_WORDS}; at most "
                        f"{MAX_WORDS}: each is one step of the model, in sequence, and nothing prints until all are "
                        f"done)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of {text, prob, label, unknown_words} "
                        "(language model: {prompt, continuation, unknown_words})")
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES)
    return parser


def continue_prompts(ckpt: Checkpoint, prompts: Sequence[str], words: int, device, next_ids: Callable
                     ) -> list[dict]:
    """Each prompt continued by ``words`` words: ``{"prompt", "continuation" (a list of words), "unknown_words"}``.
    A prompt's words are whitespace-separated (as the corpus's); one outside the vocabulary reads as ``<unk>``. An
    empty prompt reads as one ``<eos>`` (a sentence's start)."""
    rows = []
    for prompt in prompts:
        tokens = prompt.split() or [EOS]
        ids = ckpt.vocab.encode(tokens)
        found = next_ids(ckpt, ids, words, device)
        rows.append({"prompt": prompt, "continuation": [ckpt.vocab.tokens[i] for i in found],
                     "unknown_words": int(sum(t not in ckpt.vocab.index for t in tokens))})
    return rows


def format_continuations(rows: list[dict], as_json: bool) -> str:
    if as_json:
        return to_json(rows, ensure_ascii=False)
    return "\n".join(" ".join([r["prompt"], *r["continuation"]]) for r in rows)


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
    return (to_json(rows, ensure_ascii=False) if as_json
            else "\n".join(f"{r['prob']:.4f}\t{r['label']}\t{r['text']}" for r in rows))


def predict_main(prog: str, resolve_device: Callable, probs: Callable, next_ids: Callable) -> Callable[..., int]:
    """A twin's ``main(argv)``: flags, ``resolve_device(--device)``, the checkpoint, then one row per text (or per
    prompt, for a language model's checkpoint)."""
    @cli_main
    def main(argv: Sequence[str] | None = None) -> int:
        parser = predict_parser(prog)
        args = parser.parse_args(argv)
        ckpt = load_checkpoint(args.checkpoint)
        lm = ckpt.config.workload == "lm"
        if args.words is not None and not lm:
            parser.error(f"--words continues a language model's prompts; {args.checkpoint} is a classifier's")
        device = resolve_device(args.device)
        if lm:
            rows = continue_prompts(ckpt, args.texts, args.words or DEFAULT_WORDS, device, next_ids)
            interrupts.check()
            print(format_continuations(rows, args.json))
            return 0
        found = probs(ckpt, args.texts, device)
        interrupts.check()  # a Ctrl-C remembered while JAX collected garbage: stop before printing, not after
        print(format_predictions(args.texts, found, args.json, unknown_words(ckpt, args.texts)))
        return 0

    return main

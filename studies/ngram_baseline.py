"""An interpolated Kneser-Ney n-gram baseline for the language model: ``python -m studies.ngram_baseline
[--data peoples_daily|FILE] [--max-vocab 10000] [--order 3] [--discount D] [--out FILE.json [--overwrite]]``.

The data is the language model's own (:func:`common.lm_data.prepare_lm_data`): the same vocabulary fitted on the
training split, the same contiguous 80/10/10 split of lines, each split's ids mapped back to words, so ``<unk>``
stands for every word outside the vocabulary exactly as for the neural model and ``<eos>`` ends each line as a word
to predict.

The model is NLTK's ``KneserNeyInterpolated`` (one absolute discount for every order, the lower orders built from
continuation counts), fitted on the training split as one continuous stream, as the neural model reads it: every
n-gram of orders 1 to n, across line ends (``<eos>`` is context like any word), no ``<s>`` padding per line. One
``<s>`` before the stream stands for its start, so that the first n-grams have a left context for their continuation
counts as every later one does: without it NLTK's probabilities over the vocabulary sum to more than 1 in a context
seen at the stream's start (1.5 in one of the tests), and NLTK divides by zero in a context seen only there. With it
they sum to 1 within rounding (tested; ``normalisation`` in the output checks three contexts of the run). ``<s>`` is
never predicted (its probability is 0 in every context), and no scored context holds it. The discount, one for every
order as NLTK has it, is by default Ney, Essen and Kneser's estimate from the training counts of the highest order
(:func:`estimated_discount`; 0.83 for trigrams on the People's Daily, where NLTK's default, 0.1, gives a validation
perplexity of 649 instead of 211).

Scoring matches the neural model's evaluation token for token: a split's id stream is cut into the
``EVAL_BATCH_SIZE`` columns of :func:`common.lm_data.batchify` (contiguous pieces; the last ``N mod B`` ids dropped)
and every token of a column but its first is predicted from the up to ``n - 1`` tokens before it in that column, so
a column's second token is conditioned on one token, its third on two, and so on (the neural model also starts each
column from a zero carry). Perplexity is ``exp`` of the mean negative natural-log probability over those
``(N // B - 1) * B`` tokens (NLTK's ``perplexity``, ``2 ** entropy``, is the same number).

NLTK's ``KneserNey`` finds each continuation count by scanning every higher-order n-gram in the model (hours for the
validation split; docs/performance.md's log), so the fitted model gets the same counts from an index built once
(:class:`ContinuationCounts`): NLTK's formulas unchanged, the same probabilities (a test compares them with NLTK's
own, exactly).

``--order 1`` is NLTK's ``MLE`` unigram, ``count(w) / N``: NLTK's Kneser-Ney has no order 1 (its unigram level is
always the continuation distribution, built from bigrams), and a Kneser-Ney model's highest order with nothing below it
to interpolate is the maximum-likelihood estimate (discount 0).
"""
import argparse
import collections
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

try:  # the optional 'baselines' extra: main() says how to install it, in one line
    import nltk
    from nltk.lm import MLE, KneserNeyInterpolated
    from nltk.util import everygrams
except ImportError:
    nltk = None

from common import interrupts
from common.config import Parser
from common.errors import DataError, UnsupportedError, cli_main
from common.lm_data import (DEFAULT_MAX_VOCAB, EVAL_BATCH_SIZE, PEOPLES_DAILY, UNK, UNK_ID, LMData,
                            batchify, prepare_lm_data, read_line)

PROG = "python -m studies.ngram_baseline"
# The highest --order. Beyond it a corpus the size of People's Daily holds almost no n-gram of the highest order
# twice, so Kneser-Ney has nothing left to estimate there: on its first 3,000 lines the estimated discount is 0.97 at
# order 5 and 0.99 at 10, and the validation perplexity is lowest at 3 and rises with every order after it. The fit's
# memory and time grow with the order (1.3 GB and 26 s at 10 on those lines; order 80 on 100 lines: 0.9 GB, 17 s).
MAX_ORDER = 10
START = "<s>"  # NLTK's padding symbol: the training stream's start


class ContinuationCounts:
    """NLTK ``KneserNey._continuation_counts(word, context)`` from an index: ``(N1+(• context word),
    N1+(• context •))``, the number of distinct words seen before ``context word``, and the sum of that over every
    word, read off the fitted model's n-gram counts of order ``len(context) + 2`` once, for orders 2 to ``order``."""

    def __init__(self, counts, order: int):
        before: dict[tuple[str, ...], collections.Counter] = collections.defaultdict(collections.Counter)
        for k in range(2, order + 1):
            for prefix, followers in counts[k].items():  # prefix: an n-gram's first k - 1 words
                context = prefix[1:]
                before[context].update(word for word, count in followers.items() if count > 0)
        self.index: dict[tuple[str, ...], tuple[collections.Counter, int]] = {
            context: (words, sum(words.values())) for context, words in before.items()}

    def __call__(self, word: str, context: tuple[str, ...] = ()) -> tuple[int, int]:
        words, total = self.index.get(context, ({}, 0))
        return words.get(word, 0), total


def estimated_discount(counts, order: int) -> float:
    """Ney, Essen and Kneser's estimate of the discount, ``n1 / (n1 + 2 n2)``, ``n_k`` the number of distinct
    n-grams of the highest ``order`` seen ``k`` times in training. No n-gram seen once (so the estimate is 0, and
    every unseen n-gram would get probability 0) is a :class:`DataError`. The n-gram that starts with ``<s>`` (seen
    once, always) is not one of the corpus's."""
    seen = collections.Counter(count for prefix, followers in counts[order].items() if prefix[0] != START
                               for count in followers.values())
    if not seen[1]:
        raise DataError(f"no {order}-gram occurs exactly once in the training split, so the discount cannot be "
                        f"estimated; pass --discount")
    return seen[1] / (seen[1] + 2 * seen[2])


def fit(stream: Sequence[str], order: int, discount: float | None = None):
    """NLTK's interpolated Kneser-Ney model of ``order`` (>= 2) fitted on ``stream`` (words, ``<eos>`` included) as
    one sequence after ``<s>``, with continuation counts indexed, and ``discount`` (None:
    :func:`estimated_discount`) for every order; ``order`` 1: NLTK's ``MLE`` unigram on ``stream``."""
    if order == 1:
        model = MLE(1)
        model.fit([everygrams(stream, max_len=1)], vocabulary_text=stream)
        return model
    text = [START, *stream]
    model = KneserNeyInterpolated(order, discount=1.0 if discount is None else discount)
    model.fit([everygrams(text, max_len=order)], vocabulary_text=text)
    if discount is None:  # known only once the counts are: set where the smoothing reads it
        model.estimator.discount = estimated_discount(model.counts, order)
    # The same counts NLTK's scan finds, looked up instead of recounted at every query.
    model.estimator._continuation_counts = ContinuationCounts(model.counts, order)
    return model


def columns(data: LMData, split: str) -> list[list[str]]:
    """The split's id stream as the neural model's evaluation batches it: ``EVAL_BATCH_SIZE`` columns, each a
    contiguous piece of the stream, as words."""
    ids = batchify(getattr(data, split), EVAL_BATCH_SIZE, split)  # (N // B, B)
    tokens = data.vocab.tokens
    return [[tokens[i] for i in column] for column in ids.T.tolist()]


def scored_ngrams(column: Sequence[str], order: int) -> list[tuple[str, ...]]:
    """``(context..., word)`` for every word of ``column`` but its first, the context the up to ``order - 1`` words
    before it."""
    return [tuple(column[max(0, i - order + 1): i + 1]) for i in range(1, len(column))]


def perplexity(model, cols: Sequence[Sequence[str]]) -> tuple[float, int]:
    """``(exp(mean -ln p(word | context)), tokens)`` over :func:`scored_ngrams` of every column."""
    logs = [math.log(model.score(ngram[-1], ngram[:-1]))
            for column in cols for ngram in scored_ngrams(column, model.order)]
    return math.exp(-math.fsum(logs) / len(logs)), len(logs)


def probability_sums(model, vocabulary: Sequence[str], contexts: Sequence[tuple[str, ...]]) -> list[float]:
    """``Σ_w p(w | context)`` over ``vocabulary`` for each context (1 for a normalised model)."""
    return [math.fsum(model.score(word, context) for word in vocabulary) for context in contexts]


def check_unk_seen(data: LMData) -> None:
    """An n-gram model gives a word it never saw in training probability 0: refuse ``<unk>`` in val or test when
    the training split has none (its vocabulary holds every training word)."""
    if (data.train == UNK_ID).any():
        return
    for split in ("val", "test"):
        if (getattr(data, split) == UNK_ID).any():
            raise DataError(f"{UNK} occurs in the {split} split but never in train (the vocabulary holds every "
                            f"training word), so an n-gram model gives it probability 0; use a --max-vocab below "
                            f"{len(data.vocab)}")


def measure(data: LMData, order: int, discount: float | None = None, normalisation_contexts: int = 3) -> dict:
    """Fit on train, score val and test; the probability sums over the vocabulary in the contexts of the first
    ``normalisation_contexts`` scored validation tokens."""
    check_unk_seen(data)
    cols = {split: columns(data, split) for split in ("val", "test")}  # refuses a split too short, before the fit
    tokens = data.vocab.tokens
    start = time.perf_counter()
    model = fit([tokens[i] for i in data.train], order, discount)
    fit_s = time.perf_counter() - start
    doc = {"library": "nltk", "library_version": nltk.__version__,
           "model": f"nltk.lm.{type(model).__name__}", "data": read_line(data), "order": order,
           "discount": model.estimator.discount if order > 1 else None,
           "discount_from": None if order == 1 else "n1 / (n1 + 2 n2)" if discount is None else "--discount",
           "eval_batch_size": EVAL_BATCH_SIZE, "fit_s": fit_s}
    start = time.perf_counter()
    for split in ("val", "test"):
        value, count = perplexity(model, cols[split])
        doc[split] = {"perplexity": value, "tokens": count}
    doc["score_s"] = time.perf_counter() - start
    contexts = [ngram[:-1] for ngram in scored_ngrams(cols["val"][0], order)[:normalisation_contexts]]
    sums = probability_sums(model, tokens, contexts)
    doc["normalisation"] = {"contexts": [list(c) for c in contexts], "sums": sums,
                            "max_abs_error": max(abs(s - 1) for s in sums)}
    return doc


def render(doc: dict) -> str:
    library = f"{doc['model']}, nltk {doc['library_version']}"
    model = (f"order-{doc['order']} interpolated Kneser-Ney ({library}), discount {doc['discount']:.4f} "
             f"({doc['discount_from']})" if doc["order"] > 1 else f"maximum-likelihood unigram ({library})")
    return "\n".join([
        doc["data"],
        f"{model}: fit in {doc['fit_s']:.1f} s, val and test scored in {doc['score_s']:.1f} s",
        *(f"{split} perplexity {doc[split]['perplexity']:.2f} over {doc[split]['tokens']:,} tokens"
          for split in ("val", "test")),
        f"probabilities sum to 1 within {doc['normalisation']['max_abs_error']:.1e} over the vocabulary in "
        f"{len(doc['normalisation']['sums'])} contexts"])


def order_value(text: str) -> int:
    value = int(text)  # a ValueError is argparse's "invalid int value: 'x'"
    if not 1 <= value <= MAX_ORDER:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_ORDER} (beyond {MAX_ORDER}, hardly any n-gram "
                                         f"of the highest order occurs twice: nothing to estimate), got {value}")
    return value


order_value.__name__ = "int"  # how argparse names a value that is not one


def discount_value(text: str) -> float:
    value = float(text)  # a ValueError is argparse's "invalid discount (0 < D <= 1) value: 'x'"
    if not 0 < value <= 1:
        raise ValueError(text)
    return value


discount_value.__name__ = "discount (0 < D <= 1)"  # how argparse names a refused value


@cli_main
def main(argv: list[str]) -> int:
    from common.files import Output, atomic_file, check_outputs

    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=PEOPLES_DAILY,
                        help="the corpus: peoples_daily or a file (default: %(default)s)")
    parser.add_argument("--max-vocab", type=int, default=DEFAULT_MAX_VOCAB,
                        help="vocabulary size, <unk> and <eos> included; 0: every training word (default: %(default)s)")
    parser.add_argument("--order", type=order_value, default=3, help=f"n, 1 to {MAX_ORDER} (default: %(default)s): "
                        f"beyond {MAX_ORDER}, a corpus the size of People's Daily holds hardly any n-gram of the "
                        f"highest order twice, so Kneser-Ney has no data to estimate it from, and the fit's memory "
                        f"and time grow with n")
    parser.add_argument("--discount", type=discount_value,
                        help="Kneser-Ney's absolute discount, 0 < D <= 1, one for every order (default: estimated from "
                             "the training counts of the highest order, n1 / (n1 + 2 n2))")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON to this file")
    parser.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    args = parser.parse_args(argv)
    if args.out:  # before the minute of fitting
        check_outputs([Output("--out", args.out, directory=False, contents="the perplexities")], args.overwrite)
    if nltk is None:
        raise UnsupportedError("the n-gram baseline needs NLTK: pip install nltk (or the project's 'baselines' "
                               "extra: pip install '.[baselines]')")
    data = prepare_lm_data(args.data, args.max_vocab)
    doc = {"command": " ".join([PROG, *map(shlex.quote, argv)]), **measure(data, args.order, args.discount)}
    print(render(doc))
    if args.out:
        atomic_file(args.out, lambda tmp: tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n",
                                                         encoding="utf-8"))
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main(sys.argv[1:]))

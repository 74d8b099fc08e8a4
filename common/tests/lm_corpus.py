"""A small corpus for the language model's tests: sentences of a tiny grammar, seeded, in the corpus format (one
sentence per line, words separated by spaces, some tagged ``word/tag`` as People's Daily is)."""
from pathlib import Path
from typing import Any

import numpy as np

SUBJECTS = ("猫/n", "狗/n", "老师/n", "学生/n", "我们/r")
VERBS = ("喜欢/v", "看见/v", "追/v", "吃/v")
OBJECTS = ("鱼/n", "书/n", "球/n", "饭/n", "中国/ns", "人民/n")
ENDINGS = ("。/w", "！/w")

# The example's recipe at toy sizes (lr 5: at 20 a model this small jumps by whole nats), a few seconds a run on
# 2 cores. --max-vocab 0 keeps every word.
LM_TINY: dict[str, Any] = dict(workload="lm", embed_dim=8, hidden_dim=8, layers=2, batch_size=4, bptt=5, epochs=2,
                               dropout=0.2, optimizer="sgd", lr=5.0, clip=0.25, lr_decay=4.0, max_vocab=0,
                               log_every=0, progress=False, device="cpu")


def write_lm_corpus(path: Path, lines: int = 120, seed: int = 0) -> Path:
    """``lines`` sentences, subject verb object [object] ending, into ``path``."""
    rng = np.random.default_rng(seed)
    pick = lambda words: words[rng.integers(len(words))]  # noqa: E731
    text = []
    for _ in range(lines):
        words = [pick(SUBJECTS), pick(VERBS), pick(OBJECTS)]
        if rng.random() < 0.3:
            words.append(pick(OBJECTS))
        text.append("  ".join([*words, pick(ENDINGS)]))
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def lm_args(corpus: Path, **changes: Any) -> list[str]:
    """The command line of :data:`LM_TINY` (with ``changes``) on ``corpus``."""
    settings = {**LM_TINY, "data": str(corpus), **changes}
    args = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else f"--no-{name.replace('_', '-')}")
        else:
            args += [flag, str(value)]
    return args

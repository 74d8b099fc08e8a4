"""Will the run fit in memory? An estimate from the Config, checked before anything of that size is allocated, so a
size beyond the machine (``--hidden-dim 99999999999``) is one line instead of a ``MemoryError`` deep in numpy.

The estimate counts what grows with the sizes, each with a stated factor, and no framework's internals. The
classifier's: parameters, the texts as encoded arrays, and one batch's activations. The language model's: parameters,
one window's activations and its logits over the vocabulary, and the word streams.
"""
import math
import os
import resource
from pathlib import Path

from common.config import LM_DEFAULTS, Config, flag
from common.errors import ConfigError
from common.lm_data import EVAL_BATCH_SIZE
from common.params import GATES, lm_param_shapes
from common.params import param_shapes

# Weights, gradients and Adam's two moments, plus the initialisation's float64 draw (as much as two float32 copies).
PARAMETER_COPIES = 6
# Per token: the embedding (E) and, per layer, the four gates, h and c (6H), kept by the forward pass for the
# backward pass; twice, for what the backward pass makes while it runs.
ACTIVATION_COPIES = 2
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1


def run_bytes(cfg, vocab_size: int, texts: int) -> dict[str, int]:
    """Bytes a run of ``cfg`` needs, by what needs them, for ``vocab_size`` tokens and ``texts`` texts."""
    item = 8 if cfg.dtype == "float64" else 4  # bfloat16 runs keep float32 parameters
    # Every layer after the first has the same shapes: counted from one and two layers, so that the estimate
    # takes no longer for --layers 10**30 (refused) than for 2.
    one, two = (sum(map(math.prod, param_shapes(vocab_size, cfg.embed_dim, cfg.hidden_dim, layers).values()))
                for layers in (1, 2))
    params = one + (cfg.layers - 1) * (two - one)
    per_token = cfg.embed_dim + 6 * cfg.hidden_dim * cfg.layers
    return {"parameters with their gradients and Adam's state": PARAMETER_COPIES * item * params,
            "a batch's activations": ACTIVATION_COPIES * item * cfg.batch_size * cfg.seq_len * per_token,
            "the encoded texts": 4 * texts * cfg.seq_len}  # int32 token ids


# The language model: weights, gradients and the initialisation's float64 draw (as much as two float32 copies), and
# Adam's two moments under --optimizer adam (plain SGD keeps none).
LM_PARAMETER_COPIES = {"sgd": 4, "adam": 6}
# Per token of a window: the logits over the vocabulary, their log-softmax and the logits' gradient.
LOGITS_COPIES = 3
LM_SIZE_FIELDS = ("embed_dim", "hidden_dim", "layers", "bptt", "batch_size", "max_vocab")


def _lm_parameters(cfg, vocab_size: int) -> int:
    """The language model's parameter count, from one and two layers (every layer above the first has the same
    shapes), so that --layers 10**12 takes no longer to count than 2."""
    one, two = (sum(map(math.prod, lm_param_shapes(vocab_size, cfg.embed_dim, cfg.hidden_dim, layers, cfg.cell,
                                                  cfg.tied).values())) for layers in (1, 2))
    return one + (cfg.layers - 1) * (two - one)


def lm_run_bytes(cfg, vocab_size: int, streams: tuple[int, int, int]) -> dict[str, int]:
    """Bytes a language-model run of ``cfg`` needs, by what needs them, for a vocabulary of ``vocab_size`` and
    ``streams``, the train, val and test streams' lengths in words (``<eos>`` included). A window is ``min(--bptt,
    rows - 1)`` rows of the batchified stream (its ``B`` columns: --batch-size in training, 10 in evaluation; a
    --bptt beyond the stream is one window of all of it); training's or evaluation's, whichever holds more tokens,
    counted with training's copies."""
    item = 8 if cfg.dtype == "float64" else 4
    window = max(min(cfg.bptt, max(1, length // columns - 1)) * columns
                 for length, columns in zip(streams, (cfg.batch_size, EVAL_BATCH_SIZE, EVAL_BATCH_SIZE)))
    # Per token: the embedding (E) and, per layer, the gates, h and c (G + 2 rows of H), kept for the backward pass.
    per_token = cfg.embed_dim + (GATES[cfg.cell] + 2) * cfg.hidden_dim * cfg.layers
    return {"parameters with their gradients and optimizer state":
            LM_PARAMETER_COPIES[cfg.optimizer] * item * _lm_parameters(cfg, vocab_size),
            "a window's activations": ACTIVATION_COPIES * item * window * per_token,
            "its logits over the vocabulary": LOGITS_COPIES * item * window * vocab_size,
            "the word streams": 4 * sum(streams)}  # int32 ids


def _lm_default(name: str):
    return LM_DEFAULTS.get(name, Config.__dataclass_fields__[name].default)


def check_lm_fits(cfg, vocab_size: int, streams: tuple[int, int, int]) -> None:
    """Raise :class:`ConfigError` when :func:`lm_run_bytes` exceeds :func:`available_bytes`, naming the size flag
    whose value costs the most (the one that, back at the language model's default, saves the most), what the run
    needs and what there is."""
    need, have = lm_run_bytes(cfg, vocab_size, streams), available_bytes()
    total = sum(need.values())
    if total <= have:
        return

    def saved(name: str) -> int:
        default = _lm_default(name)
        if name == "max_vocab":  # the vocabulary the default limit would give
            return total - sum(lm_run_bytes(cfg, min(vocab_size, default), streams).values())
        smaller = cfg.replace(**{name: default}, **({"embed_dim": default, "hidden_dim": default} if cfg.tied and
                                                    name in ("embed_dim", "hidden_dim") else {}))
        return total - sum(lm_run_bytes(smaller, vocab_size, streams).values())

    culprit = max(LM_SIZE_FIELDS, key=saved)
    sizes = ", ".join(f"--{flag(name)} {getattr(cfg, name)}" for name in LM_SIZE_FIELDS if name != "max_vocab")
    parts = ", ".join(f"{what} {human(size)}" for what, size in need.items())
    raise ConfigError(
        f"--{flag(culprit)} {getattr(cfg, culprit)} is too large: the language model ({sizes}, a vocabulary of "
        f"{vocab_size:,}, {streams[0]:,} training words) needs about {human(total)} of memory ({parts}), more than "
        f"the {human(have)} this process can have; make --{flag(culprit)} smaller")


def available_bytes() -> int:
    """The most memory this process can have: the machine's, within its container's cgroup limit and its
    address-space limit."""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    for path in CGROUP_LIMITS:
        try:
            limits.append(int(Path(path).read_text()))
        except (OSError, ValueError):  # no such file, or "max": no limit
            pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return min(limits + ([soft] if soft != resource.RLIM_INFINITY else []))


def human(size: float) -> str:
    """``1536`` → ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.4g} {unit}"
        size /= 1024


def check_fits(cfg, vocab_size: int, texts: int) -> None:
    """Raise :class:`ConfigError` when :func:`run_bytes` exceeds :func:`available_bytes`, saying both."""
    need, have = run_bytes(cfg, vocab_size, texts), available_bytes()
    if sum(need.values()) > have:
        parts = ", ".join(f"{what} {human(size)}" for what, size in need.items())
        raise ConfigError(
            f"--embed-dim {cfg.embed_dim}, --hidden-dim {cfg.hidden_dim}, --layers {cfg.layers}, --seq-len "
            f"{cfg.seq_len} and --batch-size {cfg.batch_size}, with a vocabulary of {vocab_size} and {texts} texts, "
            f"need about {human(sum(need.values()))} of memory ({parts}), more than the {human(have)} this process "
            f"can have; make the largest of them smaller")

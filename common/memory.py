"""Will the run fit in memory? An estimate from the Config, checked before anything of that size is allocated, so a
size beyond the machine (``--hidden-dim 99999999999``) is one line instead of a ``MemoryError`` deep in numpy.

The estimate counts what grows with the sizes, each with a stated factor, and no framework's internals:
parameters, the texts as encoded arrays, and one batch's activations.
"""
import math
import os
import resource
from pathlib import Path

from common.errors import ConfigError
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

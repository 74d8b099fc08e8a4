"""The PyTorch twin's device and float rules: which device and dtype a flag means, which LSTM kernel ``nn.LSTM`` runs,
PyTorch's autocast for ``--dtype bfloat16``, and the process-wide switches (denormal flushing, TF32) that make PyTorch
compute what XLA computes."""
import sys
from contextlib import ExitStack, contextmanager
from typing import Iterator

import torch

from common.config import Config
from common.errors import ConfigError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.float32}
CUDNN_BFLOAT16_RNN = 91300  # the first cuDNN whose RNN takes bfloat16 (9.13)


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when PyTorch sees a GPU, else the CPU; ``gpu``/``cuda``: CUDA or a ConfigError."""
    if name == "tpu":
        raise ConfigError("--device tpu is not supported by torch_impl (use jax_impl, or --device cpu/gpu)")
    if name in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: PyTorch sees no CUDA GPU here (torch {torch.__version__}); "
                          f"use --device cpu or auto")
    return torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")


def resolve_dtype(name: str) -> torch.dtype:
    """``--dtype`` → the dtype of the parameters, the carry and the loss: float32 under bfloat16, whose forward pass
    runs under :func:`autocast`."""
    if name not in DTYPES:
        raise ConfigError(f"--dtype {name} is not supported by torch_impl (use float32, bfloat16 or float64)")
    return DTYPES[name]


def lacks_bfloat16_lstm(device: torch.device) -> bool:
    """Whether ``nn.LSTM``'s fused kernel on ``device`` cannot compute bfloat16: oneDNN on a CPU without oneDNN's
    bfloat16, cuDNN before 9.13."""
    if device.type == "cuda":
        return (torch.backends.cudnn.version() or 0) < CUDNN_BFLOAT16_RNN
    return not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def lstm_kernel(cfg: Config, device: torch.device) -> str:
    """The kernel ``nn.LSTM`` runs (a key of ``common.precision.BFLOAT16_RULES``): cuDNN on a GPU, oneDNN on the
    CPU, and PyTorch's ATen cell ("native") for packed sequences on the CPU (--padding right) and, under bfloat16,
    where the fused kernel cannot take it (:func:`lacks_bfloat16_lstm`)."""
    if cfg.dtype == "bfloat16" and lacks_bfloat16_lstm(device):
        return "native"
    if device.type == "cuda":
        return "cudnn"
    return "native" if cfg.padding == "right" else "onednn"


@contextmanager
def autocast(dtype: str, device: torch.device) -> Iterator[None]:
    """The forward pass's numerics: nothing for float32 and float64; for bfloat16 ``torch.autocast``, and with
    oneDNN (or cuDNN) off where their LSTM cannot take bfloat16. Autocast alone would not fall back: ``nn.LSTM`` picks
    oneDNN for the float32 input it is given, then autocast hands oneDNN bfloat16, and creating the primitive fails."""
    if dtype != "bfloat16":
        yield
        return
    with ExitStack() as stack:
        stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
        if lacks_bfloat16_lstm(device):
            backend = torch.backends.cudnn if device.type == "cuda" else torch.backends.mkldnn
            stack.callback(setattr, backend, "enabled", backend.enabled)
            backend.enabled = False
        yield


def set_numerics(cfg: Config, device: torch.device) -> dict[str, bool]:
    """Put PyTorch's process-wide float rules where ``cfg`` says, and return what is in force. Both differ from
    JAX's by default: XLA flushes denormals to zero on the CPU (PyTorch keeps them, which makes backward through
    long sequences many times slower on some CPUs), and JAX at HIGHEST never uses TF32 (PyTorch lets cuDNN).

    ``torch.set_flush_denormal`` sets the calling thread's flags only. The intra-op threads (OpenMP's, which MKL
    and oneDNN run on too) copy them from the thread that starts them, at the process's first parallel op, and keep
    them. So call this before anything parallel runs (the twins do, before building the model); the returned
    ``flush_denormal`` is measured on every intra-op thread (:func:`denormals_flushed`), not taken from the flag."""
    torch.set_flush_denormal(cfg.flush_denormal)  # returns False where the CPU cannot flush (then nothing is)
    torch.backends.cuda.matmul.allow_tf32 = cfg.allow_tf32
    torch.backends.cudnn.allow_tf32 = cfg.allow_tf32
    flushed = denormals_flushed() if device.type == "cpu" else None  # a CPU switch only
    if device.type == "cpu" and flushed is not cfg.flush_denormal:
        where = {True: "all", False: "none", None: "only some"}[flushed]
        flag = "--flush-denormal" if cfg.flush_denormal else "--no-flush-denormal"
        print(f"warning: {where} of PyTorch's intra-op threads flush denormals, against {flag} (threads started before "
              f"it was set keep their own rule; the run record says what is in force)", file=sys.stderr)
    return {"flush_denormal": bool(flushed), "allow_tf32": cfg.allow_tf32}


def denormals_flushed() -> bool | None:
    """True when every intra-op thread flushes denormals to zero, False when none does, None when some do: a
    float32 GEMM split over the threads, each of whose products is a denormal, comes out zero exactly where the
    thread that computed it flushes."""
    a = torch.full((512, 512), 1e-21)  # products 1e-42, sums 5e-40: all below float32's smallest normal, 1.2e-38
    zero = (a @ a == 0).float().mean().item()
    return True if zero == 1.0 else False if zero == 0.0 else None

"""Which recurrence computes a run: the one owner of ``--lstm-impl``, for both workloads. Every condition an
implementation puts on a run is written here once, in :func:`obstacle`; naming an implementation that has one is
refused with it (:func:`resolve`), and ``auto`` passes over one that has one (:func:`auto`).

    resolve("auto", Run())                    → "kernel" or "fused" (the classifier's default on the CPU, float32)
    resolve("onednn", Run(padding="right"))   → UnsupportedError: --lstm-impl onednn: it takes no sequence lengths ...
    resolve("fused", Run("lm", cell="gru"))   → UnsupportedError: --lstm-impl fused: it computes the LSTM ...
    auto(Run(workload="lm"))                  → ("scan", why)
    resolve("auto", Run(flax_api="nnx"))      → "flax" (nnx.RNN over Flax's stock cell: the only one NNX runs)

The implementations, each a module of this package that computes and never decides where it may run (see the
package's docstring): ``fused``, ``scan`` and ``flax`` (``stacks``), ``cudnn``, ``onednn``, ``kernel``. Under
``--flax-api nnx`` the classifier is :mod:`jax_impl.nnx_model`, Flax's stock cell under ``nnx.RNN``, and what it cannot
serve is refused here too (:func:`nnx_obstacle`).
"""
from dataclasses import dataclass

import jax

from common.errors import ConfigError, UnsupportedError
from jax_impl.recurrences import cudnn, kernel, native, onednn
from jax_impl.recurrences.layers import LAYERS

# What each workload's model can run: the classifier's stacks (jax_impl.model.STACKS) read the final carries; the
# language model's layers (jax_impl.recurrences.layers.LAYERS) every step's output, and per cell.
IMPLS = {"classifier": ("fused", "scan", "flax", "cudnn", "onednn", "kernel"), "lm": tuple(LAYERS)}
NATIVE = {"onednn": onednn.NAME, "kernel": kernel.NAME}  # the implementations behind a library of ours


@dataclass(frozen=True)
class Run:
    """What an implementation must serve: ``workload``, ``dtype`` (``--dtype``), ``platform`` (the run's JAX
    platform; None: JAX's default backend's), ``padding`` (``--padding``), ``devices`` (the mesh's size) and ``cell``
    (the language model's ``--cell``) and ``flax_api`` (``--flax-api``: linen, or nnx)."""

    workload: str = "classifier"
    dtype: str = "float32"
    platform: str | None = None
    padding: str = "left"
    devices: int = 1
    cell: str = "lstm"
    flax_api: str = "linen"

    @classmethod
    def of(cls, cfg, platform: str | None = None, devices: int = 1) -> "Run":
        """What ``cfg``'s run asks of a recurrence on ``platform`` over a mesh of ``devices``."""
        return cls(cfg.workload, cfg.dtype, platform, cfg.padding, devices, cfg.cell, cfg.flax_api)

    @property
    def backend(self) -> str:
        return self.platform or jax.default_backend()


def obstacle(impl: str, run: Run) -> str | None:
    """Why ``impl`` cannot compute ``run``, in words that follow "it" (None: it can). The library of a native
    implementation is validated (:func:`jax_impl.recurrences.native.validated`) only once nothing else stands in the
    way."""
    if impl not in IMPLS[run.workload]:
        return (f"it serves the classifier only: its stack returns the final carries, and no GPU was at hand to test "
                f"a layer returning every step's (the language model runs {', '.join(IMPLS['lm'])})")
    if run.workload == "lm" and run.cell not in LAYERS[impl]:
        return (f"it computes the LSTM cell only; a GRU runs "
                f"{' or '.join(name for name in LAYERS if run.cell in LAYERS[name])}")
    if impl == "fused" and run.dtype == "bfloat16":
        return "it does not implement bfloat16's mixed precision (float32 parameters and carry); use scan or auto"
    if impl == "cudnn":
        if run.backend not in ("gpu", "cuda"):
            return f"it needs a CUDA GPU, and this backend is {run.backend}"
        if run.dtype == "bfloat16":
            return f"it cannot compute bfloat16: jax.experimental.rnn says \"{cudnn.bfloat16_refusal()}\"; use auto"
        if run.dtype != "float32":
            return f"it computes float32 only, not {run.dtype}; use auto"
    if impl in NATIVE:
        if run.backend != "cpu":
            return f"it is a CPU kernel, and this backend is {run.backend}"
        dtypes = ("float32", "bfloat16") if impl == "onednn" else ("float32",)
        if run.dtype not in dtypes:
            return f"it computes {' or '.join(dtypes)} only, not {run.dtype}; use scan or auto"
        if impl == "onednn" and run.padding == "right":
            return ("it takes no sequence lengths (--padding right): oneDNN's RNN primitive has none, and PyTorch runs "
                    "packed sequences on its ATen cell instead")
        if run.devices > 1:
            return "it runs on one device: XLA cannot split a custom call over a mesh"
        unavailable = native.unavailable(NATIVE[impl]) or (kernel.isa_problem() if impl == "kernel" else None)
        if unavailable:
            return unavailable
        if impl == "onednn" and run.dtype == "bfloat16" and not onednn.has_bfloat16():
            return "this CPU's oneDNN has no bfloat16 LSTM (it refused the primitive); use scan or auto"
    return None


def nnx_obstacle(run: Run) -> str | None:
    """Why the classifier written in Flax NNX (:mod:`jax_impl.nnx_model`) cannot compute ``run``, in words that follow
    "it" (None: it can). It runs Flax's stock cell in float32 or float64 on one device, either padding."""
    if run.workload != "classifier":
        return "it is the classifier's; the language model is written in linen (leave --flax-api linen)"
    if run.dtype == "bfloat16":
        return ("it computes float32 or float64: PyTorch's bfloat16 autocast rules are implemented in linen's scan "
                "stack only (use --flax-api linen)")
    if run.devices > 1:
        return f"it runs on one device, not a mesh of {run.devices} (pass --devices 1, or --flax-api linen)"
    return None


def auto(run: Run) -> tuple[str, str]:
    """``--lstm-impl auto``'s choice for ``run`` and why. The language model: XLA's fused recurrence for the LSTM,
    whose recurrence part measured the fastest JAX one, or level with it, at both of the example's sizes
    (``docs/language-model.md``), and ``scan`` for the GRU (no tuned GRU exists). The classifier: under bfloat16
    ``scan`` (PyTorch's mixed precision, which the fused recurrence and the kernel do not implement); our kernel where
    nothing stands in its way and it runs its AVX-512 or AVX2 tiles, the fastest on the CPUs measured
    (``benchmarks/PERFORMANCE.md``); else XLA's fused recurrence. Under ``--flax-api nnx``: Flax's stock cell, the one
    the NNX model runs."""
    if run.flax_api == "nnx":
        return "flax", "Flax NNX: nnx.RNN over Flax's stock nnx.OptimizedLSTMCell, the one cell the NNX model runs"
    if run.workload == "lm":
        if run.cell == "gru":
            return "scan", "the GRU's reference recurrence (Flax nn.RNN over PyTorch's GRU cell): no tuned GRU exists"
        return "fused", ("XLA's fused recurrence: the language model's fastest JAX recurrence, or level with it, at "
                         "both sizes measured (docs/language-model.md)")
    if run.dtype == "bfloat16":
        return "scan", "bfloat16: the scan stack computes PyTorch's mixed precision"
    passed_over = obstacle("kernel", run) or (
        "it runs its portable path here (no AVX2 tiles), measured slower than XLA's (benchmarks/PERFORMANCE.md)"
        if kernel.isa() == "portable" else None)
    if passed_over is None:
        return "kernel", f"our kernel: float32 on one CPU device, with its {kernel.GEMMS[kernel.isa()]}"
    return "fused", f"XLA's fused recurrence, not our kernel: {passed_over}"


def resolve(name: str, run: Run) -> str:
    """``--lstm-impl`` → the implementation that runs: ``auto``'s choice, or ``name`` itself where nothing stands in
    its way; otherwise an :class:`UnsupportedError` saying what does, in one line. Under ``--flax-api nnx`` that is
    ``flax`` (``auto`` or ``flax``; any other name is a :class:`ConfigError`), where :func:`nnx_obstacle` has none."""
    if run.flax_api == "nnx":
        why = nnx_obstacle(run)
        if why:
            raise UnsupportedError(f"--flax-api nnx: {why}")
        if name not in ("auto", "flax"):
            raise ConfigError(f"--lstm-impl {name} is linen's: under --flax-api nnx the LSTM is nnx.RNN over Flax's "
                              f"stock cell (leave --lstm-impl auto, or pass --flax-api linen)")
        return "flax"
    if name == "auto":
        return auto(run)[0]
    if name not in IMPLS["classifier"]:
        raise ConfigError(f"--lstm-impl must be one of auto, {', '.join(IMPLS['classifier'])}, got {name!r}")
    why = obstacle(name, run)
    if why:
        raise UnsupportedError(f"--lstm-impl {name}: {why}")
    return name

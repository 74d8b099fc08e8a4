"""Which recurrence computes a run: the one owner of ``--lstm-impl``, for both workloads. :data:`REGISTRY` is the only
list of implementations; what each puts on a run is its own declaration (:class:`.interface.Recurrence`), which
:func:`obstacle` reads. Naming an implementation that has an obstacle is refused with it (:func:`resolve`), and
``auto`` passes over one that has one (:func:`auto`).

    resolve("auto", Run())                    → "kernel" or "fused" (the classifier's default on the CPU, float32)
    resolve("onednn", Run(padding="right"))   → UnsupportedError: --lstm-impl onednn: it takes no sequence lengths ...
    resolve("fused", Run("lm", cell="gru"))   → UnsupportedError: --lstm-impl fused: it computes the LSTM cell only ...
    auto(Run(workload="lm"))                  → ("fused", why)
    resolve("auto", Run(flax_api="nnx"))      → "flax" (nnx.RNN over Flax's stock cell: the only one NNX runs)

Under ``--flax-api nnx`` the classifier is :mod:`jax_impl.nnx_model`, Flax's stock cell under ``nnx.RNN``, and what it
cannot serve is refused here too (:func:`nnx_obstacle`). ``LSTM_KERNEL_ISA`` (the kernel's forced instruction set) is
checked whatever runs: a value that names none, or one this CPU cannot run, is refused.
"""
import importlib.metadata
from dataclasses import dataclass

import jax

from common.errors import ConfigError, UnsupportedError
from jax_impl.recurrences import cudnn, fused, kernel, native, onednn, scan, stock
from jax_impl.recurrences.interface import Recurrence

NNX_FLAX = "0.12.7"  # the first Flax release with everything of NNX the model and its step call
NNX_NEEDS = ("List", "as_pure")  # of those, what older releases lack
REGISTRY: dict[str, Recurrence] = {r.name: r for r in (fused.RECURRENCE, scan.RECURRENCE, stock.RECURRENCE,
                                                        cudnn.RECURRENCE, onednn.RECURRENCE, kernel.RECURRENCE)}


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
    """Why ``impl`` cannot compute ``run``, in words that follow "it" (None: it can), from its declaration: the
    cell, the platform, the dtype, sequence lengths, a mesh, then its own check (a library is validated only once
    nothing else stands in the way)."""
    r = REGISTRY[impl]
    words = lambda key: r.why.get(key, "").format(dtype=run.dtype, backend=run.backend)  # noqa: E731
    if run.cell not in r.layers:
        runs = " or ".join(name for name, other in REGISTRY.items() if run.cell in other.layers)
        return f"it computes the {' and '.join(r.layers).upper()} cell only; a {run.cell.upper()} runs {runs}"
    if r.platforms is not None and run.backend not in r.platforms:
        return words("platform")
    if run.dtype not in r.dtypes:
        return r.why.get(run.dtype) or words("dtype")
    if run.padding == "right" and not r.lengths:
        return words("lengths")
    if run.devices > 1 and not r.mesh:
        return words("mesh")
    return r.check(run.dtype) if r.check else None


def nnx_obstacle(run: Run) -> str | None:
    """Why the classifier written in Flax NNX (:mod:`jax_impl.nnx_model`) cannot compute ``run``, in words that follow
    "it" (None: it can). It runs Flax's stock cell in float32 or float64 on one device, either padding, on a Flax
    whose NNX has :data:`NNX_NEEDS` (:data:`NNX_FLAX` and later)."""
    from flax import nnx

    missing = [name for name in NNX_NEEDS if not hasattr(nnx, name)]
    if missing:
        return (f"it needs Flax {NNX_FLAX} or later ({' and '.join(f'nnx.{m}' for m in missing)} missing in flax "
                f"{importlib.metadata.version('flax')}); upgrade flax, or leave --flax-api linen")
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
    (``docs/performance.md``); else XLA's fused recurrence. Under ``--flax-api nnx``: Flax's stock cell, the one
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
        "it runs its portable path here (no AVX2 tiles), measured slower than XLA's (docs/performance.md)"
        if kernel.isa() == "portable" else None)
    if passed_over is None:
        return "kernel", f"our kernel: float32 on one CPU device, with its {kernel.GEMMS[kernel.isa()]}"
    return "fused", f"XLA's fused recurrence, not our kernel: {passed_over}"


def forced_isa_problem() -> str | None:
    """Why ``LSTM_KERNEL_ISA`` cannot be honoured, whatever runs: a value naming no instruction set, or one this CPU
    cannot run (None: unset, or runnable, or no kernel library here to run it)."""
    try:
        if kernel.requested_isa() is None or native.unavailable(kernel.NAME):
            return None
    except UnsupportedError as err:
        return str(err)
    return kernel.isa_problem()


def resolve(name: str, run: Run) -> str:
    """``--lstm-impl`` → the implementation that runs: ``auto``'s choice, or ``name`` itself where nothing stands in
    its way; otherwise an :class:`UnsupportedError` saying what does, in one line. Under ``--flax-api nnx`` that is
    ``flax`` (``auto`` or ``flax``; any other name is a :class:`ConfigError`), where :func:`nnx_obstacle` has none."""
    forced = forced_isa_problem()
    if forced:
        raise UnsupportedError(forced)
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
    if name not in REGISTRY:
        raise ConfigError(f"--lstm-impl must be one of auto, {', '.join(REGISTRY)}, got {name!r}")
    why = obstacle(name, run)
    if why:
        raise UnsupportedError(f"--lstm-impl {name}: {why}")
    return name

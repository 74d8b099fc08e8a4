"""What a benchmark run measures: the variants (each a set of Config fields: exactly what a trainer can be asked to
run), their tiers and the headline comparisons they take part in, the sweeps of one Config field, and the quick
configuration."""
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from common.config import Config
from common.errors import ConfigError

FRAMEWORKS = ("torch", "jax")
BOTH = ("cpu", "gpu")
GPU = ("gpu",)
BASELINE = "torch:eager"  # every comparison's denominator: PyTorch's nn.LSTM, flushed like XLA
BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
# The tiers a row belongs to, in the report's order.
TIERS = {"stock": "the framework's standard modules, differentiated by the framework",
         "tuned": "our hand-written recurrence (custom VJP), the same function",
         "vendor": "the vendor's fused LSTM kernel, the one nn.LSTM runs (oneDNN on the CPU, cuDNN on a GPU)",
         "kernel": "JAX with a custom kernel: our own recurrence kernel through XLA's FFI, the rest in XLA",
         "compiled": "the stock model through the framework's compiler"}
# The tier of the JAX implementation a row ran (its record's lstm_impl): jax:jit runs --lstm-impl auto's choice.
IMPL_TIERS = {"flax": "stock", "scan": "stock", "fused": "tuned", "cudnn": "vendor", "onednn": "vendor",
              "kernel": "kernel"}


@dataclass(frozen=True)
class Headline:
    """One of the sentences that open the report: a comparison against :data:`BASELINE` that a variant joins by
    naming it in :attr:`Variant.headline`."""

    sentence: str  # the whole sentence: {members} its variants' phrases joined by "; ", {baseline} the baseline
    member: str  # one variant's phrase: {label}, {wording} (Variant.wording) and {speeds}, its ratios with their
    # intervals ("trains at 1.02× [0.99–1.06] and infers at 0.73× [0.69–0.76] the speed of torch:eager"), then where
    # measured its training speed against its Variant.versus and its nnx.jit overhead (results.tier_sentences)
    tier: str  # the tier (a key of TIERS) a variant's row must have run in to be named
    fastest: bool = False  # only the fastest-training of its variants (a tie: the first in VARIANTS), else every one


# The headline comparisons, in the report's order. A variant takes part in those its `headline` names wherever its
# training step was compared with the baseline (no fallback), ran in the comparison's tier and stayed within its
# parity band; a sentence with no variant to name is left out. A new comparison is one more entry here.
HEADLINES = {
    "stock": Headline("Stock against stock, {baseline} being PyTorch's {torch_module}: {members}.",
                      "{wording} ({label}) {speeds}", "stock"),
    "best tuned": Headline("Best tuned JAX against stock PyTorch: {members}.", "{label} {speeds}", "tuned",
                           fastest=True),
    "same algorithm": Headline("The same algorithm as nn.LSTM, hand-tuned {members}.", "({label}), {speeds}", "tuned"),
    "vendor kernel": Headline("Vendor kernel against vendor kernel, {baseline} running nn.LSTM on the same library: "
                              "{members}.", "{wording} ({label}) {speeds}", "vendor"),
    "compiled": Headline("Compiled: {members}.", "{wording} ({label}) {speeds}", "compiled"),
    "kernel": Headline("JAX with a custom kernel against stock PyTorch: {members}.", "{wording} ({label}) {speeds}",
                       "kernel"),
}


@dataclass(frozen=True)
class Variant:
    framework: str
    name: str
    tier: str  # a key of TIERS: its rows' unless the JAX implementation they ran has another (IMPL_TIERS)
    description: str
    default_on: tuple[str, ...] = ()  # devices ("cpu", "gpu") where a run without --variants includes it
    changes: dict = field(default_factory=dict)  # Config fields it sets (what the trainers would be given)
    kernel: dict = field(default_factory=dict)  # device (or "device:dtype") -> what its provenance must name, or the
    # row is a fallback
    main: bool = False  # sweeps run it
    few_steps: bool = False  # slow by design: one training step per round
    headline: tuple[str, ...] = ()  # the headline comparisons (keys of HEADLINES) it takes part in
    wording: str = ""  # how those sentences name it, where their member phrase asks for {wording} ({flax_cell}: the
    # Flax cell of the run's --cell, CELL_WORDS)
    lm_description: str = ""  # what it runs under --workload lm, where that differs from the description
    versus: str = ""  # the label of a variant its headline phrase also measures it against (paired rounds, training)

    @property
    def label(self) -> str:
        return f"{self.framework}:{self.name}"


VARIANTS = (
    Variant("torch", "eager", "stock", "nn.LSTM as torch_impl.train runs it (oneDNN on the CPU, cuDNN on a GPU: "
            "stock and vendor kernel at once), denormals flushed to zero as XLA does", BOTH,
            kernel={"gpu": "_cudnn_rnn"}, main=True,
            lm_description="pytorch/examples' RNNModel as torch_impl.train runs it: nn.Embedding, nn.LSTM (oneDNN on "
            "the CPU) or nn.GRU (ATen's own cell on the CPU), nn.Linear decoder and F.cross_entropy; cuDNN on a GPU; "
            "denormals flushed to zero as XLA does"),
    Variant("torch", "eager-defaults", "stock", "the same with PyTorch's defaults (denormals kept), one training "
            "step per round", changes={"flush_denormal": False}, few_steps=True),
    Variant("torch", "compile", "compiled", "torch.compile(model), default settings (--torch-compile); timed only "
            "where Dynamo compiles the LSTM", BOTH, {"torch_compile": True},
            {"cpu": "dynamo:lstm", "gpu": "dynamo:lstm"}, headline=("compiled",), wording="torch.compile"),
    Variant("jax", "flax", "stock", "what a Flax user writes: nn.RNN over Flax's nn.OptimizedLSTMCell (each step "
            "projects its input inside the loop), differentiated by JAX, fed PyTorch's weights: its one bias per "
            "gate is b_ih + b_hh, so it trains PyTorch's function (--lstm-impl flax)", BOTH, {"lstm_impl": "flax"},
            {"cpu": "impl:flax", "gpu": "impl:flax"}, headline=("stock",),
            wording="Flax nn.RNN over Flax's {flax_cell}",
            lm_description="the language model with nn.RNN over Flax's stock nn.OptimizedLSTMCell or nn.GRUCell fed "
            "PyTorch's weights (jax_impl.recurrences.stock: both represent PyTorch's cells exactly), differentiated "
            "by JAX (--lstm-impl flax)"),
    Variant("jax", "nnx", "stock", "the classifier in Flax NNX, what a Flax user writes today: nnx.RNN over Flax's "
            "stock nnx.OptimizedLSTMCell (its input Linear given PyTorch's b_ih, so both biases train as PyTorch's "
            "do), stepped by nnx.jit and nnx.Optimizer (--flax-api nnx); its set-up also times what nnx.jit's graph "
            "traversal costs a call on the model and its optimizer, against nnx.cached_partial", BOTH,
            {"flax_api": "nnx"},
            {"cpu": "impl:nnx.flax", "gpu": "impl:nnx.flax"}, headline=("stock",),
            wording="Flax NNX nnx.RNN over nnx.OptimizedLSTMCell", versus="jax:flax"),
    Variant("jax", "scan", "stock", "Flax nn.RNN over PyTorch's cell, differentiated by JAX; unlike "
            "nn.OptimizedLSTMCell it keeps two biases and projects the inputs of all steps before the loop, one GEMM "
            "(--lstm-impl scan, the readable reference)", GPU, {"lstm_impl": "scan"},
            {"cpu": "impl:scan", "gpu": "impl:scan"}, headline=("stock",), wording="Flax nn.RNN over PyTorch's cell",
            lm_description="the language model with nn.RNN over PyTorch's LSTM or GRU cell (two biases, each "
            "layer's inputs projected for all steps before the loop, one GEMM), differentiated by JAX (--lstm-impl "
            "scan)"),
    Variant("jax", "nofold", "tuned", "our fused recurrence, nn.LSTM's algorithm (--lstm-impl fused "
            "--no-embed-fold)", BOTH, {"lstm_impl": "fused", "embed_fold": False},
            {"cpu": "impl:fused", "gpu": "impl:fused"}, main=True, headline=("best tuned", "same algorithm")),
    Variant("jax", "fused", "tuned", "our fused recurrence with the embedding folded into layer 0's input "
            "projection, XLA's fastest (--lstm-impl fused)",
            ("cpu",), {"lstm_impl": "fused"}, {"cpu": "impl:fused", "gpu": "impl:fused"}, main=True,
            headline=("best tuned",), lm_description="the language model's LSTM layer by layer on our fused "
            "recurrence: each layer's input projected in one GEMM, then XLA's loop with hand-written gradients "
            "(--lstm-impl fused; nothing to fold)"),
    Variant("jax", "jit", "tuned", "jax_impl.train's default, whichever implementation --lstm-impl auto picks "
            "(jax_impl.recurrences.choice.auto, which the report quotes: what it picked here and why); its tier is "
            "the one that ran", BOTH, main=True,
            headline=("best tuned", "kernel"),
            wording="our recurrence kernel as jax_impl.train's default"),
    Variant("jax", "cudnn", "vendor", "cuDNN's fused LSTM through jax.experimental.rnn (--lstm-impl cudnn)", GPU,
            {"lstm_impl": "cudnn"}, {"gpu": "dnn_rnn"}, headline=("vendor kernel",), wording="cuDNN through JAX"),
    Variant("jax", "onednn", "vendor", "oneDNN's LSTM primitive, the kernel nn.LSTM runs on the CPU, one call per "
            "layer through XLA's FFI (ATen's mkldnn_rnn_layer from the installed torch, its results copied into "
            "XLA's buffers; dropout and the embedding in XLA; --lstm-impl onednn)", ("cpu",), {"lstm_impl": "onednn"},
            {"cpu": "onednn_lstm_forward"},
            headline=("vendor kernel",), wording="oneDNN through XLA's FFI",
            lm_description="the language model's LSTM layer by layer on oneDNN's LSTM primitive through XLA's FFI, "
            "the kernel nn.LSTM runs (--lstm-impl onednn)"),
    Variant("jax", "kernel", "kernel", "our own recurrence kernel through XLA's FFI, one call per layer and pass: "
            "each step's GEMM of [x_t, h_t-1] against [W_ih; W_hh] in AVX2 or AVX-512 register tiles with the gate "
            "math after each, a team of threads over the hidden units; the embedding fold too, over the table rows a "
            "batch uses "
            "(--lstm-impl kernel; jax:jit runs it on a CPU with AVX2 or AVX-512)", changes={"lstm_impl": "kernel"},
            kernel={"cpu": "lstm_kernel_forward"}, headline=("kernel",), wording="our recurrence kernel",
            lm_description="the language model's LSTM layer by layer on our recurrence kernel through XLA's FFI, each "
            "layer's input projected inside each step's product (--lstm-impl kernel)"),
)

# The language model's rows by device, a run without --variants: the stock tier on both sides, the tuned, vendor and
# kernel tiers (the LSTM's fused, oneDNN and kernel layers; a GRU's are refused, and cuDNN is the classifier's only:
# jax_impl.recurrences.choice, whose reason the run reports) and torch.compile. jax:jit is left out: what --lstm-impl
# auto runs for the LM is one of these rows, which the report's variants name as jax_impl.train's default
# (results.descriptions, from choice.auto in the workers).
LM_DEFAULT = {"cpu": ("torch:eager", "torch:compile", "jax:flax", "jax:scan", "jax:fused", "jax:onednn", "jax:kernel",
                      "jax:cudnn"),
              "gpu": ("torch:eager", "torch:compile", "jax:flax", "jax:scan", "jax:fused", "jax:cudnn")}
# --quick leaves torch:compile out of them: Inductor compiling the graphs around the recurrence takes ~25 s of a 2-core
# smoke run, and Dynamo refuses nn.LSTM / nn.GRU there anyway (a full run reports it; --variants names it).
LM_QUICK_LEAVES_OUT = ("torch:compile",)
LM_MAIN = ("torch:eager", "jax:scan", "jax:flax")  # what a sweep of the language model times by default
# The Flax cell the flax variant's wording names, by --cell.
CELL_WORDS = {"lstm": {"torch_module": "nn.LSTM", "flax_cell": "nn.OptimizedLSTMCell"},
              "gru": {"torch_module": "nn.GRU", "flax_cell": "nn.GRUCell"}}

# --quick: the sizes that replace those left at the workload's defaults.
QUICK_CONFIG = {"classifier": {"embed_dim": 16, "hidden_dim": 16, "seq_len": 16, "batch_size": 8},
                "lm": {"embed_dim": 16, "hidden_dim": 16, "batch_size": 8, "bptt": 16}}


def comma_list(spec: str, where: str) -> list[str]:
    """``'a, b'`` → ``['a', 'b']``; a list that names nothing, or holds an empty value (``'a,,b'``, ``'a,'``), is
    refused naming ``where`` (the flag): a dropped value would run something other than what was asked."""
    if not spec.strip():
        raise ConfigError(f"{where}: empty; give a comma list of values")
    items = [x.strip() for x in spec.split(",")]
    if not all(items):
        raise ConfigError(f"{where}: an empty value in {spec!r}; give a comma list of values")
    return items


def select_variants(spec: str, frameworks: Sequence[str], device: str = "cpu", workload: str = "classifier",
                    quick: bool = False) -> list[Variant]:
    """``'default'`` (for ``device`` and ``workload``: the LM's are :data:`LM_DEFAULT`, under ``quick`` less
    :data:`LM_QUICK_LEAVES_OUT`), ``'all'``, or a comma list of ``framework:name`` or bare names."""
    if spec in ("default", "all"):
        lm = [x for x in LM_DEFAULT[device] if not (quick and x in LM_QUICK_LEAVES_OUT)]
        default = (lambda v: v.label in lm) if workload == "lm" else (lambda v: device in v.default_on)
        return [v for v in VARIANTS if v.framework in frameworks and (spec == "all" or default(v))]
    chosen: list[Variant] = []
    for item in comma_list(spec, "--variants"):
        matches = [v for v in VARIANTS if item in (v.label, v.name)]
        if not matches:
            raise ConfigError(f"--variants: unknown variant {item!r} (known: default, all, "
                              f"{', '.join(v.label for v in VARIANTS)})")
        for v in matches:
            if v.framework not in frameworks:
                raise ConfigError(f"--variants {item}: the {v.framework} twin is not among --frameworks")
            if v not in chosen:
                chosen.append(v)
    return chosen


def main_variants(variants: Sequence[Variant], frameworks: Sequence[str], workload: str = "classifier"
                  ) -> list[Variant]:
    """The variants a sweep times when --variants names none: the main ones among ``variants`` (else among all of
    ``frameworks``'); the language model's are :data:`LM_MAIN`, the rows that can run it."""
    main = (lambda v: v.label in LM_MAIN) if workload == "lm" else (lambda v: v.main)
    return [v for v in variants if main(v)] or [v for v in VARIANTS if main(v) and v.framework in frameworks]


def variant(label: str) -> Variant:
    return next(v for v in VARIANTS if v.label == label)


def _parse_value(f: dataclasses.Field, text: str, where: str) -> Any:
    kind = type(f.default) if f.default is not None else str
    try:
        return BOOLS[text.lower()] if kind is bool else kind(text)
    except (KeyError, ValueError):
        raise ConfigError(f"{where}: {text!r} is not a valid {kind.__name__}") from None


@dataclass(frozen=True)
class Sweep:
    field: str
    values: tuple[Any, ...]


def parse_sweep(spec: str, base: Config) -> Sweep:
    """``'batch_size=16,50,128'`` (or ``batch-size``) → a :class:`Sweep`, each value checked by its Config."""
    where = f"--sweep {spec}"
    if "=" not in spec:
        raise ConfigError(f"{where}: expected FIELD=V1,V2,... (e.g. batch_size=16,50,128)")
    name, _, values_text = spec.partition("=")
    name = name.strip().replace("-", "_")
    if not name:
        raise ConfigError(f"{where}: no field named before '='; expected FIELD=V1,V2,... (e.g. batch_size=16,50,128)")
    known = {f.name: f for f in dataclasses.fields(Config)}
    if name not in known:
        raise ConfigError(f"{where}: no configuration field {name!r} (e.g. batch_size, hidden_dim, seq_len)")
    values = tuple(dict.fromkeys(_parse_value(known[name], v, where) for v in comma_list(values_text, where)))
    for value in values:
        try:
            base.replace(**{name: value})
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
    return Sweep(name, values)


def int_list(spec: str, flag: str, minimum: int, maximum: int | None = None) -> list[int]:
    """``--seeds`` and ``--device-counts``: a comma list of distinct integers, each at least ``minimum`` and at most
    ``maximum`` (None: no bound), every value checked before the caller does anything with one."""
    items = comma_list(spec, flag)
    try:
        values = [int(x) for x in items]
    except ValueError:
        raise ConfigError(f"{flag} takes a comma list of integers, got {spec!r}") from None
    for value in values:
        if value < minimum or (maximum is not None and value > maximum):
            bound = (f"between {minimum} and {maximum}" if maximum is not None else "> 0" if minimum == 1
                     else f">= {minimum}")
            raise ConfigError(f"{flag}: each value must be {bound}, got {value}")
    if len(set(values)) != len(values):
        twice = next(v for i, v in enumerate(values) if v in values[:i])
        raise ConfigError(f"{flag} takes distinct values, got {twice} twice in {spec!r}")
    return values

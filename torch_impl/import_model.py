"""``python -m torch_impl.import_model --state-dict model.pt --vocab vocab_to_int.json --out DIR [--seq-len 200]
[--tokenizer script|char]``: a model the classic PyTorch script trained, as a neutral checkpoint both twins read.

The script saves ``torch.save(net.state_dict(), path)`` and its ``vocab_to_int`` (word → id from 1, 0 the padding,
no unknown token). The sizes come from the tensors' shapes, the vocabulary keeps the script's ids (so the embedding
is the script's, row for row), and a word the script never saw is skipped (``predict --json`` counts it). The
``module.`` prefix a model wrapped in ``nn.DataParallel`` (or DDP) saves its names with is stripped, and said so.
"""
import itertools
import pickle
import re
from pathlib import Path
from typing import Sequence

import torch

from common import interrupts
from common.checkpoint import save_checkpoint, validate_params
from common.config import Config, Parser
from common.errors import CheckpointError, cli_main
from common.files import read_json
from common.params import Params
from common.text import vocab_from_word_ids


def read_state_dict(path: Path) -> Params:
    """A ``state_dict`` file's tensors as float32 numpy arrays (read with ``weights_only=True``: nothing unpickled)."""
    try:
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # what weights_only=True raises for any pickled object but tensors
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(err))
        what = f"holds a pickled {found[1]}, not a state_dict" if found else "is not a state_dict"
        raise CheckpointError(f"{path}: {what}: it is read with torch.load(weights_only=True), and a whole pickled "
                              f"model (torch.save(net)) is never unpickled; save torch.save(net.state_dict(), path)"
                              ) from None
    except OSError as err:  # permission denied, an I/O error, ...
        raise CheckpointError(f"{path}: cannot read it ({err.strerror or err})") from None
    except (RuntimeError, KeyError, EOFError, ValueError) as err:  # torch.load's answers to bytes it cannot parse
        raise CheckpointError(f"{path}: not a file torch.save wrote ({err!r})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a state_dict (a dict of name → tensor)")
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, expected floating point")
    return {name: tensor.detach().to(torch.float32).numpy() for name, tensor in state.items()}


WRAPPER_PREFIX = "module."  # nn.DataParallel's and DistributedDataParallel's


def strip_wrapper_prefix(params: Params) -> tuple[Params, bool]:
    """``params`` without the prefix when every name has it, and whether it did."""
    if not params or not all(name.startswith(WRAPPER_PREFIX) for name in params):
        return params, False
    return {name.removeprefix(WRAPPER_PREFIX): value for name, value in params.items()}, True


def model_dims(params: Params, where: str) -> tuple[int, int, int, int]:
    """``(rows V, embed E, hidden H, layers L)`` from the shapes: embedding.weight (V, E), lstm.weight_hh_l0 (4H, H),
    one lstm.weight_ih_l{k} per layer. The other tensors are checked against these by ``validate_params``."""
    for name in ("embedding.weight", "lstm.weight_hh_l0"):
        if name not in params:
            raise CheckpointError(f"{where}: missing tensor {name!r}")
        if params[name].ndim != 2:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {params[name].shape}, expected 2 dimensions")
    layers = next(k for k in itertools.count() if f"lstm.weight_ih_l{k}" not in params)
    (rows, embed), hidden = params["embedding.weight"].shape, params["lstm.weight_hh_l0"].shape[1]
    return rows, embed, hidden, max(layers, 1)  # no weight_ih_l0: one layer, whose weight_ih_l0 is then missing


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m torch_impl.import_model",
                    description="Import the classic script's state_dict and vocab_to_int as a neutral checkpoint.")
    parser.add_argument("--state-dict", required=True, type=Path, help="torch.save(net.state_dict(), PATH)'s file")
    parser.add_argument("--vocab", required=True, type=Path, help="the script's vocab_to_int, json.dump'ed")
    parser.add_argument("--out", required=True, type=Path, help="new (or empty) checkpoint directory")
    parser.add_argument("--seq-len", type=int, default=Config().seq_len,
                        help="tokens kept per text: the script's predict(..., sequence_length)")
    parser.add_argument("--tokenizer", choices=("script", "char"), default="script",
                        help="script: the script's own (lower-case, ASCII punctuation dropped, split on whitespace); "
                             "char: every non-whitespace character")
    args = parser.parse_args(argv)
    if args.out.exists() and not (args.out.is_dir() and not any(args.out.iterdir())):
        raise CheckpointError(f"--out {args.out}: exists and is not an empty directory; name a new one")

    params, stripped = strip_wrapper_prefix(read_state_dict(args.state_dict))
    rows, embed, hidden, layers = model_dims(params, str(args.state_dict))
    cfg = Config(tokenizer=args.tokenizer, seq_len=args.seq_len, embed_dim=embed, hidden_dim=hidden, layers=layers)
    validate_params(params, cfg, rows, where=str(args.state_dict))
    word_ids = read_json(args.vocab)
    try:
        vocab = vocab_from_word_ids(word_ids, rows)
    except CheckpointError as err:
        raise CheckpointError(f"{args.vocab}: {err}") from None
    save_checkpoint(args.out, params, cfg, vocab, args.tokenizer,
                    meta={"imported_from": {"state_dict": str(args.state_dict), "vocab": str(args.vocab)}})
    print(f"{args.out}: vocab {rows} (<pad> and {rows - 1} words; unknown words are skipped), embed {embed}, "
          f"hidden {hidden}, layers {layers}, seq_len {args.seq_len}, tokenizer {args.tokenizer}"
          + (f"; the names' {WRAPPER_PREFIX!r} prefix (saved by nn.DataParallel) was stripped" if stripped else ""))
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())

"""``python -m torch_impl.export_model DIR --state-dict out.pt --vocab out.json``: a neutral checkpoint as the classic
script's two files: a ``state_dict`` its ``SentimentRNN(vocab_size, 1, E, H, L)`` loads with
``load_state_dict(torch.load(path, weights_only=True))``, and the ``vocab_to_int`` its ``predict`` looks words up in.
Both paths are checked before anything is written (an existing file is replaced only with ``--overwrite``), both files
are written under temporary names beside their targets, and renamed only once both are written.
"""
from pathlib import Path
from typing import Callable, Sequence

import torch

from common import interrupts
from common.checkpoint import load_checkpoint
from common.config import Parser
from common.errors import CheckpointError, cli_main
from common.files import Output, atomic_files, check_outputs, write_json
from common.params import shapes_for


def write_all(writes: dict[Path, Callable[[Path], None]]) -> None:
    """:func:`common.files.atomic_files`, its failure one line: a failed export leaves none of its files."""
    try:
        atomic_files(writes)
    except (OSError, RuntimeError) as err:  # torch.save's writer raises RuntimeError
        why = getattr(err, "strerror", None) or (str(err).splitlines() or [""])[0]
        raise CheckpointError(f"{' and '.join(map(str, writes))}: cannot write ({why})") from None


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m torch_impl.export_model",
                    description="Export a neutral checkpoint as the classic script's state_dict and vocab_to_int.")
    parser.add_argument("checkpoint", type=Path, help="neutral checkpoint directory")
    parser.add_argument("--state-dict", required=True, type=Path, help="where to torch.save the state_dict")
    parser.add_argument("--vocab", required=True, type=Path, help="where to json.dump the vocab_to_int")
    parser.add_argument("--overwrite", action="store_true", help="replace --state-dict and --vocab files that exist")
    args = parser.parse_args(argv)
    check_outputs([Output("--state-dict", args.state_dict, directory=False, contents="the state_dict"),
                   Output("--vocab", args.vocab, directory=False, contents="the vocab_to_int")], args.overwrite)
    ckpt = load_checkpoint(args.checkpoint)
    if ckpt.config.workload != "classifier":
        raise CheckpointError(f"{args.checkpoint}: a language model's checkpoint; this writes the classic script's "
                              f"classifier (its weights already carry the LM example's names: model.safetensors)")
    if ckpt.config.padding != "left":
        raise CheckpointError(f"{args.checkpoint}: trained with --padding right, but the script left-pads: it would "
                              f"not compute this model")
    # In SentimentRNN.state_dict()'s order; the names already are the script's.
    state = {name: torch.from_numpy(ckpt.params[name]) for name in shapes_for(ckpt.config, len(ckpt.vocab))}
    write_all({args.state_dict: lambda tmp: torch.save(state, tmp),
               args.vocab: lambda tmp: write_json(tmp, ckpt.vocab.word_ids())})
    cfg = ckpt.config
    print(f"{args.state_dict}: SentimentRNN({len(ckpt.vocab)}, 1, {cfg.embed_dim}, {cfg.hidden_dim}, {cfg.layers}); "
          f"{args.vocab}: {len(ckpt.vocab) - 1} words; seq_len {cfg.seq_len}, tokenizer {ckpt.tokenizer}"
          + ("" if ckpt.vocab.unknown_words == "skip" else "; id 1 is <unk>, for the words the script does not know")
          + ("" if ckpt.tokenizer == "script" else f"; note: the model reads {ckpt.tokenizer} tokens, so the script "
             f"must tokenize that way, not its own (train with --tokenizer script to avoid this)"))
    return 0


if __name__ == "__main__":
    interrupts.exit_process(main())

"""``python -m torch_impl.predict CKPT_DIR "text" ... [--json] [--device D]``: P(positive) from a classifier's
checkpoint; from a language model's, ``CKPT_DIR "中国 人民" --words N`` continues the prompt greedily."""
from typing import Sequence

import numpy as np
import torch

from common import interrupts
from common.checkpoint import Checkpoint
from common.predict import encode_for, predict_main
from torch_impl import classifier, lm
from torch_impl.model import SentimentRNN, load_params
from torch_impl.numerics import resolve_device, set_numerics


def model_from_checkpoint(ckpt: Checkpoint, device: torch.device) -> SentimentRNN:
    set_numerics(ckpt.config, device)  # the float rules the twins share by default
    model = classifier.model_from_config(ckpt.config, len(ckpt.vocab))
    load_params(model, ckpt.params)
    return model.to(device).eval()


@torch.no_grad()
def predict_probs(ckpt: Checkpoint, texts: Sequence[str], device: torch.device, batch_size: int = 256) -> np.ndarray:
    """(N,) float64 P(positive) of each text, ``batch_size`` texts at a time, from a zero carry with dropout off."""
    model = model_from_checkpoint(ckpt, device)
    tokens, lengths = encode_for(ckpt, texts)
    probs = []
    for lo in range(0, len(texts), batch_size):
        rows = slice(lo, lo + batch_size)
        x = torch.from_numpy(tokens[rows]).to(model.fc.weight.device).long()  # (B, T)
        out, _ = model(x, model.init_hidden(x.shape[0]), None if lengths is None else torch.from_numpy(lengths[rows]))
        probs.append(out.double().cpu().numpy())
    return np.concatenate(probs)


@torch.no_grad()
def greedy_ids(ckpt: Checkpoint, prompt: np.ndarray, words: int, device: torch.device) -> list[int]:
    """The ids of the ``words`` words that follow ``prompt`` (ids (t,)) greedily: the prompt read from a zero state,
    then each word the argmax of the last logits (the lowest id on a tie), fed back in. Dropout off."""
    set_numerics(ckpt.config, device)
    model = lm.model_from_config(ckpt.config, len(ckpt.vocab))
    load_params(model, ckpt.params)
    model = model.to(device).eval()
    tokens, hidden, found = torch.from_numpy(prompt).to(device).long()[:, None], model.init_hidden(1), []  # (t, 1)
    for _ in range(words):
        logits, hidden = model(tokens, hidden)
        tokens = logits[-1].argmax(-1, keepdim=True)  # (1, 1): torch's argmax takes the first of equal maxima
        found.append(int(tokens))
    return found


main = predict_main("python -m torch_impl.predict", resolve_device, predict_probs, greedy_ids)

if __name__ == "__main__":
    interrupts.exit_process(main())

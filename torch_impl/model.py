"""The classic notebook's ``SentimentRNN``: Embedding → stacked LSTM → dropout → Linear → sigmoid.

Its ``state_dict`` names are the neutral checkpoint's (``common.params``), so converting is a copy:
:func:`load_params` (neutral → model) and :func:`export_params` (model → neutral, bitwise for float32).
"""
import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from common.errors import CheckpointError
from common.params import Params

Hidden = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (L, B, H)


class SentimentRNN(nn.Module):
    """P(positive) of each text, reading the top LSTM layer's final hidden state."""

    def __init__(self, vocab_size: int, embed_dim: int = 400, hidden_dim: int = 256, layers: int = 2,
                 dropout: float = 0.5, fc_dropout: float = 0.3):
        super().__init__()
        self.layers, self.hidden_dim = layers, hidden_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        # nn.LSTM only applies dropout between layers; with one layer it would just warn.
        self.lstm = nn.LSTM(embed_dim, hidden_dim, layers, dropout=dropout if layers > 1 else 0.0, batch_first=True)
        self.dropout = nn.Dropout(fc_dropout)
        self.fc = nn.Linear(hidden_dim, 1)
        self.sig = nn.Sigmoid()

    def forward(self, tokens: torch.Tensor, hidden: Hidden,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, Hidden]:
        """``tokens`` (B, T) long, ``hidden`` (h, c) each (L, B, H) → ``(probs (B,), (h, c))``.

        Without ``lengths`` the whole (left-padded) row is read, as the seed does. With ``lengths`` (B,) the batch
        is right-padded and packed, so the final state is each text's own last token. Either way the classifier
        reads the top layer's final h, ``h_n[-1]``: for left padding that is exactly the seed's ``lstm_out[:, -1]``.
        """
        embeds = self.embedding(tokens)  # (B, T, E)
        if lengths is not None:
            # Packing needs the lengths on the CPU; enforce_sorted=False keeps the batch in its own order.
            embeds = pack_padded_sequence(embeds, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, hidden = self.lstm(embeds, hidden)  # h_n, c_n: (L, B, H)
        out = self.dropout(hidden[0][-1])  # (B, H)
        probs = self.sig(self.fc(out)).squeeze(-1)  # (B,)
        return probs, hidden

    def init_hidden(self, batch_size: int) -> Hidden:
        """Zeros ``(h, c)``, each (L, B, H), on the model's device and in its dtype."""
        return tuple(self.fc.weight.new_zeros(self.layers, batch_size, self.hidden_dim) for _ in range(2))


def load_params(model: nn.Module, params: Params) -> None:
    """Copy neutral arrays (name → array) into ``model``'s parameters, exactly (cast to the model's dtype). The names
    are ``named_parameters()``'s: the state-dict names, but a tied weight once (the language model's decoder)."""
    named = dict(model.named_parameters())
    missing = [name for name in named if name not in params]
    unexpected = [name for name in params if name not in named]
    if missing or unexpected:
        raise CheckpointError(f"parameters do not fit the model: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, tensor in named.items():
            value = torch.from_numpy(np.asarray(params[name]))
            if tuple(value.shape) != tuple(tensor.shape):
                raise CheckpointError(f"parameter {name!r} has shape {tuple(value.shape)}, "
                                      f"the model needs {tuple(tensor.shape)}")
            tensor.copy_(value)


def export_params(model: nn.Module) -> Params:
    """The model's parameters as neutral float32 numpy arrays (a copy), under their names (a tied one once)."""
    return {name: tensor.detach().to("cpu", torch.float32).numpy().copy()
            for name, tensor in model.named_parameters()}

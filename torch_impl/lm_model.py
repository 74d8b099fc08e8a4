"""pytorch/examples' ``word_language_model`` ``RNNModel``: Embedding → dropout → L-layer LSTM or GRU (dropout
between layers) → dropout → Linear(V) at every time step. Time-major, as the example: tokens (T, B) → logits
(T, B, V).

Its parameter names are the neutral tree's (``common.params``), so converting is a copy, the classifier's
:func:`torch_impl.model.load_params` (neutral → model) and :func:`torch_impl.model.export_params` (model → neutral,
bitwise for float32), both over ``named_parameters()``, which lists a tied weight once, as ``encoder.weight``.
"""
import torch
from torch import nn

from common.params import check_lm_sizes

# LSTM: (h, c), each (L, B, H); GRU: h (L, B, H)
LMHidden = tuple[torch.Tensor, torch.Tensor] | torch.Tensor


class RNNModel(nn.Module):
    """A word-level language model: the logits of each next token. ``cell`` 'lstm' | 'gru'; ``tied`` makes the
    decoder's weight the encoder's table (needs E = H)."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str = "lstm",
                 dropout: float = 0.5, tied: bool = False):
        super().__init__()
        check_lm_sizes(embed_dim, hidden_dim, cell, tied)
        self.cell, self.layers, self.hidden_dim, self.tied = cell, layers, hidden_dim, tied
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, embed_dim)
        # nn.LSTM/nn.GRU only apply dropout between layers; with one layer they would just warn.
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(embed_dim, hidden_dim, layers, dropout=dropout if layers > 1 else 0.0)
        self.decoder = nn.Linear(hidden_dim, vocab_size)
        if tied:
            self.decoder.weight = self.encoder.weight  # one Parameter: its gradient sums both uses

    def forward(self, tokens: torch.Tensor, hidden: LMHidden) -> tuple[torch.Tensor, LMHidden]:
        """``tokens`` (T, B) long, ``hidden`` (:data:`LMHidden`) → ``(logits (T, B, V), hidden after step T)``."""
        emb = self.drop(self.encoder(tokens))  # (T, B, E)
        output, hidden = self.rnn(emb, hidden)  # (T, B, H): the top layer at every step
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, batch_size: int) -> LMHidden:
        """Zeros on the model's device and in its dtype: LSTM ``(h, c)``, each (L, B, H); GRU ``h`` (L, B, H)."""
        weight = self.decoder.bias
        if self.cell == "lstm":
            return (weight.new_zeros(self.layers, batch_size, self.hidden_dim),
                    weight.new_zeros(self.layers, batch_size, self.hidden_dim))
        return weight.new_zeros(self.layers, batch_size, self.hidden_dim)

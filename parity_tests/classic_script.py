"""An independent, minimal copy of the classic PyTorch SentimentRNN script: its vocabulary, tokenizer, padding,
model, training loop and ``predict``, written as the script has them (``h = tuple([each.data for each in h])``
included), so that the import and export are tested against a model the project did not make. It imports nothing
of the project. The one change: ``predict`` returns the probability it would print, and takes ``vocab_to_int``
as an argument instead of reading a global.
"""
from collections import Counter
from string import punctuation

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class SentimentRNN(nn.Module):
    def __init__(self, vocab_size, output_size, embedding_dim, hidden_dim, n_layers, drop_prob=0.5):
        super().__init__()
        self.output_size = output_size
        self.n_layers = n_layers
        self.hidden_dim = hidden_dim
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, n_layers, dropout=drop_prob, batch_first=True)
        self.dropout = nn.Dropout(0.3)
        self.fc = nn.Linear(hidden_dim, output_size)
        self.sig = nn.Sigmoid()

    def forward(self, x, hidden):
        batch_size = x.size(0)
        embeds = self.embedding(x)
        lstm_out, hidden = self.lstm(embeds, hidden)
        lstm_out = lstm_out.contiguous().view(-1, self.hidden_dim)
        out = self.dropout(lstm_out)
        out = self.fc(out)
        sig_out = self.sig(out)
        sig_out = sig_out.view(batch_size, -1)
        sig_out = sig_out[:, -1]
        return sig_out, hidden

    def init_hidden(self, batch_size):
        weight = next(self.parameters()).data
        return (weight.new(self.n_layers, batch_size, self.hidden_dim).zero_(),
                weight.new(self.n_layers, batch_size, self.hidden_dim).zero_())


def words_of(review):
    review = review.lower()
    return "".join([c for c in review if c not in punctuation]).split()


def make_vocab_to_int(reviews):
    counts = Counter(word for review in reviews for word in words_of(review))
    vocab = sorted(counts, key=counts.get, reverse=True)
    return {word: ii for ii, word in enumerate(vocab, 1)}


def tokenize_review(test_review, vocab_to_int):
    return [[vocab_to_int[word] for word in words_of(test_review)]]


def pad_features(reviews_ints, seq_length):
    features = np.zeros((len(reviews_ints), seq_length), dtype=int)
    for i, row in enumerate(reviews_ints):
        features[i, -len(row):] = np.array(row)[:seq_length]
    return features


def train(reviews, labels, vocab_to_int, embedding_dim, hidden_dim, n_layers, seq_length, batch_size=10, steps=8,
          lr=0.001, clip=5, seed=0):
    """The script's training loop for ``steps`` batches (its epochs loop, cut short)."""
    torch.manual_seed(seed)
    features = pad_features([[vocab_to_int[w] for w in words_of(r)] for r in reviews], seq_length)
    train_data = TensorDataset(torch.from_numpy(features), torch.from_numpy(np.array(labels)))
    train_loader = DataLoader(train_data, shuffle=True, batch_size=batch_size, drop_last=True)
    net = SentimentRNN(len(vocab_to_int) + 1, 1, embedding_dim, hidden_dim, n_layers)
    criterion = nn.BCELoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    counter = 0
    net.train()
    while counter < steps:
        h = net.init_hidden(batch_size)
        for inputs, labels in train_loader:
            counter += 1
            h = tuple([each.data for each in h])
            net.zero_grad()
            output, h = net(inputs, h)
            loss = criterion(output.squeeze(), labels.float())
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), clip)
            optimizer.step()
            if counter == steps:
                break
    return net


def predict(net, vocab_to_int, test_review, sequence_length=200):
    """The probability the script's ``predict`` prints as 'Prediction value, pre-rounding'."""
    net.eval()
    features = pad_features(tokenize_review(test_review, vocab_to_int), sequence_length)
    feature_tensor = torch.from_numpy(features)
    h = net.init_hidden(feature_tensor.size(0))
    output, h = net(feature_tensor, h)
    return output.item()

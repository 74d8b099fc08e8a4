"""What every timed step consumes: real training batches of the configured corpus, in training order.

Both twins get the same sequence: epoch 0's shuffled batches (``common.batches.batches`` with
``shuffle_seed=cfg.seed``), then epoch 1's, and so on; ``new_epoch`` marks where the trainers reset the
carried state to zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.batches import Batch, batches
from common.config import Config
from common.data import Dataset, prepare_data
from common.params import Params, init_params


@dataclass(frozen=True)
class Workload:
    cfg: Config
    vocab_size: int
    train: list[Batch]  # training batches in order, as many as the run needs
    new_epoch: list[bool]  # train[i] starts an epoch: the carry restarts from zeros there
    eval: list[Batch]  # full validation batches (the last, smaller one dropped: one shape to time)

    def params(self) -> Params:
        """The shared initial weights (``common.params.init_params`` with ``cfg.seed``)."""
        c = self.cfg
        return init_params(self.vocab_size, c.embed_dim, c.hidden_dim, c.layers, seed=c.seed)


def training_sequence(data: Dataset, cfg: Config, n: int) -> tuple[list[Batch], list[bool]]:
    """The first ``n`` training batches over consecutive epochs, and which of them start an epoch."""
    out: list[Batch] = []
    starts: list[bool] = []
    epoch = 0
    while len(out) < n:
        first = True
        for batch in batches(data.train, cfg.batch_size, shuffle_seed=cfg.seed, epoch=epoch):
            out.append(batch)
            starts.append(first)
            first = False
            if len(out) == n:
                break
        epoch += 1
    return out, starts


def load_workload(cfg: Config, train_steps: int, eval_steps: int) -> Workload:
    """Prepare the corpus with ``cfg`` and take the batches a run of that many steps consumes."""
    data = prepare_data(cfg)
    train, starts = training_sequence(data, cfg, train_steps)
    full = [b for b in batches(data.val, cfg.batch_size) if b.size == cfg.batch_size]
    if not full:  # a validation split smaller than one batch: time training batches instead
        full = train[:1]
    evals = [full[i % len(full)] for i in range(eval_steps)]
    return Workload(cfg, len(data.vocab), train, starts, evals)

"""FLOPs per step: the matrix products of the LSTM classifier, counted by hand (each (M, K)·(K, N) is 2·M·N·K).

Per batch of B texts of T tokens, L layers, hidden size H, embedding size E (D_0 = E, D_k = H above):

    forward = Σ_k 2·B·T·4H·(D_k + H)  +  2·B·H   (input projection and recurrence per layer; output layer)
    train   = 3 × forward                        (backward: dX = dY·Wᵀ and dW = Xᵀ·dY, each as large as Y = X·W)

The *model* figure (71.76 GFLOP per training step at the seed's configuration) is the same for every variant,
as MFU uses it. What a variant *executes* can be less: the JAX fused stack with the embedding fold computes
layer 0's input projection as ``(table W_ihᵀ + b)[tokens]``, a (V, E)·(E, 4H) product instead of (T·B, E)·(E, 4H)
whenever V < T·B; our kernel (``--lstm-impl kernel``) projects only the U table rows a batch's tokens use, a (U, E)·
(E, 4H) product (U the batch's distinct token ids: 640-970 of the seed's 4398, so this depends on the data, and the
bench counts the mean over the batches a variant steps through). Not counted: gate nonlinearities, bias additions,
the gather, loss, clipping and Adam.
"""


def forward_matmul_flops(batch_size: int, seq_len: int, embed_dim: int, hidden_dim: int, layers: int) -> int:
    """FLOPs of the forward pass's matrix products for one batch."""
    rows, gates = batch_size * seq_len, 4 * hidden_dim
    total = sum(2 * rows * gates * ((embed_dim if k == 0 else hidden_dim) + hidden_dim) for k in range(layers))
    return total + 2 * batch_size * hidden_dim  # the output layer on the final h


def step_flops(cfg, step: str) -> int:
    """The model's FLOPs for one ``'train'`` step (3 × forward) or ``'eval'`` step (forward)."""
    forward = forward_matmul_flops(cfg.batch_size, cfg.seq_len, cfg.embed_dim, cfg.hidden_dim, cfg.layers)
    return {"train": 3 * forward, "eval": forward}[step]


def executed_step_flops(cfg, step: str, vocab_size: int, folds: bool, used_rows: float | None = None) -> int:
    """What a variant computes: :func:`step_flops`, less the fold's saving when it ``folds`` the embedding: the fold
    projects the whole table (V rows) or, given ``used_rows`` (a batch's distinct tokens, a mean), those rows."""
    tokens = cfg.batch_size * cfg.seq_len
    rows = vocab_size if used_rows is None else used_rows
    saved = 2 * 4 * cfg.hidden_dim * cfg.embed_dim * (tokens - rows) if folds and vocab_size < tokens else 0
    return round(step_flops(cfg, step) - (3 if step == "train" else 1) * saved)

"""FLOPs per step: the matrix products of each workload's model, counted by hand (each (M, K)·(K, N) is 2·M·N·K).

The classifier, per batch of B texts of T tokens, L layers, hidden size H, embedding size E (D_0 = E, D_k = H above):

    forward = Σ_k 2·B·T·4H·(D_k + H)  +  2·B·H   (input projection and recurrence per layer; output layer)
    train   = 3 × forward                        (backward: dX = dY·Wᵀ and dW = Xᵀ·dY, each as large as Y = X·W)

The language model, per window of N = t·B tokens (training: --bptt rows of --batch-size columns; evaluation: --bptt
rows of the example's 10 columns), G gates per cell (LSTM 4, GRU 3), vocabulary V:

    forward = N · (Σ_k 2·G·H·(D_k + H)  +  2·H·V)   (the recurrence per layer; the decoder at every token)
    train   = 3 × forward

The embedding is a lookup (no FLOPs) and tying the decoder to it changes no product. At the example's small size (E = H
= 200, L 2, V 10 000, B 20, bptt 35) the decoder is 2.8 of the forward's 3.7 GFLOP: three quarters.

The *model* figure (71.76 GFLOP per training step at the classifier seed's configuration) is the same for every
variant, as MFU uses it. What a variant *executes* can be less: the JAX fused stack with the embedding fold computes
layer 0's input projection as ``(table W_ihᵀ + b)[tokens]``, a (V, E)·(E, 4H) product instead of (T·B, E)·(E, 4H)
whenever V < T·B; our kernel (``--lstm-impl kernel``) projects only the U table rows a batch's tokens use, a (U, E)·
(E, 4H) product (U the batch's distinct token ids: 640-970 of the seed's 4398, so this depends on the data, and the
bench counts the mean over the batches a variant steps through). The language model folds nothing. Not counted: gate
nonlinearities, bias additions, the gather, the softmax, loss, clipping and the optimizer.
"""
from common.lm_data import EVAL_BATCH_SIZE
from common.params import GATES


def forward_matmul_flops(batch_size: int, seq_len: int, embed_dim: int, hidden_dim: int, layers: int) -> int:
    """FLOPs of the classifier's forward pass's matrix products for one batch."""
    rows, gates = batch_size * seq_len, 4 * hidden_dim
    total = sum(2 * rows * gates * ((embed_dim if k == 0 else hidden_dim) + hidden_dim) for k in range(layers))
    return total + 2 * batch_size * hidden_dim  # the output layer on the final h


def lm_forward_matmul_flops(tokens: int, embed_dim: int, hidden_dim: int, layers: int, vocab_size: int,
                            cell: str = "lstm") -> int:
    """FLOPs of the language model's forward pass's matrix products over ``tokens`` (a window's t·B): each layer's
    input projection and recurrence, then the decoder (H → V) at every token."""
    gates = GATES[cell] * hidden_dim
    recurrence = sum(2 * gates * ((embed_dim if k == 0 else hidden_dim) + hidden_dim) for k in range(layers))
    return tokens * (recurrence + 2 * hidden_dim * vocab_size)


def lm_tokens(cfg, step: str) -> int:
    """Tokens of one language-model ``'train'`` window (--bptt × --batch-size) or ``'eval'`` window (--bptt × the
    example's 10 columns): the targets it predicts."""
    return cfg.bptt * (cfg.batch_size if step == "train" else EVAL_BATCH_SIZE)


def step_flops(cfg, step: str, vocab_size: int | None = None) -> int:
    """The model's FLOPs for one ``'train'`` step (3 × forward) or ``'eval'`` step (forward). The language model's
    (``cfg.workload == 'lm'``) need ``vocab_size``, the decoder's V."""
    if getattr(cfg, "workload", "classifier") == "lm":
        if vocab_size is None:
            raise ValueError("the language model's FLOPs need the vocabulary size (its decoder's V)")
        forward = lm_forward_matmul_flops(lm_tokens(cfg, step), cfg.embed_dim, cfg.hidden_dim, cfg.layers,
                                          vocab_size, cfg.cell)
    else:
        forward = forward_matmul_flops(cfg.batch_size, cfg.seq_len, cfg.embed_dim, cfg.hidden_dim, cfg.layers)
    return {"train": 3 * forward, "eval": forward}[step]


def executed_step_flops(cfg, step: str, vocab_size: int, folds: bool, used_rows: float | None = None) -> int:
    """What a variant computes: :func:`step_flops`, less the fold's saving when it ``folds`` the embedding: the fold
    projects the whole table (V rows) or, given ``used_rows`` (a batch's distinct tokens, a mean), those rows."""
    model = step_flops(cfg, step, vocab_size)
    if getattr(cfg, "workload", "classifier") == "lm":
        return model  # nothing folded
    tokens = cfg.batch_size * cfg.seq_len
    rows = vocab_size if used_rows is None else used_rows
    saved = 2 * 4 * cfg.hidden_dim * cfg.embed_dim * (tokens - rows) if folds and vocab_size < tokens else 0
    return round(model - (3 if step == "train" else 1) * saved)

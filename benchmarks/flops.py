"""Model FLOPs per step: the matrix products of the LSTM classifier, counted by hand.

Every matrix product ``(M, K) @ (K, N)`` counts ``2 * M * N * K`` floating-point operations (one multiply
and one add per term). For a batch of ``B`` texts of ``T`` tokens, an LSTM of ``L`` layers with hidden
size ``H`` and embeddings of size ``E``, the forward pass multiplies:

    layer k input projection   x_t @ W_ih^T     (B, D_k) @ (D_k, 4H)   per time step   D_0 = E, D_k = H
    layer k recurrence         h_{t-1} @ W_hh^T (B, H)   @ (H, 4H)     per time step
    output layer               h_T @ fc.W^T     (B, H)   @ (H, 1)      once

    forward = sum_k 2·B·T·4H·(D_k + H)  +  2·B·H

The backward pass costs twice the forward's matrix products (for ``Y = X W``: ``dX = dY W^T`` and
``dW = X^T dY``, each as large as the forward product; ``dX`` of layer 0 is needed because the embedding
is trained), so a training step is ``3 × forward`` and an inference step ``1 × forward``.

Not counted: the gate nonlinearities and elementwise products (about 10·B·T·H per layer and direction),
bias additions, the embedding gather, the loss, gradient clipping and the Adam update (about 10 per
parameter). They are small next to the products at the seed's sizes but not free on a CPU, so the
achieved FLOP/s reported from this count is a lower bound on the work done. Padding positions count as
work (every twin computes all ``T`` steps with left padding). At the seed's configuration
(B 50, T 200, E 400, H 256, L 2) a training step is 71.76 GFLOP.
"""
from __future__ import annotations


def forward_matmul_flops(batch_size: int, seq_len: int, embed_dim: int, hidden_dim: int, layers: int) -> int:
    """FLOPs of the forward pass's matrix products for one batch (see the module docstring)."""
    gates = 4 * hidden_dim
    total = 0
    for k in range(layers):
        fan_in = embed_dim if k == 0 else hidden_dim
        total += 2 * batch_size * seq_len * gates * fan_in  # input projection x_t @ W_ih^T
        total += 2 * batch_size * seq_len * gates * hidden_dim  # recurrence h_{t-1} @ W_hh^T
    total += 2 * batch_size * hidden_dim * 1  # output layer on the final h
    return total


def step_flops(cfg, step: str) -> int:
    """FLOPs of one ``'train'`` step (forward + backward = 3 × forward) or ``'eval'`` step (forward)."""
    forward = forward_matmul_flops(cfg.batch_size, cfg.seq_len, cfg.embed_dim, cfg.hidden_dim, cfg.layers)
    if step == "train":
        return 3 * forward
    if step == "eval":
        return forward
    raise ValueError(f"step must be 'train' or 'eval', got {step!r}")

"""What each LSTM kernel computes in bfloat16 under ``--dtype bfloat16``, both twins' recipe being PyTorch's: float32
parameters, gradients and Adam state, the forward pass under autocast, the loss in float32. Found by experiment, not
from documentation (how: docs/mixed-precision.md); each twin's run record names its kernel's rules."""

FLOAT32_LOSS = "float32 (BCE on the bfloat16 probabilities cast to float32)"
EMBEDDING = "float32 (a lookup; the LSTM's input is rounded to bfloat16)"

BFLOAT16_RULES: dict[str, dict[str, str]] = {
    # PyTorch's nn.LSTM on oneDNN (mkldnn_rnn_layer, where the CPU has oneDNN's bfloat16), and the JAX scan stack.
    "onednn": {"embedding": EMBEDDING, "input projection": "bfloat16 inputs and weights, float32 sums",
               "recurrent matmul": "bfloat16 h and weights, float32 sums",
               "gate math": "float32 (b_ih and b_hh rounded to bfloat16 and added in bfloat16)",
               "cell state": "float32 within a step, rounded to bfloat16 between steps; h rounded to bfloat16",
               "classifier": "bfloat16 (Linear and sigmoid, each rounded once)", "loss": FLOAT32_LOSS},
    # PyTorch's ATen cell (packed sequences, --padding right; CPUs without oneDNN's bfloat16), and the JAX scan stack
    # with --padding right.
    "native": {"embedding": EMBEDDING, "input projection": "bfloat16 (x W_ih + b_ih rounded)",
               "recurrent matmul": "bfloat16 (h W_hh + b_hh rounded, then its sum with the projection)",
               "gate math": "bfloat16 (each activation rounded, and i * g)",
               "cell state": "float32 (f * c in float32); h float32, rounded to bfloat16 for the matmul",
               "classifier": "bfloat16 (Linear and sigmoid, each rounded once)", "loss": FLOAT32_LOSS},
    # Flax's nn.OptimizedLSTMCell(dtype=bfloat16) as it stands (--lstm-impl flax): not matched to PyTorch.
    "flax": {"embedding": EMBEDDING, "input projection": "bfloat16 (Flax's, per step)",
             "recurrent matmul": "bfloat16 (Flax's)", "gate math": "bfloat16 (Flax's)",
             "cell state": "float32 (promoted by the float32 carry); h float32",
             "classifier": "bfloat16 (Linear and sigmoid, each rounded once)", "loss": FLOAT32_LOSS},
    # cuDNN's bfloat16 RNN (cuDNN 9.13 or newer): its internal precisions are not measured here.
    "cudnn": {"lstm": "cuDNN's bfloat16 RNN (internal precisions not measured)",
              "classifier": "bfloat16 (Linear and sigmoid)", "loss": FLOAT32_LOSS},
}

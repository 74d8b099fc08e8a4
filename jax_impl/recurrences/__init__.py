"""The JAX twin's recurrence library, one for both workloads' models: every implementation serves one interface, a
layer over a sequence (:mod:`.interface`), declared once in its own module; :mod:`.choice` alone decides which runs.

    interface  Recurrence, what an implementation declares: its layers, its conditions, its optional overrides
    cells      PyTorch's LSTM and GRU cell equations, the reference every implementation is tested against
    stack      RNNStack: the parameters, the dropout masks and the one layer loop, for both workloads
    choice     REGISTRY (the only list), auto, and the refusals derived from the declarations
    scan       Flax nn.RNN over the reference cells (bfloat16: PyTorch's autocast)
    stock      "flax": Flax's stock cells fed PyTorch's weights
    fused      XLA loops with hand-written gradients; the embedding fold and the two-layer wavefront
    kernel     our recurrence kernel through XLA's FFI (CPU)
    onednn     oneDNN's LSTM primitive through XLA's FFI (CPU)
    cudnn      cuDNN's LSTM through jax.experimental.rnn (CUDA)
    native/    the C++ behind onednn and kernel, its build and its loader
"""

"""The JAX twin's recurrence implementations, a library both workloads' models call; :mod:`.choice` alone decides
which one runs (``--lstm-impl``) and refuses what one cannot compute.

    choice   the one owner of --lstm-impl: auto, and every implementation's conditions and refusals
    stacks   Flax nn.RNN over PyTorch's LSTM and GRU cells (scan, the reference) or Flax's stock cells (flax), layer
             by layer, every step's output returned: the classifier's and the language model's
    fused    XLA's fused LSTM: a wavefront loop with hand-written gradients (the classifier's)
    cudnn    cuDNN's LSTM through jax.experimental.rnn (the classifier's, CUDA)
    onednn   oneDNN's LSTM primitive through XLA's FFI (the classifier's, CPU)
    kernel   our recurrence kernel through XLA's FFI (the classifier's, CPU)
    native/  the C++ behind onednn and kernel, its build and its loader
"""

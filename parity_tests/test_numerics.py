"""The float rules the twins share by default, and the one flag that gives PyTorch its own back: XLA flushes
denormal floats to zero on the CPU and cannot be told otherwise, so the torch twin flushes them too unless
``--no-flush-denormal``."""
import jax
import numpy as np
import pytest
import torch

from common.config import Config
from common.errors import ConfigError
from jax_impl.train import JaxTwin
from torch_impl.numerics import set_numerics

CPU = torch.device("cpu")
TINY = 1e-39  # a float32 denormal (the smallest normal is 1.18e-38)


@pytest.fixture
def restore_torch_rules():
    yield
    set_numerics(Config(), CPU)  # the parity suite's setting


def test_a_denormal_product_is_zero_in_both_twins_by_default(restore_torch_rules):
    in_force = set_numerics(Config(), CPU)
    assert in_force == {"flush_denormal": True, "allow_tf32": False}
    assert (torch.tensor([TINY], dtype=torch.float32) * 2).item() == 0.0
    assert float(jax.jit(lambda a: a * 2)(np.float32(TINY))) == 0.0


def test_no_flush_denormal_keeps_pytorchs_gradual_underflow(restore_torch_rules):
    in_force = set_numerics(Config(flush_denormal=False), CPU)
    assert in_force["flush_denormal"] is False
    assert (torch.tensor([TINY], dtype=torch.float32) * 2).item() == pytest.approx(2e-39, rel=1e-6)


def test_jax_twin_refuses_no_flush_denormal_on_the_cpu():
    with pytest.raises(ConfigError, match="XLA always flushes denormals to zero on the CPU"):
        JaxTwin(Config(flush_denormal=False), vocab_size=10, device=jax.devices("cpu")[0])

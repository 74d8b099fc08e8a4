"""--flush-denormal reaches every intra-op thread. ``torch.set_flush_denormal`` sets the calling thread's flags, and
OpenMP's threads (which MKL and oneDNN run on) copy them once, when they start. The twin sets its float rules before
anything parallel runs, and records what a GEMM split over every thread shows, not what the flag asked for. Each
test runs in a fresh interpreter with two intra-op threads, whose pool has not started yet."""
import subprocess
import sys

from torch_impl.tests.conftest import ROOT

SETUP = ("import torch; torch.set_num_threads(2)\n"
         "from common.config import Config\n"
         "from torch_impl.numerics import denormals_flushed, set_numerics\n"
         "from torch_impl.train import TorchTwin\n")


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SETUP + code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_twin_flushes_denormals_on_every_intra_op_thread():
    proc = run("twin = TorchTwin(Config(embed_dim=8, hidden_dim=8), 50, torch.device('cpu'), None)\n"
               "print(twin.record['flush_denormal'], denormals_flushed())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"] and "warning" not in proc.stderr


def test_rules_set_after_the_threads_started_are_recorded_as_not_in_force_with_a_warning():
    # A GEMM first starts the pool while nothing flushes: the worker thread keeps gradual underflow for good.
    proc = run("torch.ones(512, 512) @ torch.ones(512, 512)\n"
               "print(set_numerics(Config(), torch.device('cpu'))['flush_denormal'], denormals_flushed())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "None"]  # None: some threads flush (this one), others do not
    assert proc.stderr.strip().splitlines() == [
        "warning: only some of PyTorch's intra-op threads flush denormals, against --flush-denormal (threads started "
        "before it was set keep their own rule; the run record says what is in force)"]


def test_no_flush_denormal_keeps_gradual_underflow_on_every_thread():
    proc = run("print(set_numerics(Config(flush_denormal=False), torch.device('cpu'))['flush_denormal'], "
               "denormals_flushed())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"] and "warning" not in proc.stderr

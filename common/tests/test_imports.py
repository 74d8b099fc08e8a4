"""``common`` is numpy-only: neither framework (nor its libraries) is imported by any common module."""
from __future__ import annotations

import json

FRAMEWORKS = ("jax", "jaxlib", "torch", "flax", "optax", "orbax")

# Imports every module of the package (found by listing it, so a new module is covered too), then runs the
# code paths that import lazily (safetensors in the neutral checkpoint), then reports what got imported.
_IMPORT_ALL = r"""
import importlib, json, pkgutil, sys, tempfile
import common
names = [m.name for m in pkgutil.iter_modules(common.__path__, "common.") if not m.name.startswith("common.tests")]
for name in names:
    importlib.import_module(name)
from common.checkpoint import load_checkpoint, save_checkpoint
from common.config import Config
from common.params import init_params
from common.text import Vocab
cfg = Config(embed_dim=4, hidden_dim=3, layers=1, seq_len=5)
with tempfile.TemporaryDirectory() as d:
    save_checkpoint(d + "/ck", init_params(3, 4, 3, 1, seed=0), cfg, Vocab(("<pad>", "<unk>", "a")), "char")
    load_checkpoint(d + "/ck")
top = sorted({m.split(".")[0] for m in sys.modules})
print(json.dumps({"modules": names, "top": top}))
"""


def test_no_common_module_imports_a_framework(python_code):
    proc = python_code(_IMPORT_ALL)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # The listing really found the package's modules (a broken listing would pass vacuously).
    assert {"common.config", "common.data", "common.checkpoint", "common.runstate",
            "common.lm_data"} <= set(report["modules"])
    assert not set(FRAMEWORKS) & set(report["top"]), set(FRAMEWORKS) & set(report["top"])

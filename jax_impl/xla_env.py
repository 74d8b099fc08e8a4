"""XLA's environment, set before JAX's backend starts: the workaround for a GPU scatter-add regression.

jaxlib 0.10.2 to 0.11.0 compile a float32 scatter-add on CUDA to a compare-and-swap loop instead of the native
atomic (LLVM's NVPTX backend started respecting the kernels' non-flushing denormal mode), hundreds of times
slower when indices repeat: exactly the embedding gradient. The LLVM option ``-nvptx-allow-ftz-atomics`` brings
the native atomic back (which flushes denormals in that one sum). XLA reads ``XLA_FLAGS`` once, when the
first backend starts, so :func:`configure` must run before any device is touched.

    configure() -> {"xla_scatter_workaround": bool, "xla_flags": str}    # idempotent
    record()    -> the same, as it stands now (for the run record)
"""
import importlib.metadata
import importlib.util
import os
import re

FTZ_ATOMICS = "-nvptx-allow-ftz-atomics"
EXTRA_OPTIONS = "--xla_backend_extra_options="
AFFECTED = ((0, 10, 2), (0, 11, 0))  # first and last jaxlib with the regression (fixed in 0.11.1)


def parse_version(version: str) -> tuple[int, int, int]:
    """'0.10.2', '0.11.0.dev20260101' → the leading (major, minor, patch); (0, 0, 0) if there is none."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(g) for g in match.groups()) if match else (0, 0, 0)


def workaround_applies(jaxlib_version: str | None, cuda_plugin: bool) -> bool:
    """Whether this jaxlib with (or without) a CUDA plugin has the slow GPU scatter-add."""
    return cuda_plugin and jaxlib_version is not None and AFFECTED[0] <= parse_version(jaxlib_version) <= AFFECTED[1]


def with_ftz_atomics(xla_flags: str) -> str:
    """``xla_flags`` with the LLVM option added to ``--xla_backend_extra_options`` (comma-separated), unchanged
    when it is there already or when ``--xla_gpu_ftz=true`` flushes everything anyway."""
    if FTZ_ATOMICS in xla_flags or "--xla_gpu_ftz=true" in xla_flags.lower():
        return xla_flags
    tokens = xla_flags.split()
    for i, token in enumerate(tokens):
        if token.startswith(EXTRA_OPTIONS):
            value = token[len(EXTRA_OPTIONS):]
            tokens[i] = EXTRA_OPTIONS + (f"{value},{FTZ_ATOMICS}" if value else FTZ_ATOMICS)
            return " ".join(tokens)
    return " ".join([*tokens, EXTRA_OPTIONS + FTZ_ATOMICS])


def installed() -> tuple[str | None, bool]:
    """(jaxlib's version or None, whether a jax CUDA plugin is installed), read without importing jax."""
    try:
        version = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        version = None
    plugin = any(importlib.util.find_spec(f"jax_cuda{v}_plugin") is not None for v in (12, 13))
    return version, plugin


def configure() -> dict:
    """Add the workaround to ``XLA_FLAGS`` where the installed jaxlib needs it; call before JAX's backend starts."""
    if workaround_applies(*installed()):
        os.environ["XLA_FLAGS"] = with_ftz_atomics(os.environ.get("XLA_FLAGS", ""))
    return record()


def record() -> dict:
    """``{"xla_scatter_workaround": the LLVM option is in XLA_FLAGS, "xla_flags": XLA_FLAGS}``."""
    flags = os.environ.get("XLA_FLAGS", "")
    return {"xla_scatter_workaround": FTZ_ATOMICS in flags, "xla_flags": flags}

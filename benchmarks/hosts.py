"""Which machine a results file was measured on, as the slug its published runs live under:
``docs/bench/<host>/<run>/``, host = CPU model, vector width and CPU count (``amd-epyc-avx2-2cpu``).

The vector width is ``environment["vector_isa"]`` (``avx512``, ``avx2`` or ``sse``) where the run recorded it. Runs
from before that field get it from an ``lscpu.txt`` saved beside their results, else from the committed mapping
:data:`LEGACY` (``docs/bench/legacy_hosts.json``), which says per CPU model and date what the CPU had and how that
is known."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "bench"
LEGACY = BENCH / "legacy_hosts.json"
ISAS = ("avx512", "avx2", "sse")
ISA_WORDS = {"avx512": "AVX-512", "avx2": "AVX2", "sse": "SSE only"}
# Words in a CPU's model name that say nothing about which CPU it is.
NOISE = re.compile(r"\((r|tm)\)|\b(processor|cpu|\d+-core)\b|@.*$", re.IGNORECASE)


class UnknownHost(ValueError):
    """A results file whose vector width neither its environment, an lscpu.txt, nor the legacy mapping gives."""


def isa_from_flags(flags: str) -> str:
    """The widest vector set a CPU's flags (``/proc/cpuinfo``'s or lscpu's) name: avx512 (``avx512f``), avx2 or
    sse."""
    words = set(flags.split())
    return "avx512" if "avx512f" in words else "avx2" if "avx2" in words else "sse"


def isa_from_lscpu(text: str) -> str | None:
    """The vector width an ``lscpu`` output's ``Flags:`` line gives, or None without one."""
    line = next((x for x in text.splitlines() if x.startswith("Flags:")), None)
    return line and isa_from_flags(line.split(":", 1)[1])


def legacy_isa(environment: dict, mapping: list[dict] | None = None) -> str | None:
    """The vector width the legacy mapping gives a run by its CPU model and the day it started, or None."""
    if mapping is None:
        mapping = json.loads(LEGACY.read_text(encoding="utf-8"))["hosts"]
    day = environment.get("date", "")[:10]
    return next((m["vector_isa"] for m in mapping if m["cpu_model"] == environment.get("cpu_model")
                 and m["first_day"] <= day <= m["last_day"]), None)


def vector_isa(environment: dict, run_dir: Path | None = None) -> str:
    """A run's vector width: its environment's ``vector_isa``, else an lscpu.txt in its directory, else the legacy
    mapping; :class:`UnknownHost` where none says."""
    if environment.get("vector_isa"):
        return environment["vector_isa"]
    lscpu = run_dir / "lscpu.txt" if run_dir else None
    isa = (lscpu and lscpu.is_file() and isa_from_lscpu(lscpu.read_text(encoding="utf-8"))) or legacy_isa(environment)
    if isa is None:
        raise UnknownHost(f"{run_dir or 'a run'}: no vector_isa in its environment, no lscpu.txt beside it and no "
                          f"entry for {environment.get('cpu_model')!r} on {environment.get('date', '?')[:10]} in "
                          f"{LEGACY.relative_to(ROOT)}")
    return isa


def cpu_slug(model: str) -> str:
    """A CPU model name as lowercase words joined by dashes, without trademarks and generic words:
    ``Intel(R) Xeon(R) Processor`` gives ``intel-xeon``."""
    return re.sub(r"[^a-z0-9]+", "-", NOISE.sub(" ", model).lower()).strip("-") or "unknown-cpu"


def host_slug(environment: dict, run_dir: Path | None = None) -> str:
    """The host directory a run is published under: ``<cpu model>-<vector isa>-<N>cpu``."""
    return f"{cpu_slug(environment['cpu_model'])}-{vector_isa(environment, run_dir)}-{environment['cpu_count']}cpu"


def describe(environment: dict, run_dir: Path | None = None) -> str:
    """The host in words, for a reader: ``AMD EPYC, AVX2, 2 CPUs``."""
    model = re.sub(r"\s+", " ", re.sub(r"\((R|TM)\)", "", environment["cpu_model"])).strip()
    return f"{model}, {ISA_WORDS[vector_isa(environment, run_dir)]}, {environment['cpu_count']} CPUs"

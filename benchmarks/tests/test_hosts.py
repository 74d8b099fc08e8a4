"""The host a published run lives under: its slug from the run's environment, and the vector width of runs from before
the environment recorded it (the legacy mapping, checked against what the runs themselves show)."""
import json
from pathlib import Path

import pytest

from benchmarks import hosts

RUNS = sorted(hosts.BENCH.glob("*/*/results.json"))
LSCPU_FLAGS = "Flags: fpu sse sse2 avx f16c fma avx2 bmi2"


def environment(**extra) -> dict:
    return {"cpu_model": "AMD EPYC", "cpu_count": 2, "date": "2026-12-07T10:15:44+00:00", **extra}


def test_a_cpu_model_loses_its_trademarks_and_generic_words():
    assert hosts.cpu_slug("Intel(R) Xeon(R) Processor") == "intel-xeon"
    assert hosts.cpu_slug("AMD EPYC 7B13 64-Core Processor") == "amd-epyc-7b13"
    assert hosts.cpu_slug("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz") == "intel-xeon-platinum-8481c"


def test_the_environments_vector_isa_decides_the_host_over_the_legacy_mapping():
    # 2026-12-07's AMD EPYC is AVX2 in the mapping: a run that records avx512 is published as avx512.
    assert hosts.host_slug(environment(vector_isa="avx512")) == "amd-epyc-avx512-2cpu"
    assert hosts.host_slug(environment()) == "amd-epyc-avx2-2cpu"
    assert hosts.describe(environment()) == "AMD EPYC, AVX2, 2 CPUs"


def test_an_lscpu_beside_a_run_gives_its_vector_width(tmp_path: Path):
    (tmp_path / "lscpu.txt").write_text(f"Model name: AMD EPYC\n{LSCPU_FLAGS} avx512f avx512bw\n", encoding="utf-8")
    assert hosts.vector_isa(environment(date="2030-01-01T00:00:00+00:00"), tmp_path) == "avx512"
    assert hosts.isa_from_lscpu(LSCPU_FLAGS) == "avx2"
    assert hosts.isa_from_flags("fpu sse sse2 ssse3") == "sse"


def test_a_run_no_source_places_is_refused_with_what_to_add():
    with pytest.raises(hosts.UnknownHost, match="legacy_hosts.json"):
        hosts.host_slug(environment(date="2030-01-01T00:00:00+00:00"))


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.parent.relative_to(hosts.BENCH)))
def test_every_published_run_lives_under_its_hosts_slug(path: Path):
    env = json.loads(path.read_text(encoding="utf-8"))["environment"]
    assert hosts.host_slug(env, path.parent) == path.parent.parent.name


def test_each_runs_vector_width_agrees_with_the_kernel_tiles_and_lscpu_files_it_holds():
    tiles = {"AVX-512 tiles": "avx512", "AVX2 tiles": "avx2"}
    checked = 0
    for path in RUNS:
        doc = json.loads(path.read_text(encoding="utf-8"))
        ran = {tiles[r["provenance"]["gemm"]] for r in doc["results"]
               if r["provenance"] and r["provenance"].get("gemm") in tiles}
        lscpu = ({hosts.isa_from_lscpu(path.with_name("lscpu.txt").read_text(encoding="utf-8"))}
                 if path.with_name("lscpu.txt").is_file() else set())
        env = doc["environment"]
        host = env.get("vector_isa") or hosts.legacy_isa(env)  # a run from before the field: the mapping's
        if ran | lscpu:
            assert lscpu <= {host}, path
            # The widest tiles the host runs, or narrower ones forced (LSTM_KERNEL_ISA=avx2 on an AVX-512 host), which
            # the run's name says: the results record what ran, not the variable.
            assert ran <= {"avx512", "avx2"} if host == "avx512" else ran <= {host}, path
            assert not ran or host in ran or "forced" in path.parent.name, path
            checked += 1
    # At least the AVX-512 EPYC's default run and 3 kernel sweeps, and the AVX2 EPYC's 3 default runs, 3 sweeps and 2
    # language model runs (a later run adds to them).
    assert checked >= 12

"""``pyproject.toml``'s ranges against what the versions study ran (:mod:`studies.versions`, its records
``docs/bench/<host>/<run>/versions.json``): :func:`range_problems` says where they disagree, which a test asserts
never happens."""
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
RANGED = ("jax", "flax", "optax", "orbax-checkpoint", "torch")  # the requirements whose ranges the study decides


def requirements(pyproject: Path = PYPROJECT) -> dict[str, Requirement]:
    """``pyproject.toml``'s runtime requirements, by distribution name."""
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    return {(r := Requirement(d)).name.lower(): r for d in deps}


def outside_ranges(pins: dict[str, str], reqs: dict[str, Requirement]) -> list[str]:
    """The pins ``pyproject.toml``'s ranges exclude, each as ``"jax 0.4.35"``."""
    return [f"{d} {v}" for d, v in pins.items() if d in reqs and not reqs[d].specifier.contains(v, prereleases=True)]


def next_minor(version: str) -> Version:
    """The release after ``version``'s minor series: 0.10.2 → 0.11, 2.13.0+cpu → 2.14."""
    major, minor = Version(version).release[:2]
    return Version(f"{major}.{minor + 1}")


def range_problems(specifiers: dict[str, SpecifierSet], records: list[dict]) -> list[str]:
    """Where ``pyproject.toml``'s ranges (``specifiers``, by distribution) disagree with the studies' records: each
    of :data:`RANGED` must admit every release of a set that passed the smoke subset, start at the oldest of them
    (``>=`` it) and stop before the minor series after the newest (``<`` it); each failed set must have a pin the
    ranges exclude."""
    passed = [s for doc in records for s in doc["sets"] if s["status"] == "ok"]
    failed = [s for doc in records for s in doc["sets"] if s["status"] != "ok"]
    problems = []
    for dist in RANGED:
        spec, versions = specifiers[dist], sorted({s["pins"][dist] for s in passed}, key=Version)
        if not versions:
            problems.append(f"{dist}: no set that passed the smoke subset records it")
            continue
        for v in versions:
            if not spec.contains(v, prereleases=True):
                problems.append(f"{dist}{spec} excludes {v}, which passed the smoke subset")
        floors = [Version(x.version) for x in spec if x.operator == ">="]
        if floors != [Version(Version(versions[0]).public)]:
            problems.append(f"{dist}{spec} should start at >={Version(versions[0]).public}, the oldest release that "
                            f"passed")
        ceilings = [Version(x.version) for x in spec if x.operator == "<"]
        if ceilings != [next_minor(versions[-1])]:
            problems.append(f"{dist}{spec} should stop at <{next_minor(versions[-1])}, after {versions[-1]}, the "
                            f"newest release that passed")
    for s in failed:
        if not any(not specifiers[d].contains(s["pins"][d], prereleases=True) for d in RANGED):
            problems.append(f"set {s['name']} failed ({s['status']}: {s['reason']}), yet pyproject.toml admits "
                            f"every pin of it")
    return problems

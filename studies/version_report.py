"""A versions study's record (``versions.json``, :mod:`studies.versions`) as a reader sees it: its tables
(:func:`tables`, also the ``versions`` view of the generated docs) and its chart (:func:`plot`), each from the record
alone."""
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

from benchmarks.tables import table

WIDTH = 120


def wrap(text: str) -> list[str]:
    """A sentence in lines of at most :data:`WIDTH` characters."""
    return textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def cell(r: dict | None, digits: int = 2) -> str:
    return "–" if r is None else f"{r['ratio']:.{digits}f}× [{r['ci95'][0]:.{digits}f}–{r['ci95'][1]:.{digits}f}]"


def tables(doc: dict) -> list[str]:
    """The record as Markdown: the sets (releases, smoke subset, what cannot run, venv), the ratios against each
    set's ``torch:eager``, each row's own time against the newest set's."""
    tiers, newest = doc["settings"]["tiers"], doc["settings"]["newest"]
    sets = [["`" + s["name"] + "`", s["pins"]["jax"], s["pins"]["flax"], s["pins"]["optax"], s["pins"]["torch"],
             (s["installed"] or {}).get("numpy") or "–",
             s["status"] + (f": {s['reason']}" if s["reason"] else "")
             + (f" ({s['smoke']['passed']} passed, {s['smoke']['skipped']} skipped)" if s["status"] == "ok" else ""),
             "; ".join(f"`{k}`: {v}" for k, v in s.get("tiers", {}).items() if v) or "–",
             "; ".join(s["outside_ranges"]) or "in",
             f"{s['venv']['size_mb']:,} MB, built in {s['venv']['install_s']:.0f} s" if s["venv"] else "–"]
            for s in doc["sets"]]
    ranges = ", ".join(f"`{d}{spec}`" for d, spec in doc["pyproject"].items())
    lines = [*wrap(f"Sets (smoke subset: `studies.versions.SMOKE`; pyproject: the pins outside its ranges, {ranges}; "
                   f"venv: its size on disk and the time its first run took to build it):"), "",
             *table(("set", "jax", "flax", "optax", "torch", "numpy", "smoke subset", "what cannot run there",
                     "pyproject", "venv"), sets, True).splitlines()]
    by = {(r["set"], r["variant"]): r for r in doc["rows"]}
    names = [s["name"] for s in doc["sets"] if (s["name"], "torch:eager") in by]
    ratios = [[f"`{n}`", *(cell(by[n, f"jax:{t}"].get("vs_torch", {}).get("train")) if by[n, f"jax:{t}"]["status"]
                           == "ok" else by[n, f"jax:{t}"]["status"] for t in tiers)] for n in names]
    lines += ["", *wrap(f"Training step against each set's `torch:eager` (above 1: JAX faster; "
                        f"{doc['settings']['rounds']} paired rounds, {doc['busy_rounds']} of the round kinds busy, one "
                        f"worker a row):"), "",
              *table(("set", *(f"`jax:{t}`" for t in tiers)), ratios, True).splitlines()]
    own = [[f"`{n}`", *(f"{r['ms']['train']:.0f} ms ({cell(r['time_vs_newest'].get('train'))})"
                        if r["status"] == "ok" and "train" in r["ms"] else r["status"]
                        for r in (by[n, v] for v in ("torch:eager", *(f"jax:{t}" for t in tiers))))] for n in names]
    lines += ["", *wrap(f"Each row's training step, ms, and its time against `{newest}`'s (above 1: slower than "
                        f"the newest):"), "", *table(("set", "`torch:eager`", *(f"`jax:{t}`" for t in tiers)), own,
                                      True).splitlines()]
    built = sum(not s["venv"].get("cached", True) for s in doc["sets"])
    return [*lines, "", *wrap(f"The whole run: {doc['environment']['run_wall_s']:.0f} s (`run_wall_s`), {built} of "
                              f"its {len(doc['sets'])} venvs built in it.")]


def plot(doc: dict, path: Path) -> None:
    """Ratio against release date (training, each tier; hollow where the set's torch is not the newest set's) and
    each row's ms a step against its framework's release date."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed: the chart is written to a file
    import matplotlib.pyplot as plt

    tiers, newest = doc["settings"]["tiers"], doc["settings"]["newest"]
    when = {s["name"]: s for s in doc["sets"]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for tier, colour in zip(tiers, ("tab:blue", "tab:orange", "tab:green")):
        for r in (r for r in doc["rows"] if r["variant"] == f"jax:{tier}" and r.get("vs_torch", {}).get("train")):
            s, v = when[r["set"]], r["vs_torch"]["train"]
            hollow = s["pins"]["torch"] != when[newest]["pins"]["torch"]
            x = datetime.fromisoformat(s["jax_date"]) + timedelta(days=10 if hollow else 0)  # beside its twin set
            left.errorbar(x, v["ratio"], yerr=[[v["ratio"] - v["ci95"][0]], [v["ci95"][1] - v["ratio"]]],
                          fmt="o", color=colour, mfc="white" if hollow else colour, capsize=3,
                          label=f"jax:{tier}" if r["set"] == newest else None)
            if tier == tiers[-1]:
                left.annotate(s["name"], (x, v["ratio"]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    left.axhline(1, color="grey", lw=0.8)
    left.set(title="training step vs each set's torch:eager (hollow: another torch)", xlabel="jax release date",
             ylabel="ratio (above 1: JAX faster)")
    left.legend()
    for variant, colour in zip(("torch:eager", *(f"jax:{t}" for t in tiers)), ("black", "tab:blue", "tab:orange",
                                                                               "tab:green")):
        framework = variant.split(":")[0]
        points = sorted({(when[r["set"]][f"{framework}_date"], r["ms"]["train"], when[r["set"]]["pins"][framework])
                         for r in doc["rows"] if r["variant"] == variant and "train" in r["ms"]})
        if points:
            right.plot([datetime.fromisoformat(d) for d, *_ in points], [m for _, m, _ in points], "o-",
                       color=colour, label=variant)
            for d, m, version in points if variant in ("torch:eager", f"jax:{tiers[0]}") else ():
                right.annotate(version, (datetime.fromisoformat(d), m), fontsize=7, xytext=(4, 4),
                               textcoords="offset points")
    right.set(title="ms a training step (median over rounds)", xlabel="the row's framework release date",
              ylabel="ms")
    right.legend()
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

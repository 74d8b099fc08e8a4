"""The documentation's figures come from the published runs: every generated block is current and names a run that
exists, no speed figure is typed outside a block in README.md or docs/*.md, and performance.md's hand-written figures
sit in its dated log, each entry naming sources that exist. Also the views themselves, on the published runs."""
import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import hosts, render
from benchmarks.hosts import BENCH, ROOT
from tools import publish, views

# A speed figure: a ratio (1.70×), an interval ([1.61–1.95]) or a run's length in seconds (536 s).
FIGURE = re.compile(r"\d+\.\d+×|\[\d+\.\d+–\d+\.\d+\]|\b\d{3,4}(?:\.\d+)? s\b")
# Not a measurement: a bound or target (≥ 1.5×), or a limit the code sets (default 480 s, at most 120 s).
NOT_MEASURED = re.compile(r"(?:[≥≤<>] |(?:default|at most|under|within) )$")
# Figures the pattern finds that are no benchmark's, each with why it may stay typed by hand.
ALLOWED = {("docs/training.md", "1355 s"): "an 8-epoch training's length, measured by the command quoted beside it"}
KERNEL_AVX2 = Path("docs/bench/amd-epyc-avx2-2cpu/2026-12-07-default-2")
SWEEP_AVX2 = Path("docs/bench/amd-epyc-avx2-2cpu/2026-12-07-kernel-sweep-seq-len")
DTYPE_INTEL = Path("docs/bench/intel-xeon-avx512-2cpu/2026-12-05-sweep-dtype")


def outside_blocks(text: str) -> str:
    """``text`` with every generated block's body blanked (its lines kept, so line numbers still count)."""
    for b in reversed(publish.find_blocks(Path("page.md"), text)):
        text = text[:b.start] + re.sub(r"[^\n]", "", b.body) + text[b.start + len(b.body):]
    return text


def hand_figures(text: str) -> list[str]:
    """``line: figure`` for each speed figure in ``text`` outside the generated blocks."""
    text = outside_blocks(text)
    return [f"{publish.line_of(text, m.start())}: {m[0]}" for m in FIGURE.finditer(text)
            if not NOT_MEASURED.search(text[max(0, m.start() - 10):m.start()])]


def test_the_figure_scan_finds_ratios_intervals_and_run_times_but_not_bounds_or_blocks():
    text = ("trains at 1.70× [1.61–1.95]; the run took 536 s.\nTarget: ≥ 1.5×; a budget of default 480 s.\n"
            "<!-- figures: docs/bench/x/y headline -->\nhere 1.80× is generated\n<!-- /figures -->\nabout 4× in 2 s")
    assert hand_figures(text) == ["1: 1.70×", "1: [1.61–1.95]", "1: 536 s"]


def test_no_figure_block_is_stale_against_its_results_file():
    stale = [str(p) for p in publish.publish(check=True) if p.message.endswith("stale") or "index" in p.message]
    assert not stale, "run python -m tools.publish (make docs):\n" + "\n".join(stale)


def test_every_figure_block_names_a_source_that_exists_and_a_view():
    broken = [str(p) for p in publish.publish(check=True) if "does not exist" in p.message or "no such view"
              in p.message]
    assert not broken, "\n".join(broken)
    # The README quotes the latest default run of this project's current host, and names it.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert ("<!-- figures: docs/bench/intel-xeon-avx512-2cpu/2026-12-07-redesign-default headline -->\nHost "
            "`intel-xeon-avx512-2cpu`") in readme


@pytest.mark.parametrize("page", [p for p in publish.pages() if p.name != "performance.md"], ids=str)
def test_speed_figures_in_readme_and_docs_appear_only_inside_generated_blocks(page: Path):
    found = [x for x in hand_figures((ROOT / page).read_text(encoding="utf-8"))
             if (str(page), x.split(": ", 1)[1]) not in ALLOWED]
    assert not found, f"{page}: figures typed by hand (quote them through a block, or log them in performance.md):\n" \
        + "\n".join(found)


def test_performance_md_keeps_hand_written_figures_to_its_dated_log():
    text = (ROOT / "docs/performance.md").read_text(encoding="utf-8")
    reference = text.split("\n## Log\n", 1)[0]
    assert not hand_figures(reference)
    assert "1.36×" not in outside_blocks(reference)  # the fused study's headline, against an unflushed PyTorch


def log_entries() -> list[tuple[str, str]]:
    """performance.md's log: ``(heading, body)`` per ``###`` entry."""
    log = (ROOT / "docs/performance.md").read_text(encoding="utf-8").split("\n## Log\n", 1)[1]
    return [tuple(x.split("\n", 1)) for x in re.split(r"^### ", log, flags=re.MULTILINE)[1:]]


def exists(source: str) -> bool:
    """Whether a log entry's source is there: a path, ``python -m MODULE ...``, ``python FILE ...``, ``make TARGET``."""
    words = source.split()
    if words[0] == "make":
        return re.search(rf"^{re.escape(words[1])}:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M) is not None
    if words[0] == "python":
        path = words[2].replace(".", "/") + ".py" if words[1] == "-m" else words[1]
        return (ROOT / path).is_file()
    return (ROOT / source).exists()


@pytest.mark.parametrize("heading, body", log_entries(), ids=lambda v: v[:60])
def test_each_log_entry_is_headed_by_date_and_host_and_names_sources_that_exist(heading, body):
    m = re.match(r"(\d{4}-\d\d-\d\d)(?: to \d{4}-\d\d-\d\d)?, (?P<hosts>[\w-]+(?: and [\w-]+)*): \S", heading)
    assert m, f"{heading!r}: not 'DATE, HOST: what'"
    for host in m["hosts"].split(" and "):
        assert (BENCH / host).is_dir(), f"{heading!r}: no host {host} under docs/bench"
    sources = re.search(r"^\*Sources:\*(.*?)(?:\n\n|\Z)", body, re.MULTILINE | re.DOTALL)
    assert sources, f"{heading!r}: no *Sources:* paragraph"
    named = re.findall(r"`([^`]+)`", sources[1].replace("\n", " "))
    assert named and all(exists(s) for s in named), [s for s in named if not exists(s)]


def test_the_log_holds_every_investigation_newest_first():
    dates = [h[:10] for h, _ in log_entries()]
    assert dates == sorted(dates, reverse=True) and len(dates) == 16


def test_each_published_run_is_kept_once():
    runs: dict[bytes, list[str]] = {}
    for results in sorted(BENCH.glob("*/*/results.json")):
        runs.setdefault(results.read_bytes(), []).append(str(results.parent.relative_to(BENCH)))
    assert [names for names in runs.values() if len(names) > 1] == []


def test_a_block_is_filled_from_its_run_and_names_its_host_and_run():
    page = Path("docs/example.md")
    text, problems = publish.blocks(page, f"x\n<!-- figures: {KERNEL_AVX2} headline -->\n<!-- /figures -->\ny\n")
    assert [p.message for p in problems] == [f"{KERNEL_AVX2} headline: stale"]
    first = " ".join(text.split("\n\n")[0].split("\n")[2:])  # the provenance, its lines joined
    assert first == ("Host `amd-epyc-avx2-2cpu` (AMD EPYC, AVX2, 2 CPUs), run [`2026-12-07-default-2`]"
                     "(bench/amd-epyc-avx2-2cpu/2026-12-07-default-2/results.md), 2026-12-07 10:15 UTC:")
    assert "- JAX with a custom kernel against stock PyTorch: our recurrence kernel as `jax_impl.train`'s default " \
        "(`jax:jit`) trains at 1.80× [1.55–1.91]" in text.replace("\n  ", " ")
    again, problems = publish.blocks(page, text)
    assert again == text and problems == []


def test_a_block_whose_run_is_missing_or_whose_body_was_edited_is_reported():
    page = Path("README.md")
    _, missing = publish.blocks(page, "<!-- figures: docs/bench/nowhere/run headline -->\n<!-- /figures -->\n")
    assert "its source does not exist" in missing[0].message
    text, _ = publish.blocks(page, f"<!-- figures: {KERNEL_AVX2} parity -->\n<!-- /figures -->\n")
    _, edited = publish.blocks(page, text.replace("1.2e-07", "1.0e-07"))
    assert [p.message for p in edited] == [f"{KERNEL_AVX2} parity: stale"]


def test_the_flops_view_splits_the_kernels_lead_into_algorithm_and_code():
    lines = re.sub(r"\s+", " ", " ".join(views.flops(views.load(KERNEL_AVX2, Path("README.md")), ["jax:jit"])))
    # 71.76 / 49.17 = 1.46 by FLOPs; trained at 1.80×: 1.80 / 1.46 = 1.23 per FLOP.
    assert ("a training step executes 49.17 GFLOP against `torch:eager`'s 71.76, 1.46× by FLOPs alone; it trains at "
            "1.80×, so its code runs 1.23× as fast per FLOP") in lines


def test_the_sweep_view_reads_each_point_as_the_runs_report_does():
    table = views.sweep(views.load(SWEEP_AVX2, Path("README.md")), ["seq_len"])
    assert table[0] == ("| seq_len | torch:eager ms | jax:fused ms | jax:fused train / eval | jax:kernel ms | "
                        "jax:kernel train / eval |")
    # The values performance.md's log typed by hand for T 800, now read from the run.
    assert table[-1] == ("| 800 | 3584.4 | 2602.2 | 1.41× [0.92–1.69] / 1.16× [0.88–1.46] | 1947.9 | "
                         "1.81× [1.72–2.01] / 1.47× [1.08–1.64] |")


def test_the_dtype_view_quotes_the_same_speedups_as_the_runs_report():
    run = views.load(DTYPE_INTEL, Path("README.md"))
    rows = [line.split(" | ") for line in views.dtype(run, [])[2:]]
    mine = [f"{row[0].strip('| `').replace('` ', ' ')}: float32 ms / bfloat16 ms = {row[3]} (unpaired: two sessions)"
            for row in rows]
    assert mine == render.dtype_costs(run.doc)
    assert mine[0] == "torch:eager train: float32 ms / bfloat16 ms = 2.08× [2.00–2.46] (unpaired: two sessions)"


def test_the_views_render_whatever_rows_a_run_has():
    run = views.load(KERNEL_AVX2, Path("README.md"))
    doc = copy.deepcopy(run.doc)
    doc["results"] = [r for r in doc["results"] if r["variant"] != "onednn"]  # a row missing
    nnx = [dict(copy.deepcopy(r), variant="nnx") for r in doc["results"] if r["variant"] == "flax"]
    doc["results"] += nnx  # a row no view names
    doc["comparisons"] += [dict(c, variant="jax:nnx") for c in doc["comparisons"] if c["variant"] == "jax:flax"]
    doc["headline"] = doc["headline"][:1]
    run = views.Run(run.path, doc, run.page)
    for view in views.VIEWS:
        if view not in ("sweep", "dtype", "lm", "loop-cost", "walls", "versions"):
            views.render(run, view, [])
    table = "\n".join(views.speed_table(run, []))
    assert "`jax:nnx`" in table and "`jax:onednn`" not in table
    assert views.flops(run, ["jax:onednn"]) == []


def test_every_link_a_block_writes_points_at_a_file_that_exists():
    checked = 0
    for page in publish.pages():
        for block in publish.find_blocks(page, (ROOT / page).read_text(encoding="utf-8")):
            for target in re.findall(r"\]\(([^)#]+)\)", block.body):
                assert (ROOT / page.parent / target).is_file(), f"{page}: {target}"
                checked += 1
    assert checked == sum(len(publish.find_blocks(p, (ROOT / p).read_text(encoding="utf-8")))
                          for p in publish.pages())  # one provenance link a block


def test_the_stages_view_sums_each_stage_and_leaves_the_rest_to_the_parent():
    before = views.load(Path("docs/bench/amd-epyc-avx2-2cpu/2026-12-07-default-before-cuts"), Path("README.md"))
    table = views.stages(before, [])
    # stage_wall_s of that run: load 86.6 s, 14 set-ups 129.6 s, rounds 223.1 s, 6 parity runs 96.2 s, gemm 5.6 s
    assert table[2:7] == ["| load | 87 |", "| setup | 130 |", "| rounds | 223 |", "| parity | 96 |", "| gemm | 6 |"]
    assert table[-1] == "| **all** (`run_wall_s`) | **543** |"


def test_a_bad_flag_is_one_line_and_exit_2(capsys):
    assert publish.main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == "error: python -m tools.publish: unrecognized arguments: --bogus\n"


@pytest.fixture
def site(tmp_path: Path, monkeypatch) -> Path:
    """A copy of the pages and the published runs, the publisher's root moved there: it never touches the real docs
    (in a subprocess, an editable install would import the real tree's publisher, whose root is the real one)."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for module in (hosts, publish):
        monkeypatch.setattr(module, "ROOT", tmp_path)
        monkeypatch.setattr(module, "BENCH", tmp_path / "docs" / "bench")
    monkeypatch.setattr(hosts, "LEGACY", tmp_path / "docs" / "bench" / hosts.LEGACY.name)
    return tmp_path


def publish_in(capsys, *args: str) -> subprocess.CompletedProcess:
    """``python -m tools.publish ARGS`` over the site: its exit status and what it printed."""
    capsys.readouterr()
    status = publish.main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, out, err)


def snapshot(site: Path) -> dict[Path, bytes]:
    """Every page and published file of ``site``, by path."""
    return {p: p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file() and p.suffix in (".md", ".json")}


def test_a_block_without_its_end_is_refused_naming_its_line_and_nothing_is_written(site, capsys):
    page = site / "docs/language-model.md"
    text = page.read_text(encoding="utf-8")
    lm_small = "<!-- figures: docs/bench/amd-epyc-avx2-2cpu/2026-12-07-lm-small lm -->\n"
    opened = text.index(lm_small)
    close = text.index("\n<!-- /figures -->\n", opened)
    page.write_text(text[:close] + text[close + len("\n<!-- /figures -->"):], encoding="utf-8")  # its end deleted
    line, after = publish.line_of(text, opened), publish.line_of(text, text.index("<!-- figures:", close)) - 1
    before = snapshot(site)
    expected = (f"docs/language-model.md:{line}: the figure block docs/bench/amd-epyc-avx2-2cpu/2026-12-07-lm-small lm "
                f"has no end: another opens at line {after} before its <!-- /figures -->; add it")
    proc = publish_in(capsys)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {expected}\n")
    assert snapshot(site) == before  # the hand-written lines after the block among them
    check = publish_in(capsys, "--check")
    assert (check.returncode, check.stderr) == (1, f"{expected}\n1 stale or broken; run {publish.PROG} (make docs)\n")
    assert snapshot(site) == before


@pytest.mark.parametrize("text, line, message", [
    ("a\n<!-- figures: x/y headline -->\nb\n", 2, "the figure block x/y headline has no end: the page ends before "
     "its <!-- /figures -->; add it"),
    ("<!-- figures: x/y headline -->\n<!-- figures: x/z table -->\nb\n<!-- /figures -->\n", 1,
     "the figure block x/y headline has no end: another opens at line 2 before its <!-- /figures -->; add it"),
    ("a\n\n<!-- /figures -->\n", 3, "<!-- /figures --> closes no block (no opening marker above it)"),
    ("<!-- figures: x/y -->\n<!-- /figures -->\n", 1, "a malformed figure marker '<!-- figures: x/y -->': a block "
     "opens with '<!-- figures: SOURCE VIEW [ARG ...] -->' and closes with '<!-- /figures -->', each a line"),
])
def test_markers_that_do_not_pair_up_are_refused_at_their_line(text, line, message):
    with pytest.raises(publish.Unpaired) as caught:
        publish.blocks(Path("docs/page.md"), text)
    assert str(caught.value) == f"docs/page.md:{line}: {message}"


def test_regenerating_blocks_changes_their_bodies_and_nothing_else():
    text = (f"intro\n<!-- figures: {KERNEL_AVX2} headline -->\nold\nlines\n<!-- /figures -->\nbetween `<!-- /figures "
            f"-->` in prose\n<!-- figures: {KERNEL_AVX2} parity -->\n<!-- /figures -->\nend\n")
    new, problems = publish.blocks(Path("docs/page.md"), text)
    assert [p.message for p in problems] == [f"{KERNEL_AVX2} headline: stale", f"{KERNEL_AVX2} parity: stale"]
    assert outside_blocks(new).replace("\n", "") == outside_blocks(text).replace("\n", "")
    assert new.startswith("intro\n") and new.endswith("\n<!-- /figures -->\nend\n")


@pytest.mark.parametrize("check", [False, True], ids=["publish", "check"])
def test_a_results_file_that_is_not_json_is_one_line_naming_it_and_nothing_is_written(site, check, capsys):
    results = site / "docs/bench/amd-epyc-avx2-2cpu/2026-12-07-lm-small/results.json"
    results.write_text('{"results": [', encoding="utf-8")
    before = snapshot(site)
    proc = publish_in(capsys, *["--check"] * check)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("error: docs/bench/amd-epyc-avx2-2cpu/2026-12-07-lm-small/results.json: not a results "
                           "file (Expecting value: line 1 column 14 (char 13)); restore it (git checkout) or rerun "
                           "its command\n")
    assert snapshot(site) == before

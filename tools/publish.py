"""Regenerate every figure the documentation quotes from the published runs: ``python -m tools.publish
[--check]`` (``make docs``).

A figure block in README.md or docs/*.md is

    <!-- figures: docs/bench/<host>/<run> VIEW [ARG ...] -->
    ...generated text...
    <!-- /figures -->

naming its source run (a directory under docs/bench holding results.json) and one of :data:`views.VIEWS`. This
rewrites each block's body from its run, and each "where to look" link ``[path.py:N](path.py#LN)`` written beside a
backticked name to the line that defines that name. ``--check`` writes nothing and exits 1, listing every stale
block, every block whose source does not exist, every stale link and every page whose markers do not pair up.

A marker is a line of its own. Each opening marker must be closed before the next one opens and before the page
ends, and each closing marker must close one: a page where they do not pair up (a closing marker deleted by hand) is
refused, page:line in one line and exit 2, before any page is written, so that text outside the blocks is never
replaced. So is a results file that is not JSON. Markers are found line by line, a few dozen lines: a templating
library would add a dependency and a syntax for no more than that.
"""
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.hosts import BENCH, ROOT
from common.config import Parser
from common.errors import UserError, cli_main
from tools import views

PROG = "python -m tools.publish"
OPEN = re.compile(r"<!-- figures: (?P<source>\S+) (?P<view>[\w-]+)(?P<args>(?: [^ >]+)*) -->")
CLOSE = "<!-- /figures -->"
MARKER = re.compile(r"\s*<!--\s*/?\s*figures\b")  # a line that starts so is a marker, well-formed or not
LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<path>[\w./]+\.py)#L(?P<line>\d+)\)")
NAME_AFTER = re.compile(r"\s*`(?P<name>[^`]+)`")
NAME_BEFORE = re.compile(r"`(?P<name>[^`]+)`\s*\($")


def pages() -> list[Path]:
    """The pages that quote figures, relative to the repository."""
    return [Path("README.md"), *sorted(p.relative_to(ROOT) for p in (ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Problem:
    """Something ``--check`` reports: where, and what."""

    page: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.message}"


def line_of(text: str, offset: int) -> int:
    """The 1-based line of ``offset`` in ``text``."""
    return text.count("\n", 0, offset) + 1


class Unpaired(UserError):
    """A page whose figure markers do not pair up: its message is the :class:`Problem`'s, page:line first."""


@dataclass(frozen=True)
class Block:
    """A figure block of a page: what its opening marker names, where it is, and its body (the lines between the
    markers, without the newline before the closing one)."""

    source: str
    view: str
    args: str  # the words after the view, each after a space, as written
    line: int  # the opening marker's line, 1-based
    start: int  # the offset of the body's first character (just after the opening marker's line)
    end: int  # the offset of the closing marker's line
    body: str

    @property
    def name(self) -> str:
        return f"{self.source} {self.view}{self.args}"


def find_blocks(page: Path, text: str) -> list[Block]:
    """The figure blocks of ``text``, in order; :class:`Unpaired` at the first marker line that is malformed, opens
    a block inside another, or closes none, or at a block the page ends inside."""
    found, opened, offset = [], None, 0  # opened: (line, match, body's start) of the block being read
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        start, offset, marker = offset, offset + len(line), line.rstrip("\n")
        if not MARKER.match(marker):
            continue
        if (m := OPEN.fullmatch(marker)) is not None:
            if opened:
                raise Unpaired(Problem(page, opened[0], f"the figure block {opened[1]['source']} {opened[1]['view']} "
                                       f"has no end: another opens at line {number} before its {CLOSE}; add it"))
            opened = (number, m, offset)
        elif marker == CLOSE:
            if not opened:
                raise Unpaired(Problem(page, number, f"{CLOSE} closes no block (no opening marker above it)"))
            (first, m, body), opened = opened, None
            found.append(Block(m["source"], m["view"], m["args"], first, body, start, text[body:max(body, start - 1)]))
        else:
            raise Unpaired(Problem(page, number, f"a malformed figure marker {marker.strip()!r}: a block opens with "
                                   f"'<!-- figures: SOURCE VIEW [ARG ...] -->' and closes with '{CLOSE}', each a line"))
    if opened:
        raise Unpaired(Problem(page, opened[0], f"the figure block {opened[1]['source']} {opened[1]['view']} has no "
                               f"end: the page ends before its {CLOSE}; add it"))
    return found


def blocks(page: Path, text: str) -> tuple[str, list[Problem]]:
    """``text`` with every figure block's body regenerated (nothing outside the bodies changes), and the blocks that
    were stale or name a missing source; :class:`Unpaired` where the markers do not pair up."""
    problems: list[Problem] = []
    out, done = [], 0  # the text up to offset ``done`` is in ``out``
    for b in find_blocks(page, text):
        if b.view not in views.VIEWS:
            problems.append(Problem(page, b.line, f"{b.name}: no such view (views: {', '.join(views.VIEWS)})"))
            continue
        try:
            run = views.load(Path(b.source), page)
        except FileNotFoundError as e:
            problems.append(Problem(page, b.line, f"{b.name}: its source does not exist ({e})"))
            continue
        body = views.render(run, b.view, b.args.split())
        if body != b.body:
            problems.append(Problem(page, b.line, f"{b.name}: stale"))
        out += [text[done:b.start], body, "\n"]
        done = b.end
    return "".join(out) + text[done:], problems


def identifier(name: str) -> str:
    """The last dotted part of a backticked name, without its call: ``jax.lax.stop_gradient(carry)`` gives
    stop_gradient."""
    return name.split("(", 1)[0].rsplit(".", 1)[-1]


def definition(path: Path, name: str) -> int | None:
    """The line of ``path`` that defines ``name`` (a ``def``, a ``class`` or a top-level assignment) where exactly one
    does, else None."""
    pattern = re.compile(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]")
    found = [i for i, x in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1) if pattern.match(x)]
    return found[0] if len(found) == 1 else None


def code_links(text: str) -> list[tuple[re.Match, str | None]]:
    """Each ``path.py#LN`` link in ``text`` with the backticked name it is written beside (after it, or before it
    with the link in parentheses), or None."""
    out = []
    for m in LINK.finditer(text):
        after, before = NAME_AFTER.match(text, m.end()), NAME_BEFORE.search(text, 0, m.start())
        out.append((m, after["name"] if after else before["name"] if before else None))
    return out


def links(page: Path, text: str) -> tuple[str, list[Problem]]:
    """``text`` with each code link beside a bare name moved to the line defining that name, and the links that
    moved."""
    problems, edits = [], []
    for m, name in code_links(text):
        line = int(m["line"])
        # A bare name means its definition; a call, ``name(args)``, the line that makes it (checked, not moved).
        found = name and "(" not in name and (ROOT / m["path"]).is_file() and definition(Path(m["path"]), name
                                                                                          .rsplit(".", 1)[-1])
        if found and found != line:
            problems.append(Problem(page, line_of(text, m.start()), f"{m['path']}#L{line}: `{name}` is defined at "
                                    f"line {found}"))
            shown = m["text"].replace(f":{line}", f":{found}")
            edits.append((m.start(), m.end(), f"[{shown}]({m['path']}#L{found})"))
    for start, end, new in reversed(edits):
        text = text[:start] + new + text[end:]
    return text, problems


def index() -> str:
    """docs/bench/README.md: every published run, by host, with its date and command."""
    out = ["# Published bench runs", "", *views.wrap(
        "Written by `python -m tools.publish` (`make docs`): one folder per host (CPU model, vector width, CPU "
        "count: `benchmarks/hosts.py`) and run, each with the run's `results.json` (its command and environment), "
        "`results.md` and charts, one copy per run. The pages quote them through generated blocks, each naming its "
        "run.")]
    for host in sorted((p for p in BENCH.iterdir() if p.is_dir()), key=lambda p: p.name):
        out += ["", f"## {host.name}", ""] + ([f"[lscpu.txt]({host.name}/lscpu.txt)", ""]
                                              if (host / "lscpu.txt").is_file() else [])
        for run in sorted((p for p in host.iterdir() if p.is_dir()), key=lambda p: p.name):
            doc = views.load(run.relative_to(ROOT), Path("docs/bench/README.md")).doc
            when = doc["environment"]["date"][:16].replace("T", " ") + " UTC" if "environment" in doc else "–"
            command = f"`python {' '.join(doc['command'])}`" if "command" in doc else "`python -m studies.loop_cost`"
            report = next(f for f in ("results.md", "versions.md", *views.RESULTS) if (run / f).is_file())
            out += views.wrap(f"[{run.name}]({host.name}/{run.name}/{report}), {when}: {command}", bullet=True)
        out += [f"- [{f.name}]({host.name}/{f.name})" for f in sorted(host.glob("*.md"))]
    return "\n".join(out) + "\n"


def publish(check: bool) -> list[Problem]:
    """Regenerate every page (unless ``check``); the problems found, each a stale block or link, a missing source or
    (``check``) a page whose markers do not pair up. Every page is regenerated before any is written: a page whose
    markers do not pair up (:class:`Unpaired`) or a results file that cannot be read (:class:`UserError`) leaves
    every page as it was."""
    problems, writes = [], {}
    for page in pages():
        old = (ROOT / page).read_text(encoding="utf-8")
        try:
            new, found = blocks(page, old)
        except Unpaired as err:
            if not check:
                raise
            new, found = old, [err.args[0]]
        new, moved = links(page, new)
        problems += found + moved
        if new != old:
            writes[ROOT / page] = new
    listing, written = index(), BENCH / "README.md"
    if not written.is_file() or written.read_text(encoding="utf-8") != listing:
        problems.append(Problem(written.relative_to(ROOT), 1, "stale: the index of published runs"))
        writes[written] = listing
    for path, text in writes.items() if not check else ():
        path.write_text(text, encoding="utf-8")
    return problems


@cli_main
def main(argv: list[str]) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])  # a bad flag: one line, exit 2
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 listing what is stale")
    args = parser.parse_args(argv)
    problems = publish(args.check)
    for p in problems:
        print(p, file=sys.stderr if args.check else sys.stdout)
    missing = [p for p in problems if "stale" not in p.message and "defined at" not in p.message]
    if args.check and problems:
        print(f"{len(problems)} stale or broken; run {PROG} (make docs)", file=sys.stderr)
        return 1
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Every "where to look" link ``[path.py:N](path.py#LN)`` in README.md and docs/*.md points at the line it means: the
link text agrees with its target, the line holds the backticked name written beside the link, and a bare name (a
function, a class, a table) is the line that defines it, so an edit that moves the code fails here (and
``python -m tools.publish`` moves the link) instead of misleading a reader; every link to a file or a section lands on
one that exists."""
import os
import re
from pathlib import Path

import pytest

from benchmarks.hosts import ROOT
from tools import publish

PAGES = [p for p in publish.pages() if p.name != "performance.md"]


def links() -> list[tuple[Path, str, str, int, str | None]]:
    """``(page, link text, path, line, the name the link is written beside or None)`` for each code link."""
    return [(page, m["text"], m["path"], int(m["line"]), name) for page in PAGES
            for m, name in publish.code_links((ROOT / page).read_text(encoding="utf-8"))]


def test_the_readmes_where_to_look_table_has_its_links():
    # The tables name each model's default path to the gates, the choice, steps, truncation and loop: 25 links.
    assert sum(page == Path("README.md") for page, *_ in links()) == 25


@pytest.mark.parametrize("page, text, path, line, name", links(), ids=lambda v: str(v))
def test_code_links_land_on_the_code_they_name(page, text, path, line, name):
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    assert 1 <= line <= len(lines), f"{path} has {len(lines)} lines"
    assert text in (f"{path}:{line}", f":{line}"), f"link text {text!r} disagrees with its target {path}#L{line}"
    assert lines[line - 1].strip(), f"{path}:{line} is a blank line"
    if name is None:
        return
    assert publish.identifier(name) in lines[line - 1], f"{path}:{line} does not hold {name}: {lines[line - 1]!r}"
    defined = "(" not in name and publish.definition(Path(path), publish.identifier(name))
    if defined:
        assert line == defined, f"`{name}` is defined at {path}:{defined}, not {line} (make docs moves the link)"


def test_a_moved_definition_moves_its_link():
    text = "[tools/publish.py:1](tools/publish.py#L1) `Problem` and `Block` ([:2](tools/publish.py#L2))"
    fixed, problems = publish.links(Path("README.md"), text)
    at = {name: publish.definition(Path("tools/publish.py"), name) for name in ("Problem", "Block")}
    assert fixed == (f"[tools/publish.py:{at['Problem']}](tools/publish.py#L{at['Problem']}) "
                     f"`Problem` and `Block` ([:{at['Block']}](tools/publish.py#L{at['Block']}))")
    assert len(problems) == 2


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lowercase, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", (ROOT / page).read_text(encoding="utf-8"), flags=re.DOTALL)
    return {anchor(m[1]) for m in re.finditer(r"^#+ (.*)$", text, re.MULTILINE)}


SECTION_LINK = re.compile(r"\]\((?P<path>[\w./-]*\.md)?#(?P<anchor>[\w-]+)\)")


@pytest.mark.parametrize("page", publish.pages(), ids=str)
def test_section_links_name_a_heading_of_their_page(page: Path):
    text = (ROOT / page).read_text(encoding="utf-8")
    broken = []
    for m in SECTION_LINK.finditer(text):
        target = (page.parent / m["path"]) if m["path"] else page
        target = Path(os.path.normpath(target))
        if m["anchor"] not in anchors(target):
            broken.append(f"{target}#{m['anchor']}")
    assert not broken, broken


FILE_LINK = re.compile(r"\]\((?P<path>(?!https?:)[^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", publish.pages(), ids=str)
def test_file_links_name_a_file_that_exists(page: Path):
    text = (ROOT / page).read_text(encoding="utf-8")
    broken = [m["path"] for m in FILE_LINK.finditer(text) if not (ROOT / page.parent / m["path"]).exists()]
    assert not broken, broken

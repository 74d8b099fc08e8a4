"""The README's "where to look" table points at the lines it names: each ``path#LN`` link lands on the code the
backticked name beside it spells, so an edit that moves the code fails here instead of misleading a reader."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<path>[\w./]+\.py)#L(?P<line>\d+)\)")
NAME_AFTER = re.compile(r"\s*`(?P<name>[^`]+)`")
NAME_BEFORE = re.compile(r"`(?P<name>[^`]+)`\s*\($")


def where_to_look() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Where to look", 1)[1].split("\n## ", 1)[0]
    assert LINK.search(table), "the where-to-look table has no line links"
    return table


def identifier(name: str) -> str:
    """The last dotted part of a backticked name, without its call: ``jax.lax.stop_gradient(carry)`` gives
    stop_gradient."""
    return name.split("(", 1)[0].rsplit(".", 1)[-1]


def links() -> list[tuple[str, str, int, str | None]]:
    """``(link text, path, line, the name the link is written beside or None)`` for each line link in the table."""
    table, found = where_to_look(), []
    for m in LINK.finditer(table):
        after, before = NAME_AFTER.match(table, m.end()), NAME_BEFORE.search(table, 0, m.start())
        name = after["name"] if after else before["name"] if before else None
        found.append((m["text"], m["path"], int(m["line"]), name))
    return found


@pytest.mark.parametrize("text, path, line, name", links(), ids=lambda v: str(v))
def test_where_to_look_links_land_on_the_code_they_name(text, path, line, name):
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    assert 1 <= line <= len(lines), f"{path} has {len(lines)} lines"
    assert text in (f"{path}:{line}", f":{line}"), f"link text {text!r} disagrees with its target {path}#L{line}"
    assert lines[line - 1].strip(), f"{path}:{line} is a blank line"
    if name is not None:
        assert identifier(name) in lines[line - 1], f"{path}:{line} does not hold {name}: {lines[line - 1]!r}"

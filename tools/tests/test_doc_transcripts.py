"""Every refusal a page shows is the program's own: each ``$ command`` in README.md and docs/*.md whose shown output
ends in ``error: ...`` is run here, and its last stderr line must be the page's line (numbers masked, a line ending in
``...`` compared as a prefix) with exit status 2. The commands before it in its block that show no output (a ``cp``,
a ``truncate``) run first, in a scratch folder that sees the repository's files; a command that shows other output
(a training run) is not rerun here.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NUMBER = re.compile(r"\d+(\.\d+)?")


def transcripts(page: Path) -> list[tuple[str, list[str], str]]:
    """The page's refusals: (the commands to run first, the refused command, its shown error line)."""
    found, block, inside = [], [], False
    for line in page.read_text(encoding="utf-8").splitlines() + ["```"]:
        if line.startswith("```"):
            if inside:
                found += _refusals(block)
            inside, block = not inside, []
        elif inside:
            block.append(line)
    return found


def _refusals(lines: list[str]) -> list[tuple[list[str], str, str]]:
    steps: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    found, before = [], []
    for command, output in steps:
        if output and output[-1].startswith("error:"):
            found.append((list(before), command, output[-1]))
        elif not output:
            before.append(command)
    return found


CASES = [pytest.param(before, command, shown, id=f"{page.name}:{command[:60]}")
         for page in PAGES for before, command, shown in transcripts(page)]


def masked(line: str) -> str:
    return NUMBER.sub("N", line.strip())


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A folder whose entries are links to the repository's, with ``.venv`` this interpreter's environment."""
    for entry in ROOT.iterdir():
        if entry.name not in (".venv", ".git"):
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    return tmp_path


def test_the_pages_show_refusals():
    assert len(CASES) >= 10  # the pages' transcripts were found at all


@pytest.mark.parametrize("before, command, shown", CASES)
def test_a_shown_refusal_is_what_the_program_prints(scratch: Path, before: list[str], command: str, shown: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for step in before:
        subprocess.run(step, shell=True, cwd=scratch, env=env, check=True, capture_output=True, timeout=120)
    done = subprocess.run(command, shell=True, cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    printed = (done.stderr.strip().splitlines() or [""])[-1]
    if shown.endswith("..."):
        assert masked(printed).startswith(masked(shown[:-3])), printed
    else:
        assert masked(printed) == masked(shown)
    assert done.returncode == 2, done.stderr[-2000:]

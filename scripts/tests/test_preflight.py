"""The preflight stage's command line: a bad or missing flag is one line and exit 2, before anything is written."""
from __future__ import annotations

import pytest

from scripts import preflight


@pytest.mark.parametrize("argv, why", [([], "the following arguments are required: --out"),
                                       (["--out", "{tmp}", "--bogus"], "unrecognized arguments: --bogus")])
def test_a_bad_command_line_is_one_line_and_exit_2(capsys, tmp_path, argv, why):
    out = tmp_path / "out"
    assert preflight.main([a.format(tmp=out) for a in argv]) == 2
    assert capsys.readouterr().err == f"error: scripts/preflight.py: {why}\n"
    assert not out.exists()


def test_help_exits_0_and_names_the_script(capsys):
    with pytest.raises(SystemExit) as exited:
        preflight.main(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: scripts/preflight.py [-h] --out OUT [--rehearse-on-cpu]")

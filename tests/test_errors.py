"""docs/errors.md, executed: every row of its table runs through the real command line.

The doc is the single source of the rows (command line, exit code, the line the user sees), so the
doc and nmmc cannot drift apart: a changed message, exit code or a row that no longer fails the
documented way fails here. Each row runs in a fresh copy of tests/fixtures/errors/ and must leave
that directory exactly as it found it (no output file, no temporary file).
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"
FIXTURES = ROOT / "tests" / "fixtures" / "errors"
ROW = re.compile(r"^\| `(?P<command>nmmc [^`]*)` \| (?P<what>.+?) \| `(?P<line>(?:[^`]|\\`)+)` \| (?P<exit>[0-9]) \|$")
#: Commands the table must cover.
COMMANDS = set(main.commands)


def _rows() -> list[dict[str, str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if line.startswith("|") and not line.startswith(("| command line |", "|---")):
            match = ROW.match(line)
            assert match, f"a row of docs/errors.md does not parse: {line}"
            row = match.groupdict()
            row["line"] = row["line"].replace("\\|", "|")
            rows.append(row)
    return rows


ROWS = _rows()


def _make_tampered_kernel(directory: Path) -> None:
    """tampered.py as docs/errors.md describes it: an emitted GEMM kernel with its K-block loop cut short."""
    path = directory / "tampered.py"
    result = CliRunner().invoke(main, ["emit", "--shape", "256x512x256", "--schedule", "aws-tiled", "--dialect", "nki",
                                         "--target", "trn2", "-o", str(path)])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert "for k_blk in range(2):" in text
    path.write_text(text.replace("for k_blk in range(2):", "for k_blk in range(1):"))


#: Files a row may name that are made by the test rather than kept in tests/fixtures/errors/.
GENERATED = {"tampered.py": _make_tampered_kernel}


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(directory.rglob("*"))}


def test_the_table_is_there_and_covers_every_command():
    assert len(ROWS) >= 20
    covered = {shlex.split(row["command"])[1] for row in ROWS}
    assert covered >= COMMANDS, COMMANDS - covered
    commands = [row["command"] for row in ROWS]
    assert len(set(commands)) == len(commands), "a command line appears twice"
    assert {row["exit"] for row in ROWS} <= {"1", "2"}


def test_every_fixture_is_used_and_says_what_is_wrong():
    named = {word for row in ROWS for word in shlex.split(row["command"])}
    for path in FIXTURES.iterdir():
        assert path.name in named, f"tests/fixtures/errors/{path.name} is used by no row of docs/errors.md"
        if path.suffix == ".yaml":
            assert path.read_text().startswith("# "), f"{path.name} should start with a comment saying what is wrong"


@pytest.mark.parametrize("row", ROWS, ids=[row["command"][len("nmmc "):] for row in ROWS])
def test_documented_error(tmp_path, monkeypatch, row):
    work = tmp_path / "work"
    shutil.copytree(FIXTURES, work)
    args = shlex.split(row["command"])[1:]
    for name, make in GENERATED.items():
        if name in args:
            make(work)
    monkeypatch.chdir(work)
    before = _snapshot(work)

    result = CliRunner().invoke(main, args)

    assert "Traceback" not in result.output + result.stderr
    assert result.exit_code == int(row["exit"]), (result.exit_code, result.stdout, result.stderr)
    if row["exit"] == "2":
        assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("nmmc: error: ")
        assert result.stderr.rstrip("\n") == row["line"]
        assert result.stdout == ""
    else:
        assert result.stderr == ""
        assert result.stdout.splitlines()[0] == row["line"]
    assert _snapshot(work) == before, "the command created, changed or removed a file"

"""The command line stays thin: every command function only parses its options and calls the driver
or an orchestration function, so none is longer than :data:`MAX_LINES` lines (from its ``def`` to
its last line, docstring included, decorators excluded). Longer work belongs in a function outside
the command (as :func:`neuronmm_compiler.tuning.request.run_tune` is for ``nmmc tune``), and what a command
prints in a view (:mod:`neuronmm_compiler.tuning.report`, :mod:`neuronmm_compiler.cli.views`)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator

import click
import pytest

from neuronmm_compiler.cli import main

MAX_LINES = 40


def _commands(group: click.Group, prefix: str = "nmmc") -> Iterator[tuple[str, click.Command]]:
    """Every command registered under ``group``, subgroups and their commands included."""
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, path)


def _lines_without_decorators(function) -> int:
    """Lines of ``function`` from its ``def`` to its end (decorators excluded)."""
    lines, _ = inspect.getsourcelines(function)
    node = ast.parse(textwrap.dedent("".join(lines))).body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    return node.end_lineno - node.lineno + 1


COMMANDS = list(_commands(main))


def test_every_command_is_seen():
    names = {path for path, _ in COMMANDS}
    assert {"nmmc tune", "nmmc opt", "nmmc report", "nmmc cache", "nmmc cache list", "nmmc cache clear"} <= names
    assert len(names) >= 17


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[path for path, _ in COMMANDS])
def test_command_functions_are_short(path, command):
    callback = inspect.unwrap(command.callback)
    length = _lines_without_decorators(callback)
    assert length <= MAX_LINES, (
        f"{path}: {callback.__module__}.{callback.__qualname__} is {length} lines (at most {MAX_LINES}); "
        "move orchestration into a function outside the command and printing into a view")


def test_the_measure_excludes_decorators():
    @click.command()
    @click.option("--a")
    @click.option("--b")
    def three(a, b):
        """Doc."""
        return a

    assert _lines_without_decorators(inspect.unwrap(three.callback)) == 3

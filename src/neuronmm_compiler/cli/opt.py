"""``nmmc opt``: run a pass pipeline over a graph and print the resulting IR (as mlir-opt and xdsl-opt do).

The input is the IR's text form (see :mod:`neuronmm_compiler.ir.text`; ``#`` starts a comment) or a
graph file (YAML or JSON, see docs/graph-format.md) with its ``--dim`` bindings. The graph is
verified, the pipeline runs through :func:`~neuronmm_compiler.passes.run_pipeline`, and the result
is printed as IR text. docs/opt.md is the user's guide.

Every user error is an :class:`~neuronmm_compiler.errors.NmmcError` of one line, which the CLI group
prints as ``nmmc: error: ...`` with exit code 2. Parser and verifier messages carry the IR text
around the fault on further lines; only their first line is kept here, prefixed with the source.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import InputError, IRError
from ..io import write_output
from ..ir import Graph, parse_text, to_text, verify
from ..passes import Pass, parse_pipeline, registered_passes, run_pipeline

__all__ = ["GRAPH_FILE_SUFFIXES", "opt", "pass_help_rows", "read_graph"]

#: File suffixes read as graph files; anything else must be IR text.
GRAPH_FILE_SUFFIXES = (".yaml", ".yml", ".json")
#: IR text: blank lines and ``#`` comments, then ``graph NAME``.
_IR_START = re.compile(r"\A(?:\s|#[^\n]*)*graph\s")
STDIN_LABEL = "<stdin>"


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _one_line(source: str, err: IRError) -> IRError:
    """``err`` (a ParseError or IRError, whose message may add the IR around the fault on further
    lines) as the same kind of error of one line, naming ``source``."""
    return type(err)(f"{source}: {_first_line(err)}")


def _read_text(path: str) -> str:
    if path == "-":
        stream = getattr(sys.stdin, "buffer", None)  # bytes, so that bad UTF-8 is an error, not surrogates
        try:
            return stream.read().decode("utf-8") if stream is not None else sys.stdin.read()
        except UnicodeDecodeError:
            raise InputError(f"{STDIN_LABEL}: not UTF-8 text") from None
    file = Path(path)
    label = _label(path)
    if not file.is_file():
        raise InputError(f"{label} {'does not exist' if not file.exists() else 'is not a regular file'}")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{label}: not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"cannot read {label}: {exc.strerror or exc}") from None


def _label(path: str) -> str:
    from ..frontends.untrusted import source_label

    return STDIN_LABEL if path == "-" else source_label(path)


def _graph_from_file(path: str, dims: tuple[str, ...]) -> Graph:
    from ..frontends.graph_file import load_graph_spec, parse_dim_bindings

    spec = load_graph_spec(path)
    return spec.graph(parse_dim_bindings(dims))


def _graph_from_stdin_document(text: str, dims: tuple[str, ...]) -> Graph:
    from ..frontends.graph_file import parse_dim_bindings, spec_from_document
    from ..frontends.untrusted import MAX_FILE_BYTES, parse_document

    if len(text.encode("utf-8")) > MAX_FILE_BYTES:
        raise InputError(f"{STDIN_LABEL}: graph files are at most {MAX_FILE_BYTES // 1024} KiB; this one is larger")
    doc = parse_document(text, STDIN_LABEL, is_json=text.lstrip().startswith("{"))
    return spec_from_document(doc, STDIN_LABEL).graph(parse_dim_bindings(dims))


def read_graph(path: str, dims: tuple[str, ...] = ()) -> Graph:
    """The graph in ``path`` (``-``: standard input), verified.

    A ``.yaml``, ``.yml`` or ``.json`` path is a graph file, read and bound (``dims``: ``NAME=N``
    strings) exactly as ``--graph``/``--dim`` are; any other path must hold IR text. Standard input
    is IR text when its first token (after blank lines and ``#`` comments) is ``graph``, else a graph
    file (JSON when it starts with ``{``, else YAML). InputError, ParseError or IRError (one line,
    naming the source) when it cannot be read, parsed or verified.
    """
    label = _label(path)
    if path != "-" and Path(path).suffix.lower() in GRAPH_FILE_SUFFIXES:
        graph = _graph_from_file(path, dims)
    else:
        text = _read_text(path)
        if path == "-" and not _IR_START.match(text):
            graph = _graph_from_stdin_document(text, dims)
        else:
            if not _IR_START.match(text):
                raise InputError(
                    f"{label}: not IR text (its first statement must be 'graph NAME {{') nor a graph file "
                    f"({', '.join(GRAPH_FILE_SUFFIXES)})"
                )
            if dims:
                raise InputError(f"--dim binds dimensions of a graph file ({', '.join(GRAPH_FILE_SUFFIXES)}); "
                                 f"{label} is IR text, whose shapes are fixed")
            try:
                graph = parse_text(text)
            except IRError as err:
                raise _one_line(label, err) from None
    try:
        verify(graph)
    except IRError as err:
        raise _one_line(label, err) from None
    return graph


def _type_name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def _describe_options(cls: type[Pass]) -> str:
    options = cls.options()
    if not options:
        return "No options."
    described = []
    for name, (kind, default) in options.items():
        shown = "required" if default is dataclasses.MISSING else f"default {_show_default(default)}"
        described.append(f"{name} ({_type_name(kind)}, {shown})")
    return f"Options: {', '.join(described)}."


def _show_default(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def pass_help_rows() -> list[tuple[str, str]]:
    """(name, summary and options) of every registered pass, as ``nmmc opt --help`` lists them."""
    rows = []
    for name, cls in registered_passes().items():
        summary = cls.summary() or "(no description: the pass class has no docstring)"
        rows.append((name, f"{summary} {_describe_options(cls)}"))
    return rows


class _OptCommand(click.Command):
    """Lists the registered passes after the options, read from the registry when help is shown."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Passes (options in braces: name{key=value,...})"):
            formatter.write_dl(pass_help_rows())
        super().format_epilog(ctx, formatter)


def _dump(graph: Graph) -> str:
    # Without --verify-each a pass may leave a graph too broken to print; say so rather than fail.
    try:
        return to_text(graph)
    except (IRError, KeyError, TypeError, ValueError) as err:
        return f"# <IR not printable: {type(err).__name__}: {_first_line(err)}>\n"


@click.command(cls=_OptCommand, epilog="Example: nmmc opt -p 'canonicalize,fold-transposes' graph.ir")
@click.argument("file", metavar="FILE")
@click.option("-p", "--pipeline", "spec", default="", metavar="SPEC",
              help="Passes to run, comma separated, each with options in braces, e.g. "
                   "'canonicalize,fold-transposes,fuse{mlp=split}'. Empty (the default): only parse, verify "
                   "and print.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N",
              help="Graph files: bind a named dimension (e.g. --dim tokens=64); repeatable.")
@click.option("-o", "--output", default="-", metavar="FILE",
              help="Write the IR to FILE (atomically, only on success) instead of stdout.")
@click.option("--print-after-all", is_flag=True,
              help="Print the IR after every pass to stderr, each preceded by a line "
                   "'# after PASS (changed|unchanged)'.")
@click.option("--verify-each/--no-verify-each", default=True, show_default=True,
              help="Verify the IR after every pass (a failure names the pass), or only at the end.")
def opt(file: str, spec: str, dims: tuple[str, ...], output: str, print_after_all: bool, verify_each: bool) -> None:
    """Run a pass pipeline over FILE and print the resulting IR.

    FILE ('-' for stdin) is IR text (a '.ir' file, or any text whose first statement is 'graph NAME
    {'; '#' starts a comment) or a graph file ('.yaml', '.yml', '.json'; see docs/graph-format.md)
    with --dim bindings. The graph is verified before the first pass. See docs/opt.md.
    """
    passes = parse_pipeline(spec)  # before reading FILE: a typo in the spec fails fast
    graph = read_graph(file, dims)

    def on_step(pass_spec: str, changed: bool, after: Graph) -> None:
        state = "changed" if changed else "unchanged"
        click.echo(f"# after {pass_spec} ({state})\n{_dump(after)}", err=True, nl=False)

    try:
        result = run_pipeline(graph, passes, verify_each=verify_each,
                              on_step=on_step if print_after_all else None)
    except IRError as err:
        raise _one_line(_label(file), err) from None
    text = to_text(result.graph)
    if output == "-":
        click.echo(text, nl=False)
    else:
        write_output(output, text)

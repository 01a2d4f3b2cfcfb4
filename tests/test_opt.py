"""``nmmc opt``: the pass test cases of tests/opt (golden files), help, errors and options.

Each tests/opt/NAME.ir runs its ``# RUN: nmmc opt ...`` line through the real command line and must
print exactly tests/opt/NAME.expected.ir (regenerate with ``python scripts/update_opt_golden.py
--update``, then read the diff).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.cli.opt import pass_help_rows
from neuronmm_compiler.ir import Graph, parse_text, to_text
from neuronmm_compiler.passes import Pass, base, registered_passes
from opt.cases import CASE_DIR, EXPECTED_SUFFIX, case_files, expected_path, run_args, run_case

ROOT = Path(__file__).resolve().parents[1]
CASES = case_files()
FULL_PIPELINE = "canonicalize,fold-transposes,canonicalize,implicit-transpose,fuse{mlp=whole},place"


def invoke(args: list[str], **kwargs) -> object:
    return CliRunner().invoke(main, args, catch_exceptions=False, **kwargs)


def squash(text: str) -> str:
    """``text`` with every run of whitespace one space (help text is wrapped to the terminal)."""
    return " ".join(text.split())


# ----------------------------------------------------------------------------- the golden cases


def test_the_cases_are_there_and_each_has_its_expected_output():
    assert len(CASES) >= 12
    expected = {path.name for path in CASE_DIR.glob(f"*{EXPECTED_SUFFIX}")}
    assert expected == {expected_path(case).name for case in CASES}, "run scripts/update_opt_golden.py --update"
    specs = " ".join(" ".join(run_args(case)) for case in CASES)
    for needed in ("canonicalize", "fold-transposes", "implicit-transpose", "fuse{mlp=whole}", "fuse{mlp=split}",
                   "place", FULL_PIPELINE, "--dim tokens=64", "lora.yaml"):
        assert needed in specs, needed


@pytest.mark.parametrize("case", CASES, ids=[case.stem for case in CASES])
def test_case(case):
    result = run_case(case)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    expected = expected_path(case).read_text()
    assert result.stdout == expected, f"{case.name}: output changed (nmmc {' '.join(run_args(case))})"
    assert to_text(parse_text(expected)) == expected  # the expected file is canonical IR text


def test_transposes_really_fold():
    """The folding cases end without the transposes their comments say go away."""
    for name in ("fold_transposes_inputs", "pipeline_chain", "pipeline_lora", "pipeline_svd_mlp_whole"):
        graph = parse_text((CASE_DIR / f"{name}{EXPECTED_SUFFIX}").read_text())
        assert not [node.id for node in graph.nodes() if node.kind == "transpose"], name
    chain = parse_text((CASE_DIR / f"pipeline_chain{EXPECTED_SUFFIX}").read_text())
    assert chain.node("x_t").layout == "transposed" and chain.node("y").layout == "transposed"


# ----------------------------------------------------------------------------- help


def test_help_lists_every_pass_with_its_summary_and_options():
    result = invoke(["opt", "--help"])
    assert result.exit_code == 0
    text = squash(result.stdout)
    assert "-p, --pipeline SPEC" in text and "--print-after-all" in text and "--no-verify-each" in text
    assert registered_passes(), "no passes registered"
    for name, cls in registered_passes().items():
        assert re.search(rf"(^|\s){re.escape(name)}\s", result.stdout), name
        summary = cls.summary()
        assert summary and not summary.startswith(f"{cls.__name__}("), f"pass {name} has no docstring"
        assert "\n" not in summary
        assert squash(summary) in text, name
        for option, (kind, default) in cls.options().items():
            shown = str(default).lower() if isinstance(default, bool) else str(default)
            assert f"{option} ({kind.__name__}, default {shown})" in text, (name, option)
    assert "Options: max_iterations (int, default 100)." in text
    assert "Options: mlp (str, default whole)." in text
    assert [name for name, _ in pass_help_rows()] == list(registered_passes())


def test_summary_is_the_first_sentence_of_the_docstring_or_empty():
    @dataclass(frozen=True)
    class Wrapped(Pass):
        """Do a thing to every node, in a sentence that wraps
        over two lines. Then more detail.

        And a second paragraph."""

        name: ClassVar[str] = "wrapped"

        def apply(self, graph: Graph) -> bool:
            return False

    @dataclass(frozen=True)
    class Undocumented(Pass):
        name: ClassVar[str] = "undocumented"
        depth: int = 3

        def apply(self, graph: Graph) -> bool:
            return False

    assert Wrapped.summary() == "Do a thing to every node, in a sentence that wraps over two lines."
    assert Undocumented.summary() == ""
    assert Undocumented.options() == {"depth": (int, 3)}


# ----------------------------------------------------------------------------- errors

BAD_IR = 'graph g {\n  %x = input "x" [4, 8] bf16\n  %y = matmul %x, %x : [4, 8] bf16\n  %o = output "o" %y\n}\n'
NO_OUTPUT = 'graph g {\n  %x = input "x" [4, 8] bf16\n  %s = elementwise silu %x : [4, 8] bf16\n}\n'
CHAIN = CASE_DIR / "implicit_transpose_svd_chain.ir"


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["-p", "canonicalise", str(CHAIN)], None, "unknown pass 'canonicalise'; known passes: canonicalize,"),
        (["-p", "fuse{mlp=split", str(CHAIN)], None, "malformed pipeline item 'fuse{mlp=split'"),
        (["-p", "canonicalize,,fuse", str(CHAIN)], None, "malformed pipeline item ''"),
        (["-p", "fuse{mlp=half}", str(CHAIN)], None, "fuse: unknown mlp mode 'half'"),
        (["-p", "canonicalize{max_iterations=many}", str(CHAIN)], None, "option max_iterations='many' is not"),
        (["-p", "place", str(CHAIN)], None, "place needs a kernel annotation on every compute node"),
        (["-"], BAD_IR, "<stdin>: line 3, column 8: matmul %y: contraction sizes differ"),
        (["-"], NO_OUTPUT, "<stdin>: invalid IR in graph g: the graph has no outputs"),
        (["-"], "graph g {\n  %x = input \"x\" [4, 8] bf16\n", "<stdin>: line 3, column 1: expected"),
        (["-"], "hello: [1, 2\n", "<stdin>: invalid YAML"),
        (["--dim", "tokens=4", str(CHAIN)], None, "--dim binds dimensions of a graph file"),
        (["--dim", "tokens=4", "-"], CHAIN.read_text(), "--dim binds dimensions of a graph file"),
        (["does_not_exist.ir"], None, "does_not_exist.ir does not exist"),
        (["does_not_exist.yaml"], None, "graph file does_not_exist.yaml does not exist"),
        ([str(ROOT / "examples" / "graphs" / "lora.yaml"), "--dim", "tokens=zero"], None,
         "--dim tokens: 'zero' is not a positive decimal integer"),
        ([str(ROOT / "README.md")], None, "README.md: not IR text"),
        (["-"], b"graph g {\xff", "<stdin>: not UTF-8 text"),
    ],
    ids=["unknown-pass", "unclosed-brace", "empty-item", "bad-mode", "bad-int", "place-before-fuse", "parse-error",
         "no-output", "truncated", "bad-yaml-stdin", "dim-with-ir", "dim-with-ir-stdin", "missing-ir",
         "missing-yaml", "bad-dim", "not-ir", "not-utf8"],
)
def test_errors_are_one_line_and_exit_2(tmp_path, monkeypatch, args, stdin, message):
    monkeypatch.chdir(tmp_path)
    result = invoke(["opt", *args], input=stdin)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("nmmc: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@dataclass(frozen=True)
class BreakShapes(Pass):
    """Test-only pass that records a wrong shape on every matmul."""

    name: ClassVar[str] = "break-shapes"

    def apply(self, graph: Graph) -> bool:
        for node in graph.nodes():
            if node.kind == "matmul":
                graph.nx_graph.nodes[node.id]["shape"] = (1, 1)
        return True


def test_verify_each_names_the_pass_that_broke_the_ir(monkeypatch):
    monkeypatch.setitem(base._REGISTRY, BreakShapes.name, BreakShapes)
    spec = "canonicalize,break-shapes,canonicalize"
    each = invoke(["opt", "-p", spec, str(CHAIN)])
    assert each.exit_code == 2 and each.stderr.count("\n") == 1
    assert "pass 'break-shapes' produced invalid IR: invalid IR in graph svd_chain: %xu: matmul is recorded as" \
        in each.stderr
    at_end = invoke(["opt", "-p", spec, "--no-verify-each", "--print-after-all", str(CHAIN)])
    assert at_end.exit_code == 2 and at_end.stdout == ""
    dumps, error = at_end.stderr.rsplit("# after canonicalize (unchanged)\n", 1)[1].split("}\n")
    assert "%xu = matmul %x, %u : [1, 1] bfloat16" in dumps
    assert error.startswith("nmmc: error: ") and error.count("\n") == 1
    assert "the pipeline canonicalize, break-shapes, canonicalize produced invalid IR" in error


# ----------------------------------------------------------------------------- options and input


def test_print_after_all_prints_each_pass_to_stderr():
    case = CASE_DIR / "pipeline_chain.ir"
    result = invoke(["opt", "-p", FULL_PIPELINE, "--print-after-all", str(case)])
    assert result.exit_code == 0
    assert result.stdout == expected_path(case).read_text()
    headers = re.findall(r"^# after .*$", result.stderr, flags=re.MULTILINE)
    assert headers == [
        "# after canonicalize (unchanged)",
        "# after fold-transposes (changed)",
        "# after canonicalize (changed)",
        "# after implicit-transpose (changed)",
        "# after fuse (changed)",
        "# after place (changed)",
    ]
    dumps = [parse_text(chunk) for chunk in re.split(r"^# after .*\n", result.stderr, flags=re.MULTILINE)[1:]]
    assert len(dumps) == 6
    kinds = [[node.kind for node in dump.nodes()] for dump in dumps]
    assert kinds[1].count("transpose") == 1  # fold-transposes left the output transpose dead
    assert kinds[2].count("transpose") == 0  # and the second canonicalize removed it
    assert to_text(dumps[-1]) == result.stdout


def test_stdin_ir_and_graph_file():
    case = CASE_DIR / "pipeline_lora.ir"
    from_stdin = invoke(["opt", "-p", FULL_PIPELINE, "-"], input=case.read_text())
    assert from_stdin.exit_code == 0, from_stdin.stderr
    assert from_stdin.stdout == expected_path(case).read_text()
    yaml_text = (ROOT / "examples" / "graphs" / "lora.yaml").read_text()
    graph_file = invoke(["opt", "-p", FULL_PIPELINE, "--dim", "tokens=64", "-"], input=yaml_text)
    assert graph_file.exit_code == 0, graph_file.stderr
    assert graph_file.stdout == (CASE_DIR / f"graph_file_lora{EXPECTED_SUFFIX}").read_text()


def test_output_file_and_empty_pipeline(tmp_path):
    case = CASE_DIR / "fuse_mlp_split.ir"
    out = tmp_path / "out.ir"
    result = invoke(["opt", "--pipeline", "fuse{mlp=split}", "-o", str(out), str(case)])
    assert result.exit_code == 0 and result.stdout == "" and result.stderr == ""
    assert out.read_text() == expected_path(case).read_text()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.ir"]  # no temporary file left
    again = invoke(["opt", str(out)])  # no pipeline: parse, verify, print; the text is canonical
    assert again.exit_code == 0 and again.stdout == out.read_text()

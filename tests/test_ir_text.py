"""The text form: golden output, exact round trips (including random graphs), the table, parse errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronmm_compiler.errors import IRError, ParseError
from neuronmm_compiler.frontends.shapes import gemm_graph
from neuronmm_compiler.ir import LAYOUTS, ORIENTS, PLACES, Graph, parse_text, to_table, to_text, verify

GEMM_TEXT = """\
graph gemm {
  %a = input "a" [1024, 512] bfloat16 layout=row_major
  %b = input "b" [512, 2048] bfloat16 layout=row_major
  %mm0 = matmul %a, %b : [1024, 2048] bfloat16
  %c = output "c" %mm0
}
"""

MLP_TEXT = """\
graph mlp {
  %x = input "x" [4, 8] float32 layout=transposed
  %g = input "g" [8, 16] float32 layout=row_major
  %u = input "u" [8, 16] float32 layout=row_major
  %mm0 = matmul %x, %g : [4, 16] float32
  %silu0 = elementwise silu %mm0 : [4, 16] float32
  %mm1 = matmul %x, %u : [4, 16] float32
  %mul0 = elementwise multiply %silu0, %mm1 : [4, 16] float32
  %sum = elementwise add %mul0, %mul0 : [4, 16] float32
  %t0 = transpose %sum : [16, 4] float32
  %y = output "y" %t0
  %y_again = output "also_y" %mul0
}
"""


ANNOTATED = """\
graph fused {
  %x = input "x" [128, 2048] bfloat16 layout=row_major
  %ug = input "ug" [2048, 1280] bfloat16 layout=row_major
  %vg = input "vg" [1280, 256] bfloat16 layout=row_major
  %mm0 = matmul %x, %ug : [128, 1280] bfloat16 {kernel=k0, orient=transposed, place=sbuf}
  %v3 = matmul %mm0, %vg : [128, 256] bfloat16 {kernel=k0, orient=transposed, place=hbm}
  %s = elementwise silu %v3 : [128, 256] bfloat16 {kernel=k0}
  %h_t = output "h_t" %v3 layout=transposed
  %s_out = output "s_out" %s
}
"""


@st.composite
def random_graphs(draw: st.DrawFn, annotated: bool = True, max_ops: int = 7, chains: bool = False) -> Graph:
    """Small valid graphs over every node kind, both layouts (inputs and outputs), shared and
    repeated operands, and (with ``annotated``) random annotations on compute nodes: any subset of
    orient/place, and kernel on all compute nodes or on none (as the verifier demands).

    ``chains=True`` favours deep graphs: the first operand of each op is one of the last three
    values and the last value is always an output (so little is dead), as in MLP-like chains."""
    dtype = draw(st.sampled_from(["bfloat16", "float32"]))
    dims = st.sampled_from([1, 2, 3, 5])
    graph = Graph(draw(st.sampled_from(["g", "gemm", "mlp_2"])))
    values: list[str] = []

    def new_input(shape: tuple[int, int]) -> str:
        layout = draw(st.sampled_from(LAYOUTS))
        return graph.add_input(f"in{len(graph.inputs())}", shape, dtype, layout)

    for _ in range(draw(st.integers(1, 3))):
        values.append(new_input((draw(dims), draw(dims))))
    for _ in range(draw(st.integers(0, max_ops))):
        kind = draw(st.sampled_from(["matmul", "transpose", "silu", "multiply", "add"]))
        x = draw(st.sampled_from(values[-3:] if chains else values))
        rows, cols = graph.node(x).shape
        if kind == "transpose":
            values.append(graph.add_transpose(x))
        elif kind == "silu":
            values.append(graph.add_elementwise("silu", x))
        elif kind == "matmul":
            fitting = [v for v in values if graph.node(v).shape[0] == cols]
            rhs = draw(st.sampled_from(fitting)) if fitting else new_input((cols, draw(dims)))
            values.append(graph.add_matmul(x, rhs))
        else:
            y = draw(st.sampled_from([v for v in values if graph.node(v).shape == (rows, cols)]))
            values.append(graph.add_elementwise(kind, x, y))
    for index in range(draw(st.integers(1, 2))):
        value = values[-1] if chains and index == 0 else draw(st.sampled_from(values))
        graph.add_output(f"out{index}", value, layout=draw(st.sampled_from(LAYOUTS)))
    if annotated:
        with_kernels = draw(st.booleans())
        for node in graph.compute_nodes():
            values_drawn = {
                "orient": draw(st.sampled_from((None, *ORIENTS))),
                "place": draw(st.sampled_from((None, *PLACES))),
                "kernel": draw(st.sampled_from(["k0", "k1", "fused_2"])) if with_kernels else None,
            }
            graph.annotate(node.id, **{key: value for key, value in values_drawn.items() if value})
    return graph


def test_gemm_golden_text():
    assert to_text(gemm_graph(1024, 2048, 512)) == GEMM_TEXT


@pytest.mark.parametrize("text", [GEMM_TEXT, MLP_TEXT])
def test_text_round_trips_exactly(text):
    graph = parse_text(text)
    verify(graph)
    assert to_text(graph) == text
    assert parse_text(to_text(graph)) == graph


def test_parsed_graph_has_expected_structure():
    graph = parse_text(MLP_TEXT)
    assert graph.name == "mlp"
    assert graph.node("x").storage_shape == (8, 4)
    assert graph.node("sum").operands == ("mul0", "mul0")
    assert graph.node("y_again").name == "also_y"
    assert [node.name for node in graph.outputs()] == ["y", "also_y"]


@settings(max_examples=150, deadline=None)
@given(random_graphs())
def test_round_trip_property(graph):
    verify(graph)
    text = to_text(graph)
    parsed = parse_text(text)
    assert parsed == graph
    assert to_text(parsed) == text
    assert parsed.signature() == graph.signature()
    assert graph.copy() == graph


def test_parser_accepts_comments_aliases_and_free_layout():
    loose = """
    # a hand-written graph
    graph gemm{%a=input "a" [1024,512] bf16   # layout defaults to row_major
      %b = input "b" [512,
                      2048] BF16 layout = row_major
      %mm0 = matmul %a , %b : [1024, 2048] bfloat16
      %c = output "c" %mm0 }"""
    graph = parse_text(loose)
    assert graph == parse_text(GEMM_TEXT)
    assert to_text(graph) == GEMM_TEXT


def test_table_form():
    table = to_table(parse_text(MLP_TEXT))
    lines = table.splitlines()
    assert lines[0].split() == ["id", "kind", "operands", "shape", "dtype", "attrs", "annotations"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].split() == ["%x", "input", "[4,", "8]", "float32", "layout=transposed", "name=x"]
    assert lines[5].split() == ["%mm0", "matmul", "%x,", "%g", "[4,", "16]", "float32"]
    assert "op=multiply" in lines[8] and lines[8].startswith("%mul0 ")
    assert len(lines) == 2 + 11


def _line(body: str) -> str:
    return f'graph g {{\n  %a = input "a" [4, 8] bfloat16\n{body}\n}}\n'


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("gaph g {\n}", 1, "expected 'graph' to start the graph, found 'gaph'"),
        ("graph {\n}", 1, "expected the graph's name after 'graph', found '{'"),
        ("graph class {\n}", 1, "graph name must be a Python identifier"),
        ("graph g\n  %a = x", 2, "expected '{' after the graph's name, found '%a'"),
        ('graph g {\n  %a = input "a" [4, 8] bfloat16\n', 3, "expected a statement"),
        ("graph g {\n}\n}", 3, "expected end of input after the closing '}', found '}'"),
        ("graph g {\n  %a @ input\n}", 2, "unexpected character '@'"),
        (_line("  %b = conv %a : [4, 8] bfloat16"), 3, "expected an op (input, matmul"),
        (_line("  %b = transpose %z : [8, 4] bfloat16"), 3, "%z is not defined"),
        (_line("  %a = transpose %a : [8, 4] bfloat16"), 3, "%a is defined twice (first on line 2)"),
        (
            _line("  %b = transpose %a : [4, 8] bfloat16"),
            3,
            "%b is annotated [4, 8] bfloat16 but its operands give [8, 4]",
        ),
        (
            _line("  %b = transpose %a : [8, 4] float32"),
            3,
            "annotated [8, 4] float32 but its operands give [8, 4] bfloat16",
        ),
        (
            _line("  %b = transpose %a : [8, 4] fp16"),
            3,
            "expected a dtype of transpose %b: unknown dtype 'fp16'",
        ),
        (
            _line("  %b = transpose %a [8, 4] bfloat16"),
            3,
            "expected ':' before the result type of transpose %b, found '['",
        ),
        (
            _line("  %b = transpose %a : [8 4] bfloat16"),
            3,
            "expected ',' or ']' in the shape of transpose %b, found '4'",
        ),
        (
            _line("  %b = transpose %a, %a : [8, 4] bfloat16"),
            3,
            "expected 1 operand(s) for transpose, found 2",
        ),
        (_line("  %b = matmul %a : [4, 4] bfloat16"), 3, "expected 2 operand(s) for matmul, found 1"),
        (_line("  %b = matmul %a, %a : [4, 4] bfloat16"), 3, "contraction sizes differ"),
        (
            _line("  %b = elementwise gelu %a : [4, 8] bfloat16"),
            3,
            "expected an elementwise op (silu, multiply, add, quantize, dequantize, row_scale, quantize_mx), found "
            "'gelu'",
        ),
        (
            _line('  %b = input "b" [4, 0] bfloat16'),
            3,
            "expected a positive dimension in the shape of input %b, found 0",
        ),
        (_line('  %b = input "b" [4, -2] bfloat16'), 3, "expected a positive dimension"),
        (
            _line("  %b = input b [4, 2] bfloat16"),
            3,
            "expected a quoted name (\"...\") of input %b, found 'b'",
        ),
        (_line('  %b = input "b" [4, 2] bfloat16 layout=diagonal'), 3, "unknown layout 'diagonal'"),
        (_line('  %b = input "b" [4, 2, 2] bfloat16 layout=transposed'), 3, "needs a 2-D shape"),
        (_line('  %b = input "a" [4, 2] bfloat16'), 3, "input name 'a' is already used"),
        (_line('  %b = input "def" [4, 2] bfloat16'), 3, "must be a Python identifier"),
        (
            _line('  %c = output "c" %a\n  %d = transpose %c : [8, 4] bfloat16'),
            4,
            "uses output %c as an operand",
        ),
        (_line("  %c = output %a"), 3, "expected a quoted name"),
    ],
)
def test_parse_errors_say_line_and_what_was_expected(text, line, expected):
    with pytest.raises(ParseError) as caught:
        parse_text(text)
    message = str(caught.value)
    assert message.startswith(f"line {line}, column ")
    assert expected in message
    assert "^" in message.splitlines()[-1]  # the caret under the offending token


def test_parse_error_is_an_irerror():
    with pytest.raises(IRError):
        parse_text("")


# ----------------------------------------------------------------------------- annotations and transposed outputs


def test_annotated_text_round_trips_exactly():
    graph = parse_text(ANNOTATED)
    verify(graph)
    assert to_text(graph) == ANNOTATED
    assert parse_text(to_text(graph)) == graph
    assert graph.annotations("mm0") == {"kernel": "k0", "orient": "transposed", "place": "sbuf"}
    assert graph.annotations("s") == {"kernel": "k0"}
    assert graph.node("h_t").layout == "transposed" and graph.node("h_t").storage_shape == (256, 128)
    assert graph.node("s_out").layout == "row_major"


def test_annotations_print_sorted_and_only_when_present():
    graph = gemm_graph(4, 3, 8, dtype="fp32")
    assert "{" not in to_text(graph).split("\n", 1)[1]
    graph.annotate("mm0", place="hbm", orient="normal", kernel="k0")
    assert "  %mm0 = matmul %a, %b : [4, 3] float32 {kernel=k0, orient=normal, place=hbm}\n" in to_text(graph)
    assert '  %c = output "c" %mm0\n' in to_text(graph)


def test_parser_accepts_any_key_order_and_explicit_row_major_output():
    loose = ANNOTATED.replace(
        "{kernel=k0, orient=transposed, place=sbuf}", "{ place = sbuf,orient=transposed ,kernel=k0 }"
    )
    loose = loose.replace('%s_out = output "s_out" %s', '%s_out = output "s_out" %s layout=row_major')
    assert loose != ANNOTATED
    assert to_text(parse_text(loose)) == ANNOTATED


def test_table_shows_annotations():
    lines = to_table(parse_text(ANNOTATED)).splitlines()
    row = next(line for line in lines if line.startswith("%mm0 "))
    assert row.split()[-3:] == ["kernel=k0", "orient=transposed", "place=sbuf"]
    output_row = next(line for line in lines if line.startswith("%h_t "))
    assert "layout=transposed" in output_row


def _annotated(body: str) -> str:
    return f'graph g {{\n  %a = input "a" [4, 4] bfloat16\n{body}\n}}\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_annotated("  %b = transpose %a : [4, 4] bfloat16 {colour=red}"), "expected an annotation key (kernel"),
        (_annotated("  %b = transpose %a : [4, 4] bfloat16 {orient=sideways}"), "orient='sideways' is not valid"),
        (_annotated("  %b = transpose %a : [4, 4] bfloat16 {place=hbm, place=sbuf}"), "'place' is given twice"),
        (_annotated("  %b = transpose %a : [4, 4] bfloat16 {kernel=0}"), "expected a value (an identifier)"),
        (_annotated("  %b = transpose %a : [4, 4] bfloat16 {kernel k0}"), "expected '=' after the annotation key"),
        (_annotated("  %b = transpose %a : [4, 4] bfloat16 {kernel=k0 place=hbm}"), "or '}' in the annotations"),
        (_annotated("  %b = transpose %a : [4, 4] bfloat16 {}"), "expected an annotation key"),
        (_annotated('  %b = input "b" [4, 4] bfloat16 {kernel=k0}'), "input %b cannot carry annotations"),
        (_annotated('  %o = output "o" %a {kernel=k0}'), "output %o cannot carry annotations"),
        (_annotated('  %o = output "o" %a layout=diagonal'), "unknown layout 'diagonal'"),
        (_annotated('  %o = output "o" %a layout=5'), "expected a layout (row_major, transposed)"),
    ],
)
def test_annotation_parse_errors(text, expected):
    with pytest.raises(ParseError) as caught:
        parse_text(text)
    message = str(caught.value)
    assert message.startswith("line 3, column ")
    assert expected in message


def test_transposed_output_of_one_d_value_is_a_parse_error():
    text = 'graph g {\n  %a = input "a" [4] bfloat16\n  %o = output "o" %a layout=transposed\n}\n'
    with pytest.raises(ParseError, match="needs a 2-D shape"):
        parse_text(text)

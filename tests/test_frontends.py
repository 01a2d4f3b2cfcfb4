"""``--shape MxNxK`` parsing and the GEMM frontend."""

from __future__ import annotations

import pytest

from neuronmm_compiler.errors import InputError
from neuronmm_compiler.ir import gemm_graph, parse_shape, parse_text, to_text, verify
from neuronmm_compiler.passes import DEFAULT_PIPELINE, run_pipeline


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024x2048x512", (1024, 2048, 512)),
        ("1X2X3", (1, 2, 3)),
        ("128x128X64", (128, 128, 64)),
        (" 4 x 5 x 6 ", (4, 5, 6)),
        ("007x1x1", (7, 1, 1)),
    ],
)
def test_parse_shape_accepts(text, expected):
    assert parse_shape(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1024x2048",
        "1x2x3x4",
        "0x2x3",
        "1x0x3",
        "1x2x0",
        "-1x2x3",
        "1x-2x3",
        "axbxc",
        "1.5x2x3",
        "1*2*3",
        "x1x2",
    ],
)
def test_parse_shape_rejects_with_help(text):
    with pytest.raises(InputError) as caught:
        parse_shape(text)
    message = str(caught.value)
    assert message.startswith("expected MxNxK with positive integers, e.g. 1024x2048x512; got ")
    assert repr(text) in message


def test_parse_shape_rejects_non_strings():
    with pytest.raises(InputError, match="expected MxNxK"):
        parse_shape(None)  # type: ignore[arg-type]


def test_gemm_graph_mk():
    assert to_text(gemm_graph(8, 16, 4, dtype="fp32")) == (
        "graph gemm {\n"
        '  %a = input "a" [8, 4] float32 layout=row_major\n'
        '  %b = input "b" [4, 16] float32 layout=row_major\n'
        "  %mm0 = matmul %a, %b : [8, 16] float32\n"
        '  %c = output "c" %mm0\n'
        "}\n"
    )


KM_LITERAL = """\
graph gemm {
  %a_t = input "a_t" [4, 8] bfloat16 layout=row_major
  %b = input "b" [4, 16] bfloat16 layout=row_major
  %t0 = transpose %a_t : [8, 4] bfloat16
  %mm0 = matmul %t0, %b : [8, 16] bfloat16
  %c = output "c" %mm0
}
"""

KM_FOLDED = """\
graph gemm {
  %a_t = input "a_t" [8, 4] bfloat16 layout=transposed
  %b = input "b" [4, 16] bfloat16 layout=row_major
  %mm0 = matmul %a_t, %b : [8, 16] bfloat16
  %c = output "c" %mm0
}
"""


def test_gemm_graph_km_is_the_literal_graph_and_folds():
    graph = gemm_graph(8, 16, 4, a_layout="km")
    verify(graph)
    assert graph == parse_text(KM_LITERAL)
    assert to_text(graph) == KM_LITERAL
    folded = run_pipeline(graph, DEFAULT_PIPELINE).graph
    assert folded == parse_text(KM_FOLDED)
    assert to_text(folded) == KM_FOLDED
    assert folded.node("a_t").storage_shape == graph.node("a_t").shape


def test_gemm_graph_rejects_unknown_layout_and_bad_dims():
    with pytest.raises(InputError, match=r"unknown A layout 'nk'; accepted: mk, km"):
        gemm_graph(2, 2, 2, a_layout="nk")
    for dims in ((0, 2, 2), (2, -1, 2), (2, 2, 1.5), (True, 2, 2)):
        with pytest.raises(InputError, match="must be a positive integer"):
            gemm_graph(*dims)
    with pytest.raises(InputError, match="unknown dtype"):
        gemm_graph(2, 2, 2, dtype="int8")

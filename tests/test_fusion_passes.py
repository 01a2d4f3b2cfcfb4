"""The fusion passes (implicit-transpose, fuse, place; group-epilogues in test_group_epilogues.py) and
the fusion pipeline.

Before/expected pairs are text-form strings, compared structurally and textually. The graphs here
are reused by test_fusion_ir.py, which splits them into kernels.
"""

from __future__ import annotations

import pytest

from neuronmm_compiler.errors import InputError, IRError, UnknownNameError
from neuronmm_compiler.frontends.shapes import mlp_graph, svd_chain_graph
from neuronmm_compiler.ir import parse_text, to_text
from neuronmm_compiler.passes import (
    DEFAULT_FUSION_PIPELINE,
    Canonicalize,
    FoldTransposes,
    Fuse,
    GroupEpilogues,
    ImplicitTranspose,
    Pass,
    Place,
    QuantizeFp8,
    QuantizeMx,
    get_pass,
    parse_pipeline,
    registered_passes,
    run_pipeline,
)


def check_pass(pass_: Pass, before: str, expected: str, *, changed: bool = True) -> None:
    """Apply ``pass_`` to ``before``; compare with ``expected`` structurally and as text; then
    check that applying it again changes nothing."""
    graph = parse_text(before)
    assert pass_.apply(graph) is changed
    assert graph == parse_text(expected)
    assert to_text(graph) == expected
    assert pass_.apply(graph) is False


def strip(text: str, *keys: str) -> str:
    """``text`` without the annotations ``keys`` (a node left with none prints no braces)."""
    graph = parse_text(text)
    for node in graph.compute_nodes():
        graph.clear_annotations(node.id, *keys)
    return to_text(graph)


def split_pipeline(mode: str) -> str:
    return DEFAULT_FUSION_PIPELINE.replace("fuse", f"fuse{{mlp={mode}}}")


# ----------------------------------------------------------------------------- graphs

SVD_CHAIN = """\
graph svd_chain {
  %x = input "x" [4, 16] float32 layout=row_major
  %u = input "u" [16, 2] float32 layout=row_major
  %v = input "v" [2, 8] float32 layout=row_major
  %xu = matmul %x, %u : [4, 2] float32
  %xuv = matmul %xu, %v : [4, 8] float32
  %y = output "y" %xuv
}
"""
SVD_CHAIN_ORIENTED = """\
graph svd_chain {
  %x = input "x" [4, 16] float32 layout=row_major
  %u = input "u" [16, 2] float32 layout=row_major
  %v = input "v" [2, 8] float32 layout=row_major
  %xu = matmul %x, %u : [4, 2] float32 {orient=transposed}
  %xuv = matmul %xu, %v : [4, 8] float32 {orient=normal}
  %y = output "y" %xuv
}
"""

SVD_MLP = """\
graph svd_mlp {
  %x = input "x" [4, 8] float32 layout=row_major
  %u_gate = input "u_gate" [8, 2] float32 layout=row_major
  %v_gate = input "v_gate" [2, 16] float32 layout=row_major
  %u_up = input "u_up" [8, 3] float32 layout=row_major
  %v_up = input "v_up" [3, 16] float32 layout=row_major
  %u_down = input "u_down" [16, 4] float32 layout=row_major
  %v_down = input "v_down" [4, 8] float32 layout=row_major
  %x_ug = matmul %x, %u_gate : [4, 2] float32
  %gate = matmul %x_ug, %v_gate : [4, 16] float32
  %x_uu = matmul %x, %u_up : [4, 3] float32
  %up = matmul %x_uu, %v_up : [4, 16] float32
  %act = elementwise silu %gate : [4, 16] float32
  %h = elementwise multiply %act, %up : [4, 16] float32
  %h_ud = matmul %h, %u_down : [4, 4] float32
  %down = matmul %h_ud, %v_down : [4, 8] float32
  %out = output "out" %down
}
"""
_MLP_INPUTS = SVD_MLP.split("  %x_ug", 1)[0]
SVD_MLP_ORIENTED = (
    _MLP_INPUTS
    + """\
  %x_ug = matmul %x, %u_gate : [4, 2] float32 {orient=transposed}
  %gate = matmul %x_ug, %v_gate : [4, 16] float32 {orient=transposed}
  %x_uu = matmul %x, %u_up : [4, 3] float32 {orient=transposed}
  %up = matmul %x_uu, %v_up : [4, 16] float32 {orient=transposed}
  %act = elementwise silu %gate : [4, 16] float32 {orient=transposed}
  %h = elementwise multiply %act, %up : [4, 16] float32 {orient=transposed}
  %h_ud = matmul %h, %u_down : [4, 4] float32 {orient=transposed}
  %down = matmul %h_ud, %v_down : [4, 8] float32 {orient=normal}
  %out = output "out" %down
}
"""
)
SVD_MLP_WHOLE = (
    _MLP_INPUTS
    + """\
  %x_ug = matmul %x, %u_gate : [4, 2] float32 {kernel=k0, orient=transposed, place=sbuf}
  %gate = matmul %x_ug, %v_gate : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %x_uu = matmul %x, %u_up : [4, 3] float32 {kernel=k0, orient=transposed, place=sbuf}
  %up = matmul %x_uu, %v_up : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %act = elementwise silu %gate : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %h = elementwise multiply %act, %up : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %h_ud = matmul %h, %u_down : [4, 4] float32 {kernel=k0, orient=transposed, place=sbuf}
  %down = matmul %h_ud, %v_down : [4, 8] float32 {kernel=k0, orient=normal, place=hbm}
  %out = output "out" %down
}
"""
)
SVD_MLP_SPLIT = (
    _MLP_INPUTS
    + """\
  %x_ug = matmul %x, %u_gate : [4, 2] float32 {kernel=k0, orient=transposed, place=sbuf}
  %gate = matmul %x_ug, %v_gate : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %x_uu = matmul %x, %u_up : [4, 3] float32 {kernel=k0, orient=transposed, place=sbuf}
  %up = matmul %x_uu, %v_up : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %act = elementwise silu %gate : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %h = elementwise multiply %act, %up : [4, 16] float32 {kernel=k0, orient=transposed, place=hbm}
  %h_ud = matmul %h, %u_down : [4, 4] float32 {kernel=k1, orient=transposed, place=sbuf}
  %down = matmul %h_ud, %v_down : [4, 8] float32 {kernel=k1, orient=normal, place=hbm}
  %out = output "out" %down
}
"""
)
SVD_MLP_FUSED_SPLIT = strip(SVD_MLP_SPLIT, "orient", "place")  # what fuse{mlp=split} alone gives
# What the whole fusion pipeline gives: group-epilogues adds each value's group (the root of the
# values a kernel evaluates together) and, on values summed into a PSUM accumulator, that accumulator.
SVD_MLP_WHOLE_GROUPED = (
    _MLP_INPUTS
    + """\
  %x_ug = matmul %x, %u_gate : [4, 2] float32 {acc=x_ug, group=x_ug, kernel=k0, orient=transposed, place=sbuf}
  %gate = matmul %x_ug, %v_gate : [4, 16] float32 {acc=gate, group=h, kernel=k0, orient=transposed, place=sbuf}
  %x_uu = matmul %x, %u_up : [4, 3] float32 {acc=x_uu, group=x_uu, kernel=k0, orient=transposed, place=sbuf}
  %up = matmul %x_uu, %v_up : [4, 16] float32 {acc=up, group=h, kernel=k0, orient=transposed, place=sbuf}
  %act = elementwise silu %gate : [4, 16] float32 {group=h, kernel=k0, orient=transposed, place=sbuf}
  %h = elementwise multiply %act, %up : [4, 16] float32 {group=h, kernel=k0, orient=transposed, place=sbuf}
  %h_ud = matmul %h, %u_down : [4, 4] float32 {acc=h_ud, group=h_ud, kernel=k0, orient=transposed, place=sbuf}
  %down = matmul %h_ud, %v_down : [4, 8] float32 {acc=down, group=down, kernel=k0, orient=normal, place=hbm}
  %out = output "out" %down
}
"""
)
SVD_MLP_SPLIT_GROUPED = (
    _MLP_INPUTS
    + """\
  %x_ug = matmul %x, %u_gate : [4, 2] float32 {acc=x_ug, group=x_ug, kernel=k0, orient=transposed, place=sbuf}
  %gate = matmul %x_ug, %v_gate : [4, 16] float32 {acc=gate, group=h, kernel=k0, orient=transposed, place=sbuf}
  %x_uu = matmul %x, %u_up : [4, 3] float32 {acc=x_uu, group=x_uu, kernel=k0, orient=transposed, place=sbuf}
  %up = matmul %x_uu, %v_up : [4, 16] float32 {acc=up, group=h, kernel=k0, orient=transposed, place=sbuf}
  %act = elementwise silu %gate : [4, 16] float32 {group=h, kernel=k0, orient=transposed, place=sbuf}
  %h = elementwise multiply %act, %up : [4, 16] float32 {group=h, kernel=k0, orient=transposed, place=hbm}
  %h_ud = matmul %h, %u_down : [4, 4] float32 {acc=h_ud, group=h_ud, kernel=k1, orient=transposed, place=sbuf}
  %down = matmul %h_ud, %v_down : [4, 8] float32 {acc=down, group=down, kernel=k1, orient=normal, place=hbm}
  %out = output "out" %down
}
"""
)
ORIENT_MIXED = """\
graph g {
  %a = input "a" [4, 8] float32 layout=row_major
  %w = input "w" [8, 8] float32 layout=row_major
  %p = matmul %a, %w : [4, 8] float32
  %q = matmul %p, %w : [4, 8] float32
  %s = elementwise silu %w : [8, 8] float32
  %r = matmul %s, %s : [8, 8] float32
  %t0 = transpose %r : [8, 8] float32
  %z = matmul %t0, %w : [8, 8] float32
  %p_out = output "p_out" %p
  %q_t = output "q_t" %q layout=transposed
  %z_out = output "z_out" %z
}
"""
ORIENT_MIXED_EXPECTED = """\
graph g {
  %a = input "a" [4, 8] float32 layout=row_major
  %w = input "w" [8, 8] float32 layout=row_major
  %p = matmul %a, %w : [4, 8] float32 {orient=normal}
  %q = matmul %p, %w : [4, 8] float32 {orient=transposed}
  %s = elementwise silu %w : [8, 8] float32 {orient=normal}
  %r = matmul %s, %s : [8, 8] float32 {orient=transposed}
  %t0 = transpose %r : [8, 8] float32 {orient=transposed}
  %z = matmul %t0, %w : [8, 8] float32 {orient=normal}
  %p_out = output "p_out" %p
  %q_t = output "q_t" %q layout=transposed
  %z_out = output "z_out" %z
}
"""

BRANCHY = """\
graph g {
  %x = input "x" [4, 4] float32 layout=row_major
  %w = input "w" [4, 4] float32 layout=row_major
  %e = elementwise silu %x : [4, 4] float32
  %m1 = matmul %e, %w : [4, 4] float32
  %m2 = matmul %x, %w : [4, 4] float32
  %m4 = elementwise add %m1, %m2 : [4, 4] float32
  %e2 = elementwise silu %m2 : [4, 4] float32
  %m5 = matmul %e2, %w : [4, 4] float32
  %m6 = matmul %m5, %m4 : [4, 4] float32
  %y = output "m2" %m6
  %z = output "z" %m4
}
"""
BRANCHY_FUSED = """\
graph g {
  %x = input "x" [4, 4] float32 layout=row_major
  %w = input "w" [4, 4] float32 layout=row_major
  %e = elementwise silu %x : [4, 4] float32 {kernel=k0, place=hbm}
  %m1 = matmul %e, %w : [4, 4] float32 {kernel=k1, place=sbuf}
  %m2 = matmul %x, %w : [4, 4] float32 {kernel=k0, place=hbm}
  %m4 = elementwise add %m1, %m2 : [4, 4] float32 {kernel=k1, place=hbm}
  %e2 = elementwise silu %m2 : [4, 4] float32 {kernel=k0, place=hbm}
  %m5 = matmul %e2, %w : [4, 4] float32 {kernel=k2, place=sbuf}
  %m6 = matmul %m5, %m4 : [4, 4] float32 {kernel=k2, place=hbm}
  %y = output "m2" %m6
  %z = output "z" %m4
}
"""
def test_frontend_texts_are_the_ones_used_here():
    assert to_text(svd_chain_graph(4, 8, 16, 2, dtype="fp32")) == SVD_CHAIN
    assert to_text(mlp_graph(4, 8, 16, (2, 3, 4), dtype="fp32")) == SVD_MLP


# ----------------------------------------------------------------------------- implicit-transpose


def test_implicit_transpose_svd_chain():
    check_pass(ImplicitTranspose(), SVD_CHAIN, SVD_CHAIN_ORIENTED)


def test_implicit_transpose_svd_mlp_needs_no_transpose():
    check_pass(ImplicitTranspose(), SVD_MLP, SVD_MLP_ORIENTED)


def test_implicit_transpose_conflicts_rhs_outputs_and_transposes():
    # p: lhs of q (transposed) and a row-major output (normal) conflict -> normal;
    # q: only a transposed output -> transposed; s: read as rhs (and lhs) -> normal;
    # r: read by a transpose that must be transposed -> transposed, the transpose stays.
    check_pass(ImplicitTranspose(), ORIENT_MIXED, ORIENT_MIXED_EXPECTED)


def test_implicit_transpose_overwrites_stale_orients_and_dead_values_are_normal():
    graph = parse_text(SVD_CHAIN_ORIENTED)
    graph.annotate("xu", orient="normal")
    graph.add_transpose("xuv", id="dead")
    assert ImplicitTranspose().apply(graph) is True
    assert graph.annotations("xu") == {"orient": "transposed"}
    assert graph.annotations("dead") == {"orient": "normal"}


# ----------------------------------------------------------------------------- fuse


def test_fuse_whole_puts_everything_in_k0():
    expected = SVD_MLP_FUSED_SPLIT.replace("kernel=k1", "kernel=k0")
    check_pass(Fuse(), SVD_MLP, expected)
    check_pass(Fuse(mlp="whole"), SVD_MLP, expected)


def test_fuse_split_starts_a_kernel_at_the_down_projection():
    check_pass(Fuse(mlp="split"), SVD_MLP, SVD_MLP_FUSED_SPLIT)


def test_fuse_split_numbers_kernels_in_topological_order_and_joins_downstream():
    expected = strip(BRANCHY_FUSED, "place")
    check_pass(Fuse(mlp="split"), BRANCHY, expected)
    # with the add as its lhs, m6 itself reads an elementwise value and starts kernel k3
    swapped = parse_text(BRANCHY.replace("%m6 = matmul %m5, %m4", "%m6 = matmul %m4, %m5"))
    Fuse(mlp="split").apply(swapped)
    assert swapped.annotations("m6") == {"kernel": "k3"}


def test_fuse_split_of_a_graph_without_elementwise_is_one_kernel():
    graph = parse_text(SVD_CHAIN)
    Fuse(mlp="split").apply(graph)
    assert {graph.annotations(node.id)["kernel"] for node in graph.compute_nodes()} == {"k0"}


def test_fuse_options():
    assert Fuse(mlp="split").spec() == "fuse{mlp=split}" and Fuse().spec() == "fuse"
    assert parse_pipeline("fuse{mlp=split}") == [Fuse(mlp="split")]
    with pytest.raises(UnknownNameError, match=r"fuse: unknown mlp mode 'halves'; accepted: whole, split"):
        Fuse(mlp="halves")
    with pytest.raises(UnknownNameError, match=r"accepted: whole, split"):
        parse_pipeline("fuse{mlp=bogus}")
    with pytest.raises(InputError, match=r"mlp must be a string"):
        Fuse(mlp=2)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"it takes mlp \(str\)"):
        parse_pipeline("fuse{depth=1}")


# ----------------------------------------------------------------------------- place


def test_place_keeps_values_on_chip_inside_a_kernel():
    before = strip(SVD_MLP_WHOLE, "place")
    check_pass(Place(), before, SVD_MLP_WHOLE)
    check_pass(Place(), SVD_MLP_WHOLE, SVD_MLP_WHOLE, changed=False)


def test_place_hands_values_to_later_kernels_through_hbm():
    before = strip(SVD_MLP_SPLIT, "place")
    check_pass(Place(), before, SVD_MLP_SPLIT)
    branchy = strip(BRANCHY_FUSED, "place")
    check_pass(Place(), branchy, BRANCHY_FUSED)


def test_place_needs_kernels():
    with pytest.raises(IRError, match=r"place needs a kernel annotation .* \(run fuse first\); missing on %xu, %xuv"):
        Place().apply(parse_text(SVD_CHAIN))


# ----------------------------------------------------------------------------- the fusion pipeline


def test_registry_and_fusion_pipeline():
    assert {"implicit-transpose", "fuse", "place", "group-epilogues"} <= set(registered_passes())
    assert get_pass("fuse", mlp="split") == Fuse(mlp="split")
    assert parse_pipeline(DEFAULT_FUSION_PIPELINE) == [
        QuantizeMx(),
        QuantizeFp8(),
        Canonicalize(),
        FoldTransposes(),
        Canonicalize(),
        ImplicitTranspose(),
        Fuse(),
        Place(),
        GroupEpilogues(),
    ]


@pytest.mark.parametrize(("mode", "expected"), [("whole", SVD_MLP_WHOLE_GROUPED), ("split", SVD_MLP_SPLIT_GROUPED)])
def test_fusion_pipeline_on_the_svd_mlp(mode, expected):
    result = run_pipeline(parse_text(SVD_MLP), split_pipeline(mode))
    assert result.graph == parse_text(expected)
    assert to_text(result.graph) == expected
    assert not any(node.kind == "transpose" for node in result.graph.nodes())



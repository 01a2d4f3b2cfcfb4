"""The fusion passes (implicit-transpose, fuse, place), the fusion pipeline and split_kernels.

Before/expected pairs are text-form strings, compared structurally and textually.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from neuronmm_compiler.errors import InputError, IRError, UnknownNameError
from neuronmm_compiler.ir import COMPUTE_KINDS, Graph, evaluate, mlp_graph, parse_text, svd_chain_graph, to_text
from neuronmm_compiler.passes import (
    DEFAULT_FUSION_PIPELINE,
    Canonicalize,
    FoldTransposes,
    Fuse,
    ImplicitTranspose,
    Pass,
    Place,
    get_pass,
    kernel_order,
    parse_pipeline,
    registered_passes,
    run_pipeline,
    split_kernels,
)
from test_ir_text import random_graphs


def check_pass(pass_: Pass, before: str, expected: str, *, changed: bool = True) -> None:
    """Apply ``pass_`` to ``before``; compare with ``expected`` structurally and as text; then
    check that applying it again changes nothing."""
    graph = parse_text(before)
    assert pass_.apply(graph) is changed
    assert graph == parse_text(expected)
    assert to_text(graph) == expected
    assert pass_.apply(graph) is False


def run_kernels(kernels: list[Graph], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate kernels one after another, each reading graph inputs and earlier kernels' outputs by name."""
    available = dict(inputs)
    produced: dict[str, np.ndarray] = {}
    for kernel in kernels:
        result = evaluate(kernel, {node.name: available[node.name] for node in kernel.inputs()})
        assert not set(result) & set(produced), "a name is produced twice"
        available.update(result)
        produced.update(result)
    return produced


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {node.name: rng.standard_normal(node.storage_shape) for node in graph.inputs()}


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
SVD_MLP_FUSED_SPLIT = (
    _MLP_INPUTS
    + """\
  %x_ug = matmul %x, %u_gate : [4, 2] float32 {kernel=k0}
  %gate = matmul %x_ug, %v_gate : [4, 16] float32 {kernel=k0}
  %x_uu = matmul %x, %u_up : [4, 3] float32 {kernel=k0}
  %up = matmul %x_uu, %v_up : [4, 16] float32 {kernel=k0}
  %act = elementwise silu %gate : [4, 16] float32 {kernel=k0}
  %h = elementwise multiply %act, %up : [4, 16] float32 {kernel=k0}
  %h_ud = matmul %h, %u_down : [4, 4] float32 {kernel=k1}
  %down = matmul %h_ud, %v_down : [4, 8] float32 {kernel=k1}
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
SVD_MLP_K0 = """\
graph svd_mlp_k0 {
  %x = input "x" [4, 8] float32 layout=row_major
  %u_gate = input "u_gate" [8, 2] float32 layout=row_major
  %v_gate = input "v_gate" [2, 16] float32 layout=row_major
  %u_up = input "u_up" [8, 3] float32 layout=row_major
  %v_up = input "v_up" [3, 16] float32 layout=row_major
  %x_ug = matmul %x, %u_gate : [4, 2] float32 {kernel=k0, orient=transposed, place=sbuf}
  %gate = matmul %x_ug, %v_gate : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %x_uu = matmul %x, %u_up : [4, 3] float32 {kernel=k0, orient=transposed, place=sbuf}
  %up = matmul %x_uu, %v_up : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %act = elementwise silu %gate : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %h = elementwise multiply %act, %up : [4, 16] float32 {kernel=k0, orient=transposed, place=hbm}
  %h_0 = output "h" %h layout=transposed
}
"""
SVD_MLP_K1 = """\
graph svd_mlp_k1 {
  %u_down = input "u_down" [16, 4] float32 layout=row_major
  %v_down = input "v_down" [4, 8] float32 layout=row_major
  %h = input "h" [4, 16] float32 layout=transposed
  %h_ud = matmul %h, %u_down : [4, 4] float32 {kernel=k1, orient=transposed, place=sbuf}
  %down = matmul %h_ud, %v_down : [4, 8] float32 {kernel=k1, orient=normal, place=hbm}
  %out = output "out" %down
}
"""

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
BRANCHY_KERNELS = [
    """\
graph g_k0 {
  %x = input "x" [4, 4] float32 layout=row_major
  %w = input "w" [4, 4] float32 layout=row_major
  %e = elementwise silu %x : [4, 4] float32 {kernel=k0, place=hbm}
  %m2 = matmul %x, %w : [4, 4] float32 {kernel=k0, place=hbm}
  %e2 = elementwise silu %m2 : [4, 4] float32 {kernel=k0, place=hbm}
  %e_0 = output "e" %e
  %m2_0 = output "m2_0" %m2
  %e2_0 = output "e2" %e2
}
""",
    """\
graph g_k1 {
  %w = input "w" [4, 4] float32 layout=row_major
  %e = input "e" [4, 4] float32 layout=row_major
  %m2 = input "m2_0" [4, 4] float32 layout=row_major
  %m1 = matmul %e, %w : [4, 4] float32 {kernel=k1, place=sbuf}
  %m4 = elementwise add %m1, %m2 : [4, 4] float32 {kernel=k1, place=hbm}
  %z = output "z" %m4
  %m4_0 = output "m4" %m4
}
""",
    """\
graph g_k2 {
  %w = input "w" [4, 4] float32 layout=row_major
  %m4 = input "m4" [4, 4] float32 layout=row_major
  %e2 = input "e2" [4, 4] float32 layout=row_major
  %m5 = matmul %e2, %w : [4, 4] float32 {kernel=k2, place=sbuf}
  %m6 = matmul %m5, %m4 : [4, 4] float32 {kernel=k2, place=hbm}
  %y = output "m2" %m6
}
""",
]


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
    expected = BRANCHY_FUSED.replace(", place=hbm", "").replace(", place=sbuf", "")
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
    before = SVD_MLP_WHOLE.replace(", place=sbuf}", "}").replace(", place=hbm}", "}")
    check_pass(Place(), before, SVD_MLP_WHOLE)
    check_pass(Place(), SVD_MLP_WHOLE, SVD_MLP_WHOLE, changed=False)


def test_place_hands_values_to_later_kernels_through_hbm():
    before = SVD_MLP_SPLIT.replace(", place=sbuf}", "}").replace(", place=hbm}", "}")
    check_pass(Place(), before, SVD_MLP_SPLIT)
    branchy = BRANCHY_FUSED.replace(", place=sbuf}", "}").replace(", place=hbm}", "}")
    check_pass(Place(), branchy, BRANCHY_FUSED)


def test_place_needs_kernels():
    with pytest.raises(IRError, match=r"place needs a kernel annotation .* \(run fuse first\); missing on %xu, %xuv"):
        Place().apply(parse_text(SVD_CHAIN))


# ----------------------------------------------------------------------------- the fusion pipeline


def test_registry_and_fusion_pipeline():
    assert {"implicit-transpose", "fuse", "place"} <= set(registered_passes())
    assert get_pass("fuse", mlp="split") == Fuse(mlp="split")
    assert parse_pipeline(DEFAULT_FUSION_PIPELINE) == [
        Canonicalize(),
        FoldTransposes(),
        Canonicalize(),
        ImplicitTranspose(),
        Fuse(),
        Place(),
    ]


@pytest.mark.parametrize(("mode", "expected"), [("whole", SVD_MLP_WHOLE), ("split", SVD_MLP_SPLIT)])
def test_fusion_pipeline_on_the_svd_mlp(mode, expected):
    result = run_pipeline(parse_text(SVD_MLP), split_pipeline(mode))
    assert result.graph == parse_text(expected)
    assert to_text(result.graph) == expected
    assert not any(node.kind == "transpose" for node in result.graph.nodes())


def test_fusion_pipeline_on_the_svd_chain_with_transposed_x():
    graph = run_pipeline(svd_chain_graph(4, 8, 16, 2, dtype="fp32", x_layout="km"), DEFAULT_FUSION_PIPELINE).graph
    assert to_text(graph) == (
        "graph svd_chain {\n"
        '  %x_t = input "x_t" [4, 16] float32 layout=transposed\n'
        '  %u = input "u" [16, 2] float32 layout=row_major\n'
        '  %v = input "v" [2, 8] float32 layout=row_major\n'
        "  %xu = matmul %x_t, %u : [4, 2] float32 {kernel=k0, orient=transposed, place=sbuf}\n"
        "  %xuv = matmul %xu, %v : [4, 8] float32 {kernel=k0, orient=normal, place=hbm}\n"
        '  %y = output "y" %xuv\n'
        "}\n"
    )


def test_fusion_pipeline_on_the_dense_mlp():
    graph = run_pipeline(mlp_graph(4, 8, 16, None), split_pipeline("split")).graph
    annotations = {node.id: graph.annotations(node.id) for node in graph.compute_nodes()}
    assert annotations == {
        "gate": {"orient": "transposed", "kernel": "k0", "place": "sbuf"},
        "up": {"orient": "transposed", "kernel": "k0", "place": "sbuf"},
        "act": {"orient": "transposed", "kernel": "k0", "place": "sbuf"},
        "h": {"orient": "transposed", "kernel": "k0", "place": "hbm"},
        "down": {"orient": "normal", "kernel": "k1", "place": "hbm"},
    }


# ----------------------------------------------------------------------------- split_kernels


def test_split_kernels_of_a_single_kernel_graph_is_the_graph_renamed():
    graph = parse_text(SVD_MLP_WHOLE)
    [kernel] = split_kernels(graph)
    assert kernel.name == "svd_mlp_k0"
    assert kernel == graph.copy(name="svd_mlp_k0")
    assert to_text(kernel) == SVD_MLP_WHOLE.replace("graph svd_mlp {", "graph svd_mlp_k0 {")


def test_split_kernels_of_the_split_mlp_hands_h_over_transposed():
    graph = parse_text(SVD_MLP_SPLIT)
    kernels = split_kernels(graph)
    assert [to_text(kernel) for kernel in kernels] == [SVD_MLP_K0, SVD_MLP_K1]
    assert [kernel.name for kernel in kernels] == ["svd_mlp_k0", "svd_mlp_k1"]
    boundary_out = kernels[0].outputs()[-1]
    boundary_in = kernels[1].inputs()[-1]
    assert (boundary_out.name, boundary_out.layout, boundary_out.storage_shape) == ("h", "transposed", (16, 4))
    assert (boundary_in.name, boundary_in.layout, boundary_in.storage_shape) == ("h", "transposed", (16, 4))


@pytest.mark.parametrize("mode", ["whole", "split"])
def test_split_kernels_evaluate_like_the_whole_graph(mode):
    source = mlp_graph(5, 8, 16, (2, 3, 4), dtype="fp32")
    fused = run_pipeline(source, split_pipeline(mode)).graph
    inputs = random_inputs(source, seed=3)
    expected = evaluate(source, inputs)
    kernels = split_kernels(fused)
    assert len(kernels) == (1 if mode == "whole" else 2)
    produced = run_kernels(kernels, inputs)
    np.testing.assert_allclose(produced["out"], expected["out"], rtol=1e-12)
    if mode == "split":  # the hand-over is h, stored transposed
        x = inputs["x"]
        h = (x @ inputs["u_gate"] @ inputs["v_gate"]) / (1 + np.exp(-(x @ inputs["u_gate"] @ inputs["v_gate"])))
        h = h * (x @ inputs["u_up"] @ inputs["v_up"])
        np.testing.assert_allclose(produced["h"], h.T, rtol=1e-12)


def test_split_kernels_boundaries_names_and_order():
    graph = parse_text(BRANCHY_FUSED)
    kernels = split_kernels(graph)
    assert kernel_order(graph) == ["k0", "k1", "k2"]
    assert [to_text(kernel) for kernel in kernels] == BRANCHY_KERNELS
    inputs = random_inputs(graph, seed=5)
    produced, expected = run_kernels(kernels, inputs), evaluate(graph, inputs)
    for name in ("m2", "z"):
        np.testing.assert_allclose(produced[name], expected[name], rtol=1e-12)


def test_split_kernels_unused_inputs_and_passed_through_inputs_go_to_the_first_kernel():
    out_line = '  %out = output "out" %down\n'
    graph = parse_text(SVD_MLP_SPLIT.replace(out_line, out_line + '  %xo = output "x_again" %x\n'))
    graph.add_input("spare", (2, 2), "fp32")
    first, second = split_kernels(graph)
    assert "spare" in [node.name for node in first.inputs()]
    assert "x_again" in [node.name for node in first.outputs()]
    assert "spare" not in [node.name for node in second.inputs()]


def test_split_kernels_errors():
    with pytest.raises(IRError, match=r"no kernel annotations \(run the fuse pass first\)"):
        split_kernels(parse_text(SVD_CHAIN))
    passthrough = Graph("p")
    passthrough.add_output("o", passthrough.add_input("a", (2, 2), "fp32"))
    with pytest.raises(IRError, match=r"has no compute nodes"):
        split_kernels(passthrough)
    backwards = parse_text(SVD_CHAIN)
    backwards.annotate("xu", kernel="k1")
    backwards.annotate("xuv", kernel="k0")
    backwards.add_output("extra", backwards.add_transpose("xu", id="t_late"))
    backwards.annotate("t_late", kernel="k0")
    # first appearance: xu (k1), xuv (k0) -> order k1, k0; xuv (k0) reads xu (k1): fine
    assert [kernel.name for kernel in split_kernels(backwards)] == ["svd_chain_k1", "svd_chain_k0"]
    backwards.annotate("xu", kernel="k0")
    backwards.annotate("xuv", kernel="k1")
    backwards.add_output("late", backwards.add_elementwise("silu", "xuv", id="s_late"))
    backwards.annotate("s_late", kernel="k0")
    with pytest.raises(IRError, match=r"%s_late \(kernel k0\) reads %xuv of the later kernel k1"):
        split_kernels(backwards)


# ----------------------------------------------------------------------------- properties


@settings(max_examples=120, deadline=None)
@given(
    st.one_of(random_graphs(), random_graphs(max_ops=12, chains=True)),
    st.sampled_from(["whole", "split"]),
    st.integers(0, 2**32 - 1),
)
def test_fusion_pipeline_and_split_preserve_values(graph, mode, seed):
    result = run_pipeline(graph, split_pipeline(mode)).graph
    compute = result.compute_nodes()
    assume(compute)
    order = kernel_order(result)
    assert order == [f"k{index}" for index in range(len(order))]
    for node in compute:
        annotations = result.annotations(node.id)
        assert set(annotations) == {"orient", "kernel", "place"}
        users = [result.node(user) for user in result.users(node.id)]
        leaves = any(
            user.kind not in COMPUTE_KINDS or user.annotations["kernel"] != annotations["kernel"] for user in users
        )
        assert annotations["place"] == ("hbm" if leaves else "sbuf")
        if users and all(user.kind == "matmul" and user.operands[1] != node.id for user in users):
            assert annotations["orient"] == "transposed"  # read only as a matmul lhs
        for operand in node.operands:
            if operand in {n.id for n in compute}:
                assert order.index(result.annotations(operand)["kernel"]) <= order.index(annotations["kernel"])
    inputs = random_inputs(graph, seed)
    expected = evaluate(graph, inputs)
    produced = run_kernels(split_kernels(result), inputs)
    for name, value in expected.items():
        np.testing.assert_allclose(produced[name], value, rtol=1e-9, atol=1e-12)

"""Graph construction, queries, mutation, identity, and the verifier's rules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuronmm_compiler.errors import InputError, IRError, UnknownNameError
from neuronmm_compiler.frontends.shapes import gemm_graph
from neuronmm_compiler.ir import Graph, canonical_dtype, verify


def mlp_graph() -> Graph:
    """silu(x @ gate) * (x @ up), with a dead transpose hanging off x."""
    graph = Graph("mlp")
    x = graph.add_input("x", (4, 8), "bf16")
    gate = graph.add_input("gate", (8, 16), "bfloat16")
    up = graph.add_input("up", (8, 16), "bf16")
    gated = graph.add_elementwise("silu", graph.add_matmul(x, gate))
    product = graph.add_elementwise("multiply", gated, graph.add_matmul(x, up))
    graph.add_transpose(x)
    graph.add_output("y", product)
    return graph


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("bf16", "bfloat16"),
        ("bfloat16", "bfloat16"),
        ("BF16", "bfloat16"),
        ("fp32", "float32"),
        ("float32", "float32"),
        (np.float32, "float32"),
        (np.dtype("float32"), "float32"),
        (ml_dtypes.bfloat16, "bfloat16"),
    ],
)
def test_canonical_dtype_accepts_aliases(alias, canonical):
    assert canonical_dtype(alias) == canonical


@pytest.mark.parametrize("bad", ["fp16", "float64", "int8", "", np.float64, 3])
def test_canonical_dtype_rejects_unknown_and_lists_accepted(bad):
    with pytest.raises(InputError, match=r"accepted: bf16, bfloat16, fp32, float32"):
        canonical_dtype(bad)


# ----------------------------------------------------------------------------- construction


def test_nodes_get_readable_ids_shapes_and_dtypes():
    graph = mlp_graph()
    ids = [node.id for node in graph.nodes()]
    assert ids == ["x", "gate", "up", "mm0", "silu0", "mm1", "mul0", "t0", "y"]
    mm0 = graph.node("mm0")
    assert (mm0.kind, mm0.operands, mm0.shape, mm0.dtype) == ("matmul", ("x", "gate"), (4, 16), "bfloat16")
    assert graph.node("t0").shape == (8, 4)
    assert dict(graph.node("mul0").attrs) == {"op": "multiply"}
    assert dict(graph.node("x").attrs) == {"name": "x", "layout": "row_major"}
    assert graph.node("y").name == "y" and graph.node("y").shape == (4, 16)
    assert [node.id for node in graph.inputs()] == ["x", "gate", "up"]
    assert [node.id for node in graph.outputs()] == ["y"]


def test_node_is_frozen():
    node = mlp_graph().node("mm0")
    with pytest.raises(AttributeError):
        node.shape = (1, 1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        node.attrs["op"] = "add"  # type: ignore[index]


def test_explicit_ids_and_collisions():
    graph = Graph("g")
    a = graph.add_input("a", (2, 2), "fp32")
    graph.add_matmul(a, a, id="square")
    assert graph.node("square").operands == ("a", "a")
    with pytest.raises(IRError, match=r"%square is already used"):
        graph.add_transpose(a, id="square")
    with pytest.raises(InputError, match="node id"):
        graph.add_transpose(a, id="not valid")
    graph.add_transpose(a, id="mm0")
    assert graph.add_matmul(a, a) == "mm1"  # auto ids skip taken ones
    assert graph.add_output("mm1", "mm1") == "mm1_0"  # output name kept, id made unique
    assert graph.node("mm1_0").name == "mm1"


def test_same_operand_twice_is_kept_in_order():
    graph = Graph("g")
    a = graph.add_input("a", (3, 3), "fp32")
    product = graph.add_elementwise("multiply", a, a)
    assert graph.node(product).operands == (a, a)
    assert graph.nx_graph.edges[a, product]["operand_indices"] == (0, 1)
    assert graph.users(a) == [product]


def test_transposed_input_storage_shape():
    graph = Graph("g")
    graph.add_input("a", (1024, 512), "bf16", layout="transposed")
    node = graph.node("a")
    assert node.shape == (1024, 512)
    assert node.storage_shape == (512, 1024)
    graph.add_input("b", (7, 3), "bf16")
    assert graph.node("b").storage_shape == (7, 3)


def test_matmul_shape_mismatch_names_node_and_both_shapes():
    graph = Graph("g")
    a = graph.add_input("a", (4, 8), "bf16")
    b = graph.add_input("b", (16, 2), "bf16")
    with pytest.raises(
        IRError, match=r"matmul %mm0: contraction sizes differ: lhs %a .*\[4, 8\].*%b .*\[16, 2\]"
    ):
        graph.add_matmul(a, b)
    assert "mm0" not in graph  # nothing half-added


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda g: g.add_elementwise("add", "a", "c"), r"operand shapes differ: %a \[4, 8\].*%c \[8, 4\]"),
        (lambda g: g.add_elementwise("add", "a", "f"), r"operand dtypes differ"),
        (lambda g: g.add_matmul("c", "f"), r"operand dtypes differ"),
        (lambda g: g.add_elementwise("silu", "a", "a"), r"takes 1 operand\(s\), got 2"),
        (lambda g: g.add_elementwise("multiply", "a"), r"takes 2 operand\(s\), got 1"),
        (lambda g: g.add_transpose("v"), r"needs 2-D operands"),
        (lambda g: g.add_matmul("v", "a"), r"needs 2-D operands"),
        (lambda g: g.add_transpose("missing"), r"no node %missing"),
        (lambda g: g.add_transpose("out"), r"uses output %out as an operand"),
    ],
)
def test_bad_operands_raise_irerror(build, message):
    graph = Graph("g")
    graph.add_input("a", (4, 8), "bf16")
    graph.add_input("c", (8, 4), "bf16")
    graph.add_input("f", (8, 4), "fp32")
    graph.add_input("v", (8,), "bf16")
    graph.add_output("out", "a")
    with pytest.raises(IRError, match=message):
        build(graph)


def test_unknown_elementwise_op_lists_known():
    graph = Graph("g")
    graph.add_input("a", (2, 2), "bf16")
    with pytest.raises(UnknownNameError, match=r"'gelu'; known: silu, multiply, add"):
        graph.add_elementwise("gelu", "a")


@pytest.mark.parametrize("name", ["class", "1a", "a-b", "", "naïve", 3])
def test_boundary_names_must_be_identifiers(name):
    graph = Graph("g")
    with pytest.raises(InputError, match="Python identifier"):
        graph.add_input(name, (2, 2), "bf16")
    graph.add_input("a", (2, 2), "bf16")
    with pytest.raises(InputError, match="Python identifier"):
        graph.add_output(name, "a")


def test_graph_name_must_be_identifier():
    with pytest.raises(InputError, match="graph name"):
        Graph("my graph")


def test_input_and_output_names_are_unique():
    graph = Graph("g")
    graph.add_input("a", (2, 2), "bf16")
    with pytest.raises(InputError, match="already used by input %a"):
        graph.add_input("a", (2, 2), "bf16")
    with pytest.raises(InputError, match="already used by input %a"):
        graph.add_output("a", "a")


@pytest.mark.parametrize("shape", [(), (0, 2), (2, -1), (2.5, 2), (True, 2), "ab", 5, None])
def test_input_shape_must_be_positive_ints(shape):
    with pytest.raises(InputError, match="positive integers"):
        Graph("g").add_input("a", shape, "bf16")


def test_input_layout_checks():
    graph = Graph("g")
    with pytest.raises(InputError, match="accepted: row_major, transposed"):
        graph.add_input("a", (2, 2), "bf16", layout="column_major")
    with pytest.raises(InputError, match="needs a 2-D shape"):
        graph.add_input("a", (2, 2, 2), "bf16", layout="transposed")


# ----------------------------------------------------------------------------- queries and mutation


def test_nodes_break_topological_ties_by_insertion_order():
    graph = Graph("g")
    b = graph.add_input("b", (2, 2), "bf16")
    a = graph.add_input("a", (2, 2), "bf16")
    graph.add_output("late", graph.add_transpose(a))
    graph.add_output("early", b)
    assert [node.id for node in graph.nodes()] == ["b", "a", "t0", "late", "early"]


def test_replace_all_uses_keeps_positions():
    graph = Graph("g")
    a = graph.add_input("a", (3, 3), "fp32")
    b = graph.add_input("b", (3, 3), "fp32")
    product = graph.add_elementwise("multiply", a, b)
    total = graph.add_elementwise("add", b, a)
    assert graph.replace_all_uses(a, b) == 2
    assert graph.node(product).operands == (b, b)
    assert graph.node(total).operands == (b, b)
    assert graph.nx_graph.edges[b, product]["operand_indices"] == (0, 1)
    assert graph.users(a) == []
    assert graph.replace_all_uses(b, b) == 0


def test_replace_all_uses_rejects_mismatch_and_cycles():
    graph = Graph("g")
    a = graph.add_input("a", (3, 3), "fp32")
    c = graph.add_input("c", (3, 4), "fp32")
    s = graph.add_elementwise("silu", a)
    graph.add_output("o", graph.add_elementwise("add", a, a))
    with pytest.raises(IRError, match="shape or dtype differs"):
        graph.replace_all_uses(a, c)
    with pytest.raises(IRError, match="would make a cycle"):
        graph.replace_all_uses(a, s)


def test_remove_node_only_when_unused():
    graph = mlp_graph()
    with pytest.raises(IRError, match=r"still used by %silu0"):
        graph.remove_node("mm0")
    graph.remove_node("t0")
    assert "t0" not in graph
    assert graph.users("x") == ["mm0", "mm1"]


def test_copy_is_independent_and_equal():
    graph = mlp_graph()
    duplicate = graph.copy()
    assert duplicate == graph and duplicate is not graph
    duplicate.remove_node("t0")
    assert "t0" in graph
    assert duplicate != graph


def test_equality_and_signature_follow_structure():
    first, second = mlp_graph(), mlp_graph()
    assert first == second
    assert first.signature() == second.signature()
    assert len(first.signature()) == 64
    assert first != "graph"
    renamed = Graph("mlp")  # same structure but another id for the transpose
    for node in first.nodes():
        if node.kind == "input":
            renamed.add_input(node.name, node.shape, node.dtype)
        elif node.kind == "transpose":
            renamed.add_transpose(node.operands[0], id="x_t")
        elif node.kind == "output":
            renamed.add_output(node.name, node.operands[0])
        elif node.kind == "matmul":
            renamed.add_matmul(*node.operands, id=node.id)
        else:
            renamed.add_elementwise(node.attrs["op"], *node.operands, id=node.id)
    assert renamed != first
    assert renamed.signature() != first.signature()


def test_input_order_is_part_of_identity():
    first, second = Graph("g"), Graph("g")
    for graph, names in ((first, "ab"), (second, "ba")):
        for name in names:
            graph.add_input(name, (2, 2), "bf16")
        graph.add_output("o", graph.add_elementwise("add", "a", "b"))
    assert first != second
    assert first.signature() != second.signature()


def test_str_is_text_form():
    text = str(gemm_graph(2, 3, 4))
    assert text.startswith("graph gemm {\n") and "%mm0 = matmul %a, %b : [2, 3] bfloat16" in text


# ----------------------------------------------------------------------------- verifier


def _verify_error(graph: Graph) -> str:
    with pytest.raises(IRError) as caught:
        verify(graph)
    return str(caught.value)


def _marked_line(message: str) -> str:
    marked = [line for line in message.splitlines() if line.startswith("  >>")]
    assert len(marked) == 1, message
    return marked[0]


def test_verify_accepts_valid_graphs():
    verify(mlp_graph())
    verify(gemm_graph(8, 8, 8, a_layout="km"))


def test_verify_dangling_reference():
    graph = mlp_graph()
    graph.nx_graph.add_edge("ghost", "t0", operand_indices=(0,))
    graph.nx_graph.remove_edge("x", "t0")
    message = _verify_error(graph)
    assert "%t0: uses %ghost, which is not defined" in message
    assert "%t0 = transpose %ghost" in _marked_line(message)


def test_verify_shape_recorded_wrong_prints_context():
    graph = mlp_graph()
    graph.nx_graph.nodes["mm1"]["shape"] = (4, 4)
    message = _verify_error(graph)
    assert "%mm1: matmul is recorded as [4, 4] bfloat16 but its operands give [4, 16] bfloat16" in message
    assert "%mm1 = matmul %x, %up : [4, 4] bfloat16" in _marked_line(message)
    assert "graph mlp {" in message and "%silu0 = elementwise silu" in message


def test_verify_dtype_recorded_wrong():
    graph = mlp_graph()
    graph.nx_graph.nodes["y"]["dtype"] = "float32"
    assert "%y: output is recorded as [4, 16] float32 but its operands give [4, 16] bfloat16" in (
        _verify_error(graph)
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kind", "conv", "unknown kind 'conv'"),
        ("shape", (4, 0), "shape must be a non-empty tuple of positive ints"),
        ("shape", [4, 16], "shape must be a non-empty tuple of positive ints"),
        ("dtype", "bf16", "dtype 'bf16' is not one of bfloat16, float32"),
        ("attrs", {}, "elementwise lacks attribute(s) op"),
        ("attrs", {"op": "gelu"}, "unknown op 'gelu'"),
    ],
)
def test_verify_malformed_fields(field, value, message):
    graph = mlp_graph()
    graph.nx_graph.nodes["silu0"][field] = value
    error = _verify_error(graph)
    assert f"%silu0: {message}" in error or f"%silu0: elementwise %silu0: {message}" in error
    assert "%silu0 =" in _marked_line(error)


def test_verify_operand_arity():
    graph = mlp_graph()
    graph.nx_graph.remove_edge("up", "mm1")
    assert "%mm1: matmul takes 2 operand(s) at positions [0, 1]; its edges give positions [0]" in (
        _verify_error(graph)
    )


def test_verify_operand_positions_must_be_exact():
    graph = mlp_graph()
    graph.nx_graph.edges["up", "mm1"]["operand_indices"] = (2,)
    assert "its edges give positions [0, 2]" in _verify_error(graph)
    del graph.nx_graph.edges["up", "mm1"]["operand_indices"]
    assert "edge from %up has no operand_indices" in _verify_error(graph)


def test_verify_inputs_take_no_operands():
    graph = mlp_graph()
    graph.nx_graph.add_edge("x", "up", operand_indices=(0,))
    message = _verify_error(graph)
    assert "%up: input has operands (%x); inputs take none" in message
    assert '%up = input "up"' in _marked_line(message)


def test_verify_cycle():
    graph = mlp_graph()
    g = graph.nx_graph
    g.remove_edge("x", "mm0")
    g.add_edge("mul0", "mm0", operand_indices=(0,))
    message = _verify_error(graph)
    assert "the graph has a cycle" in message
    assert "%mm0" in message and "%mul0" in message


@pytest.mark.parametrize(
    ("layout", "shape", "message"),
    [
        ("diagonal", (4, 8), "layout 'diagonal' is not one of row_major, transposed"),
        ("transposed", (2, 2, 2), "layout 'transposed' needs a 2-D shape, got [2, 2, 2]"),
    ],
)
def test_verify_input_layout(layout, shape, message):
    graph = Graph("g")
    graph.add_input("a", shape, "bf16")
    graph.add_output("o", "a")
    graph.nx_graph.nodes["a"]["attrs"]["layout"] = layout
    assert f"%a: {message}" in _verify_error(graph)


def test_verify_output_has_no_users():
    graph = mlp_graph()
    graph.nx_graph.add_edge("y", "t0", operand_indices=(0,))
    graph.nx_graph.remove_edge("x", "t0")
    assert "%y: output is used by %t0; outputs have no users" in _verify_error(graph)


def test_verify_names_unique_and_identifiers():
    graph = mlp_graph()
    graph.nx_graph.nodes["y"]["attrs"]["name"] = "x"
    assert "%y: output name 'x' is also used by %x; names must be unique" in _verify_error(graph)
    graph.nx_graph.nodes["y"]["attrs"]["name"] = "lambda"
    assert "output name 'lambda' is not a Python identifier" in _verify_error(graph)


def test_verify_needs_an_output():
    graph = Graph("g")
    graph.add_input("a", (2, 2), "bf16")
    assert "the graph has no outputs" in _verify_error(graph)


def test_redirect_output_flips_the_layout_and_keeps_the_array():
    graph = Graph("g")
    x = graph.add_input("x", (4, 6), "fp32")
    w = graph.add_input("w", (6, 3), "fp32")
    xw = graph.add_matmul(x, w, id="xw")
    out = graph.add_output("y", graph.add_transpose(xw, id="t"))
    before = graph.node(out).storage_shape
    graph.redirect_output(out, xw)
    node = graph.node(out)
    assert node.operands == ("xw",) and node.layout == "transposed" and node.shape == (4, 3)
    assert node.storage_shape == before
    with pytest.raises(IRError, match="does not return a transpose"):
        graph.redirect_output(out, x)
    with pytest.raises(IRError, match="not an output"):
        graph.redirect_output(xw, x)

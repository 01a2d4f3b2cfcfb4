"""IR support for fusion: annotations, transposed outputs, their text form and verification, and the
SVD frontends (block-aligned rank, SVD chain, SVD and dense MLP)."""

from __future__ import annotations

import numpy as np
import pytest

from neuronmm_compiler.errors import InputError, IRError, ParseError, UnknownNameError
from neuronmm_compiler.ir import (
    Graph,
    block_aligned_rank,
    evaluate,
    gemm_graph,
    mlp_graph,
    parse_text,
    svd_chain_graph,
    to_table,
    to_text,
    verify,
)
from neuronmm_compiler.passes import DEFAULT_PIPELINE, run_pipeline

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


def small_graph() -> Graph:
    graph = Graph("g")
    a = graph.add_input("a", (4, 8), "fp32")
    b = graph.add_input("b", (8, 3), "fp32")
    mm = graph.add_matmul(a, b)
    graph.add_output("c", graph.add_elementwise("silu", mm))
    return graph


# ----------------------------------------------------------------------------- annotations API


def test_annotate_sets_reads_and_reports_changes():
    graph = small_graph()
    assert graph.annotations("mm0") == {} and dict(graph.node("mm0").annotations) == {}
    assert graph.annotate("mm0", orient="transposed", kernel="k0") is True
    assert graph.annotate("mm0", orient="transposed") is False  # same value again
    assert graph.annotate("mm0", place="sbuf", orient="normal") is True  # overwrite + add
    assert graph.annotations("mm0") == {"orient": "normal", "kernel": "k0", "place": "sbuf"}
    assert dict(graph.node("mm0").annotations) == graph.annotations("mm0")
    assert graph.annotations("a") == {} and graph.annotations("c") == {}


def test_annotations_are_copies_and_node_view_is_frozen():
    graph = small_graph()
    graph.annotate("silu0", kernel="k0")
    copied = graph.annotations("silu0")
    copied["kernel"] = "k9"
    assert graph.annotations("silu0") == {"kernel": "k0"}
    with pytest.raises(TypeError):
        graph.node("silu0").annotations["kernel"] = "k1"  # type: ignore[index]


def test_clear_annotations():
    graph = small_graph()
    graph.annotate("mm0", orient="normal", kernel="k0", place="hbm")
    assert graph.clear_annotations("mm0", "place", "orient") is True
    assert graph.annotations("mm0") == {"kernel": "k0"}
    assert graph.clear_annotations("mm0", "place") is False
    assert graph.clear_annotations("mm0") is True
    assert graph.annotations("mm0") == {}


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ({"colour": "red"}, UnknownNameError, r"%mm0: unknown annotation key 'colour'; known: kernel, orient, place"),
        ({"orient": "sideways"}, InputError, r"orient='sideways' is not valid; accepted: normal, transposed"),
        ({"place": "psum"}, InputError, r"place='psum' is not valid; accepted: sbuf, hbm"),
        ({"kernel": "0k"}, InputError, r"kernel='0k': the value must be an identifier"),
        ({"kernel": "class"}, InputError, r"must be an identifier"),
        ({"orient": "normal", "place": "dram"}, InputError, r"place='dram'"),
    ],
)
def test_annotate_rejects_bad_keys_and_values_atomically(values, error, message):
    graph = small_graph()
    with pytest.raises(error, match=message):
        graph.annotate("mm0", **values)
    assert graph.annotations("mm0") == {}  # nothing half-set


def test_annotate_only_compute_nodes():
    graph = small_graph()
    with pytest.raises(IRError, match=r"cannot annotate %a: it is an input; only compute nodes"):
        graph.annotate("a", orient="normal")
    with pytest.raises(IRError, match=r"it is an output"):
        graph.annotate("c", kernel="k0")
    with pytest.raises(IRError, match=r"no node %ghost"):
        graph.annotate("ghost", kernel="k0")
    with pytest.raises(IRError, match=r"no node %ghost"):
        graph.annotations("ghost")


def test_equality_signature_and_copy_include_annotations():
    first, second = small_graph(), small_graph()
    first.annotate("mm0", orient="transposed")
    assert first != second and first.signature() != second.signature()
    second.annotate("mm0", orient="transposed")
    assert first == second and first.signature() == second.signature()
    duplicate = first.copy()
    duplicate.annotate("mm0", orient="normal")
    assert first.annotations("mm0") == {"orient": "transposed"}
    renamed = first.copy(name="other")
    assert renamed.name == "other" and renamed != first and renamed.copy(name="g") == first
    with pytest.raises(InputError, match="graph name"):
        first.copy(name="not ok")


# ----------------------------------------------------------------------------- transposed outputs


def test_transposed_output_storage_shape_and_layout():
    graph = Graph("g")
    a = graph.add_input("a", (4, 8), "bf16")
    graph.add_output("plain", a)
    graph.add_output("flipped", a, layout="transposed")
    assert graph.node("plain").layout == "row_major" and graph.node("plain").storage_shape == (4, 8)
    assert graph.node("flipped").layout == "transposed"
    assert graph.node("flipped").shape == (4, 8) and graph.node("flipped").storage_shape == (8, 4)
    assert graph.node("a").layout == "row_major"


def test_output_layout_checks():
    graph = Graph("g")
    graph.add_input("a", (4, 8), "bf16")
    graph.add_input("v", (8,), "bf16")
    with pytest.raises(InputError, match=r"output 'o': unknown layout 'diagonal'; accepted: row_major, transposed"):
        graph.add_output("o", "a", layout="diagonal")
    with pytest.raises(InputError, match=r"output 'o': layout 'transposed' needs a 2-D shape; got \[8\]"):
        graph.add_output("o", "v", layout="transposed")
    assert "o" not in graph


def test_evaluate_returns_outputs_in_storage_layout():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    graph = Graph("g")
    product = graph.add_matmul(graph.add_input("a", (5, 3), "fp32"), graph.add_input("b", (3, 4), "fp32"))
    graph.add_output("c", product)
    graph.add_output("c_t", product, layout="transposed")
    result = evaluate(graph, {"a": a, "b": b})
    np.testing.assert_allclose(result["c"], a @ b, rtol=1e-12)
    assert result["c_t"].shape == (4, 5)
    np.testing.assert_allclose(result["c_t"], (a @ b).T, rtol=1e-12)


# ----------------------------------------------------------------------------- text form


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
    graph = small_graph()
    assert "{" not in to_text(graph).split("\n", 1)[1]
    graph.annotate("mm0", place="hbm", orient="normal", kernel="k0")
    assert "  %mm0 = matmul %a, %b : [4, 3] float32 {kernel=k0, orient=normal, place=hbm}\n" in to_text(graph)
    assert '  %c = output "c" %silu0\n' in to_text(graph)


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


# ----------------------------------------------------------------------------- verifier


def _verify_error(graph: Graph) -> str:
    with pytest.raises(IRError) as caught:
        verify(graph)
    return str(caught.value)


def _marked(message: str) -> str:
    [line] = [line for line in message.splitlines() if line.startswith("  >>")]
    return line


@pytest.mark.parametrize(
    ("node", "annotations", "message"),
    [
        ("mm0", {"colour": "red"}, "%mm0: unknown annotation key 'colour'; known: kernel, orient, place"),
        ("mm0", {"orient": "sideways"}, "%mm0: annotation orient='sideways' is not valid"),
        ("mm0", {"place": "psum"}, "%mm0: annotation place='psum' is not valid; accepted: sbuf, hbm"),
        ("mm0", {"kernel": "k 0"}, "%mm0: annotation kernel='k 0': the value must be an identifier"),
        ("mm0", {"kernel": 3}, "%mm0: annotation kernel=3"),
        ("mm0", ["orient"], "%mm0: annotations must be a dict"),
        ("x", {"orient": "normal"}, "%x: input carries annotations (orient); only compute nodes"),
        ("h_t", {"kernel": "k0"}, "%h_t: output carries annotations (kernel)"),
    ],
)
def test_verify_rejects_bad_annotations(node, annotations, message):
    graph = parse_text(ANNOTATED)
    graph.nx_graph.nodes[node]["annotations"] = annotations
    error = _verify_error(graph)
    assert message in error
    assert f"%{node} =" in _marked(error)


def test_verify_kernel_annotation_on_all_or_none():
    graph = parse_text(ANNOTATED)
    verify(graph)
    graph.clear_annotations("s", "kernel")
    error = _verify_error(graph)
    assert "%s: has no kernel annotation but %mm0 has one" in error
    assert "(missing on %s)" in error
    assert "%s = elementwise silu %v3" in _marked(error)
    for node in ("mm0", "v3"):
        graph.clear_annotations(node, "kernel")
    verify(graph)  # none has a kernel: fine


def test_verify_output_layout():
    graph = parse_text(ANNOTATED)
    graph.nx_graph.nodes["h_t"]["attrs"]["layout"] = "diagonal"
    error = _verify_error(graph)
    assert "%h_t: layout 'diagonal' is not one of row_major, transposed" in error
    assert '%h_t = output "h_t" %v3 layout=diagonal' in _marked(error)
    del graph.nx_graph.nodes["h_t"]["attrs"]["layout"]
    assert "%h_t: output lacks attribute(s) layout" in _verify_error(graph)


def test_verify_shows_annotations_in_context():
    graph = parse_text(ANNOTATED)
    graph.nx_graph.nodes["v3"]["shape"] = (1, 1)
    marked = _marked(_verify_error(graph))
    assert "%v3 = matmul %mm0, %vg : [1, 1] bfloat16 {kernel=k0, orient=transposed, place=hbm}" in marked


# ----------------------------------------------------------------------------- block-aligned rank


@pytest.mark.parametrize(
    ("model", "k", "n", "rank"),
    [
        ("Llama-3.2-1B", 2048, 8192, 1280),
        ("Llama-3.2-3B", 3072, 8192, 1792),
        ("Llama-3.1-8B", 4096, 14336, 2560),
        ("Qwen3-1.7B", 2048, 6144, 1280),
        ("Qwen3-4B", 2560, 9728, 1664),
    ],
)
def test_block_aligned_rank_matches_the_paper(model, k, n, rank):
    assert block_aligned_rank(k, n, 0.8) == rank, model
    assert block_aligned_rank(n, k, 0.8) == rank  # symmetric: the down projection gets the same rank


def test_block_aligned_rank_rounding_and_clamping():
    assert block_aligned_rank(1024, 1024, 0.625) == 384  # 2.5 tiles -> 3 (half-up; round() would give 2)
    assert block_aligned_rank(512, 512, 0.625) == 128  # 1.25 tiles -> 1
    assert block_aligned_rank(4096, 4096, 0.01) == 128  # 0.16 tiles -> 0, clamped up to one tile
    assert block_aligned_rank(1_000_000, 250, 1.0) == 128  # 1.95 tiles -> 2 > 250: clamped to 250 // 128 tiles
    assert block_aligned_rank(100, 4096, 1.0) == 100  # min(k, n) < align: full rank, unaligned
    assert block_aligned_rank(2048, 8192, 0.8, align=64) == 1280  # 20.48 tiles of 64 -> 20
    assert block_aligned_rank(2048, 8192, 0.5, align=64) == 832  # 12.8 -> 13 tiles of 64


@pytest.mark.parametrize("ratio", [0, -0.1, 1.01, float("nan"), "0.8", True, None])
def test_block_aligned_rank_rejects_bad_ratio(ratio):
    with pytest.raises(InputError, match=r"keep_ratio .* must be a number in \(0, 1\]"):
        block_aligned_rank(2048, 8192, ratio)


@pytest.mark.parametrize(("k", "n", "align"), [(0, 8, 128), (8, -1, 128), (8, 8, 0), (8.0, 8, 128), (8, 8, True)])
def test_block_aligned_rank_rejects_bad_sizes(k, n, align):
    with pytest.raises(InputError, match="must be a positive integer"):
        block_aligned_rank(k, n, 0.8, align)


# ----------------------------------------------------------------------------- SVD chain frontend

SVD_CHAIN_TEXT = """\
graph svd_chain {
  %x = input "x" [128, 2048] bfloat16 layout=row_major
  %u = input "u" [2048, 1280] bfloat16 layout=row_major
  %v = input "v" [1280, 8192] bfloat16 layout=row_major
  %xu = matmul %x, %u : [128, 1280] bfloat16
  %xuv = matmul %xu, %v : [128, 8192] bfloat16
  %y = output "y" %xuv
}
"""

SVD_CHAIN_KM_FOLDED = """\
graph svd_chain {
  %x_t = input "x_t" [4, 16] float32 layout=transposed
  %u = input "u" [16, 2] float32 layout=row_major
  %v = input "v" [2, 8] float32 layout=row_major
  %xu = matmul %x_t, %u : [4, 2] float32
  %xuv = matmul %xu, %v : [4, 8] float32
  %y = output "y" %xuv
}
"""


def test_svd_chain_graph_text_and_values():
    graph = svd_chain_graph(128, 8192, 2048, 1280)
    assert to_text(graph) == SVD_CHAIN_TEXT
    rng = np.random.default_rng(1)
    x, u, v = rng.standard_normal((6, 5)), rng.standard_normal((5, 2)), rng.standard_normal((2, 3))
    result = evaluate(svd_chain_graph(6, 3, 5, 2, dtype="fp32"), {"x": x, "u": u, "v": v})
    np.testing.assert_allclose(result["y"], x @ u @ v, rtol=1e-12)


def test_svd_chain_graph_km_is_literal_and_folds():
    graph = svd_chain_graph(4, 8, 16, 2, dtype="fp32", x_layout="km")
    assert graph.node("x_t").shape == (16, 4)
    assert [node.kind for node in graph.nodes()].count("transpose") == 1
    assert graph.node("xu").operands[0] != "x_t"
    folded = run_pipeline(graph, DEFAULT_PIPELINE).graph
    assert to_text(folded) == SVD_CHAIN_KM_FOLDED


def test_svd_chain_graph_rejects_bad_arguments():
    with pytest.raises(InputError, match=r"svd_chain: rank must be a positive integer; got 0"):
        svd_chain_graph(4, 8, 16, 0)
    with pytest.raises(InputError, match=r"svd_chain: M must be a positive integer"):
        svd_chain_graph(-4, 8, 16, 2)
    with pytest.raises(InputError, match=r"unknown X layout 'nk'; accepted: mk, km"):
        svd_chain_graph(4, 8, 16, 2, x_layout="nk")


# ----------------------------------------------------------------------------- MLP frontend


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def test_svd_mlp_graph_structure_and_shapes():
    graph = mlp_graph(128, 2048, 8192, (1280, 1152, 1024))
    verify(graph)
    assert graph.name == "svd_mlp"
    shapes = {node.name: node.shape for node in graph.inputs()}
    assert shapes == {
        "x": (128, 2048),
        "u_gate": (2048, 1280),
        "v_gate": (1280, 8192),
        "u_up": (2048, 1152),
        "v_up": (1152, 8192),
        "u_down": (8192, 1024),
        "v_down": (1024, 2048),
    }
    computed = [(node.id, node.kind, node.operands, node.shape) for node in graph.compute_nodes()]
    assert computed == [
        ("x_ug", "matmul", ("x", "u_gate"), (128, 1280)),
        ("gate", "matmul", ("x_ug", "v_gate"), (128, 8192)),
        ("x_uu", "matmul", ("x", "u_up"), (128, 1152)),
        ("up", "matmul", ("x_uu", "v_up"), (128, 8192)),
        ("act", "elementwise", ("gate",), (128, 8192)),
        ("h", "elementwise", ("act", "up"), (128, 8192)),
        ("h_ud", "matmul", ("h", "u_down"), (128, 1024)),
        ("down", "matmul", ("h_ud", "v_down"), (128, 2048)),
    ]
    assert graph.node("act").attrs["op"] == "silu" and graph.node("h").attrs["op"] == "multiply"
    [out] = graph.outputs()
    assert (out.name, out.operands, out.shape, out.layout) == ("out", ("down",), (128, 2048), "row_major")


def test_dense_mlp_graph_structure():
    graph = mlp_graph(4, 8, 16, None, dtype="fp32")
    assert graph.name == "dense_mlp"
    assert [(node.name, node.shape) for node in graph.inputs()] == [
        ("x", (4, 8)),
        ("w_gate", (8, 16)),
        ("w_up", (8, 16)),
        ("w_down", (16, 8)),
    ]
    assert [node.id for node in graph.compute_nodes()] == ["gate", "up", "act", "h", "down"]
    assert graph.node("down").operands == ("h", "w_down") and graph.node("out").shape == (4, 8)


def test_mlp_graphs_compute_the_gated_mlp():
    rng = np.random.default_rng(2)
    t, hidden, inter, ranks = 3, 6, 10, (2, 3, 4)
    arrays = {
        "x": rng.standard_normal((t, hidden)),
        "u_gate": rng.standard_normal((hidden, ranks[0])),
        "v_gate": rng.standard_normal((ranks[0], inter)),
        "u_up": rng.standard_normal((hidden, ranks[1])),
        "v_up": rng.standard_normal((ranks[1], inter)),
        "u_down": rng.standard_normal((inter, ranks[2])),
        "v_down": rng.standard_normal((ranks[2], hidden)),
    }
    a = arrays
    h = _silu(a["x"] @ a["u_gate"] @ a["v_gate"]) * (a["x"] @ a["u_up"] @ a["v_up"])
    expected = h @ a["u_down"] @ a["v_down"]
    got = evaluate(mlp_graph(t, hidden, inter, ranks, dtype="fp32"), arrays)["out"]
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    dense = {
        "x": a["x"],
        "w_gate": a["u_gate"] @ a["v_gate"],
        "w_up": a["u_up"] @ a["v_up"],
        "w_down": a["u_down"] @ a["v_down"],
    }
    got_dense = evaluate(mlp_graph(t, hidden, inter, None, dtype="fp32"), dense)["out"]
    np.testing.assert_allclose(got_dense, expected, rtol=1e-10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 8, 16, None), r"mlp: tokens must be a positive integer; got 0"),
        ((4, 8.0, 16, None), r"mlp: hidden must be a positive integer"),
        ((4, 8, -16, None), r"mlp: intermediate must be a positive integer"),
        ((4, 8, 16, (2, 2)), r"ranks must be None \(dense MLP\) or three positive integers \(gate, up, down\)"),
        ((4, 8, 16, 2), r"ranks must be None"),
        ((4, 8, 16, (2, 0, 2)), r"mlp: up rank must be a positive integer; got 0"),
        ((4, 8, 16, (2, 2, True)), r"mlp: down rank must be a positive integer"),
    ],
)
def test_mlp_graph_rejects_bad_arguments(args, message):
    with pytest.raises(InputError, match=message):
        mlp_graph(*args)


def test_gemm_text_is_unchanged_by_output_layouts():
    # outputs print layout= only when transposed, so existing texts stay byte-identical
    assert '%c = output "c" %mm0\n' in to_text(gemm_graph(2, 3, 4))

"""``--shape MxNxK`` parsing, the GEMM frontend, the block-aligned SVD rank, the SVD chain and the MLP."""

from __future__ import annotations

import numpy as np
import pytest

from neuronmm_compiler.errors import InputError
from neuronmm_compiler.frontends.shapes import block_aligned_rank, gemm_graph, mlp_graph, parse_shape, svd_chain_graph
from neuronmm_compiler.ir import evaluate, parse_text, to_text, verify
from neuronmm_compiler.passes import DEFAULT_FUSION_PIPELINE, DEFAULT_PIPELINE, run_pipeline


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
    with pytest.raises(InputError, match=r"--keep-ratio .* must be a number in \(0, 1\]"):
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


# ----------------------------------------------------------------------------- through the fusion pipeline


def test_fusion_pipeline_on_the_svd_chain_with_transposed_x():
    graph = run_pipeline(svd_chain_graph(4, 8, 16, 2, dtype="fp32", x_layout="km"), DEFAULT_FUSION_PIPELINE).graph
    assert to_text(graph) == (
        "graph svd_chain {\n"
        '  %x_t = input "x_t" [4, 16] float32 layout=transposed\n'
        '  %u = input "u" [16, 2] float32 layout=row_major\n'
        '  %v = input "v" [2, 8] float32 layout=row_major\n'
        "  %xu = matmul %x_t, %u : [4, 2] float32 {acc=xu, group=xu, kernel=k0, orient=transposed, place=sbuf}\n"
        "  %xuv = matmul %xu, %v : [4, 8] float32 {acc=xuv, group=xuv, kernel=k0, orient=normal, place=hbm}\n"
        '  %y = output "y" %xuv\n'
        "}\n"
    )


def test_fusion_pipeline_on_the_dense_mlp():
    graph = run_pipeline(mlp_graph(4, 8, 16, None), DEFAULT_FUSION_PIPELINE.replace("fuse", "fuse{mlp=split}")).graph
    annotations = {node.id: graph.annotations(node.id) for node in graph.compute_nodes()}
    assert annotations == {
        "gate": {"orient": "transposed", "kernel": "k0", "place": "sbuf", "group": "h", "acc": "gate"},
        "up": {"orient": "transposed", "kernel": "k0", "place": "sbuf", "group": "h", "acc": "up"},
        "act": {"orient": "transposed", "kernel": "k0", "place": "sbuf", "group": "h"},
        "h": {"orient": "transposed", "kernel": "k0", "place": "hbm", "group": "h"},
        "down": {"orient": "normal", "kernel": "k1", "place": "hbm", "group": "down", "acc": "down"},
    }

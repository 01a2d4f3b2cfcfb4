"""The NumPy reference evaluator against direct NumPy, and its input checking."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from neuronmm_compiler.errors import InputError, IRError
from neuronmm_compiler.frontends.shapes import gemm_graph
from neuronmm_compiler.ir import Graph, evaluate, parse_text
from neuronmm_compiler.passes import DEFAULT_PIPELINE, run_pipeline
from neuronmm_compiler.vocab import ElementwiseOp


def _rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def test_gemm_matches_numpy():
    rng = _rng()
    a, b = rng.standard_normal((48, 32)), rng.standard_normal((32, 40))
    result = evaluate(gemm_graph(48, 40, 32), {"a": a, "b": b})
    assert list(result) == ["c"]
    assert result["c"].dtype == np.float64
    np.testing.assert_allclose(result["c"], a @ b, rtol=1e-12)


def test_gemm_with_a_transposed_matches_numpy_before_and_after_folding():
    rng = _rng()
    a_t, b = rng.standard_normal((32, 48)), rng.standard_normal((32, 40))  # the user holds A^T [K, M]
    literal = gemm_graph(48, 40, 32, a_layout="km")
    folded = run_pipeline(literal, DEFAULT_PIPELINE).graph
    assert folded.node("a_t").attrs["layout"] == "transposed"
    assert folded.node("a_t").shape == (48, 32)
    for graph in (literal, folded):
        np.testing.assert_allclose(evaluate(graph, {"a_t": a_t, "b": b})["c"], a_t.T @ b, rtol=1e-12)


def test_transposed_input_arrives_in_storage_shape():
    graph = Graph("g")
    graph.add_input("x", (2, 3), "fp32", layout="transposed")
    graph.add_output("y", "x")
    stored = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(evaluate(graph, {"x": stored})["y"], stored.T)
    with pytest.raises(
        InputError, match=r"input 'x' has shape \[2, 3\]; expected its storage shape \[3, 2\]"
    ):
        evaluate(graph, {"x": stored.T})


def test_gated_mlp_matches_numpy():
    text = """graph mlp {
      %x = input "x" [6, 8] bfloat16
      %g = input "g" [8, 5] bfloat16
      %u = input "u" [8, 5] bfloat16
      %mm0 = matmul %x, %g : [6, 5] bfloat16
      %silu0 = elementwise silu %mm0 : [6, 5] bfloat16
      %mm1 = matmul %x, %u : [6, 5] bfloat16
      %mul0 = elementwise multiply %silu0, %mm1 : [6, 5] bfloat16
      %add0 = elementwise add %mul0, %mm0 : [6, 5] bfloat16
      %t0 = transpose %add0 : [5, 6] bfloat16
      %y = output "y" %t0
      %z = output "z" %mm1
    }"""
    rng = _rng()
    x, g, u = rng.standard_normal((6, 8)), rng.standard_normal((8, 5)), rng.standard_normal((8, 5))
    gate = x @ g
    expected = (gate / (1 + np.exp(-gate)) * (x @ u) + gate).T
    result = evaluate(parse_text(text), {"x": x, "g": g, "u": u})
    assert list(result) == ["y", "z"]
    np.testing.assert_allclose(result["y"], expected, rtol=1e-12)
    np.testing.assert_allclose(result["z"], x @ u, rtol=1e-12)


def test_dtype_argument_and_bfloat16_inputs():
    a = np.ones((4, 3), dtype=ml_dtypes.bfloat16)
    b = np.full((3, 2), 2, dtype=ml_dtypes.bfloat16)
    result = evaluate(gemm_graph(4, 2, 3), {"a": a, "b": b}, dtype=np.float32)["c"]
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, np.full((4, 2), 6.0))


def test_silu_of_large_negative_values_does_not_warn():
    graph = Graph("g")
    graph.add_output("y", graph.add_elementwise("silu", graph.add_input("x", (1, 3), "fp32")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = evaluate(graph, {"x": np.array([[-1000.0, 0.0, 1000.0]])})["y"]
    np.testing.assert_array_equal(y, [[0.0, 0.0, 1000.0]])


def test_outputs_do_not_alias():
    graph = Graph("g")
    a = graph.add_input("a", (2, 2), "fp32")
    graph.add_output("first", a)
    graph.add_output("second", a)
    given = np.zeros((2, 2))
    result = evaluate(graph, {"a": given})
    result["first"][0, 0] = 7.0
    assert result["second"][0, 0] == 0.0 and given[0, 0] == 0.0


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"a": np.zeros((4, 3))}, r"missing b \(it takes a, b\)"),
        ({"a": np.zeros((4, 3)), "b": np.zeros((3, 2)), "bias": 0}, r"unexpected bias"),
        ({"b": np.zeros((3, 2)), "c": 0}, r"missing a; unexpected c"),
        (
            {"a": np.zeros((3, 4)), "b": np.zeros((3, 2))},
            r"input 'a' has shape \[3, 4\]; expected .* \[4, 3\]",
        ),
        ({"a": [["x", "y", "z"]] * 4, "b": np.zeros((3, 2))}, r"input 'a': cannot convert to float64"),
    ],
)
def test_bad_inputs_raise_inputerror(inputs, message):
    with pytest.raises(InputError, match=message):
        evaluate(gemm_graph(4, 2, 3), inputs)


def test_invalid_graph_is_rejected_before_evaluation():
    graph = gemm_graph(4, 2, 3)
    graph.nx_graph.nodes["mm0"]["shape"] = (4, 4)
    with pytest.raises(IRError, match="%mm0: matmul is recorded as"):
        evaluate(graph, {"a": np.zeros((4, 3)), "b": np.zeros((3, 2))})


def test_evaluation_failure_names_the_node(monkeypatch):
    def broken_apply(op, *operands):
        raise FloatingPointError("overflow")

    monkeypatch.setattr(ElementwiseOp, "apply", broken_apply)
    graph = Graph("g")
    graph.add_output("y", graph.add_elementwise("silu", graph.add_input("x", (1, 1), "fp32")))
    with pytest.raises(IRError, match=r"evaluating elementwise %silu0 failed: FloatingPointError: overflow"):
        evaluate(graph, {"x": np.ones((1, 1))})


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

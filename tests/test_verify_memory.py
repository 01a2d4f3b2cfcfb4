"""Verification in bounded memory: the float64 reference in row chunks equals the unchunked
evaluation, the rounding allowance is computed only where it is not zero, and --max-memory
refuses a file before anything runs."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.codegen import TensorSpec, read_metadata
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.frontends.shapes import gemm_graph, mlp_graph, svd_chain_graph
from neuronmm_compiler.ir import Graph, evaluate, parse_text
from neuronmm_compiler.verification import random_inputs
from neuronmm_compiler.verification.memory import parse_size, verify_bytes
from neuronmm_compiler.verification.reference import ROW, WHOLE, reference_chunks, row_labels, uncertain


def _inputs(graph: Graph, seed: int = 1) -> dict[str, np.ndarray]:
    return random_inputs([TensorSpec(n.name, n.storage_shape, n.dtype) for n in graph.inputs()], seed)


def _stitched(graph: Graph, inputs: dict[str, np.ndarray], rows: int | None) -> tuple[dict, dict]:
    """Every output's reference and allowance, chunks put back together (logical layout)."""
    values: dict[str, list] = {}
    sigmas: dict[str, list] = {}
    for chunk in reference_chunks(graph, inputs, rows_per_chunk=rows):
        for name, value in chunk.values.items():
            values.setdefault(name, []).append(value)
            sigmas.setdefault(name, []).append(chunk.sigmas[name])
    return ({name: np.concatenate(parts) for name, parts in values.items()},
            {name: None if parts[0] is None else np.concatenate(parts) for name, parts in sigmas.items()})


GRAPHS = {
    "gemm": lambda: gemm_graph(37, 50, 64),
    "gemm-transposed-a": lambda: parse_text(
        'graph g {\n  %a = input "a" [37, 64] bfloat16 layout=transposed\n'
        '  %b = input "b" [64, 50] bfloat16 layout=row_major\n  %mm0 = matmul %a, %b : [37, 50] bfloat16\n'
        '  %c = output "c" %mm0\n}\n'),
    "chain": lambda: svd_chain_graph(45, 60, 70, 16),
    "mlp": lambda: mlp_graph(29, 64, 96, (32, 32, 32)),
    "dense-mlp": lambda: mlp_graph(29, 64, 96, None, dtype="float32"),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("rows", [1, 7, None])
def test_chunked_reference_equals_the_unchunked_evaluation(name, rows):
    graph = GRAPHS[name]()
    inputs = _inputs(graph)
    assert row_labels(graph) is not None
    values, _ = _stitched(graph, inputs, rows)
    expected = evaluate(graph, inputs)
    for node in graph.outputs():
        stored = values[node.name].T if node.layout == "transposed" else values[node.name]
        np.testing.assert_allclose(stored, expected[node.name], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_allowance_is_the_same_in_chunks_and_zero_without_stored_intermediates(name):
    graph = GRAPHS[name]()
    inputs = _inputs(graph)
    _, whole = _stitched(graph, inputs, 10**6)
    _, chunked = _stitched(graph, inputs, 5)
    for out in graph.outputs():
        if name.startswith("gemm"):
            assert whole[out.name] is None and chunked[out.name] is None and not uncertain(graph)
        else:
            assert whole[out.name] is not None and float(np.max(whole[out.name])) > 0
            np.testing.assert_allclose(chunked[out.name], whole[out.name], rtol=1e-12, atol=0)


def test_a_graph_not_cut_by_rows_is_evaluated_whole():
    graph = parse_text('graph g {\n  %x = input "x" [20, 30] float32 layout=row_major\n'
                       '  %w = input "w" [20, 40] float32 layout=row_major\n'
                       '  %t = transpose %x : [30, 20] float32\n  %y = matmul %t, %w : [30, 40] float32\n'
                       '  %s = elementwise silu %x : [20, 30] float32\n'
                       '  %o = output "o" %y\n  %p = output "p" %s\n}\n')
    assert row_labels(graph) is None
    inputs = _inputs(graph)
    chunks = list(reference_chunks(graph, inputs, rows_per_chunk=3))
    assert len(chunks) == 1 and chunks[0].stop is None
    expected = evaluate(graph, inputs)
    for name, value in chunks[0].values.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-12)


def test_row_labels_of_a_chain():
    labels = row_labels(svd_chain_graph(45, 60, 70, 16))
    assert labels is not None
    assert {k: v for k, v in labels.items() if v == WHOLE} == {"u": WHOLE, "v": WHOLE}
    assert labels["x"] == ROW


def test_parse_size():
    assert parse_size("1.5G") == 3 * 2**29 and parse_size("800M") == 800 * 2**20 and parse_size("1536") == 1536 * 2**20
    assert parse_size("2GiB") == 2 * 2**30
    for bad in ("", "-1G", "0", "lots", "1.5Q"):
        with pytest.raises(InputError, match="--max-memory"):
            parse_size(bad)


def test_max_memory_refuses_before_running(tmp_path):
    kernel = tmp_path / "k.py"
    assert CliRunner().invoke(main, ["emit", "--shape", "256x512x384", "-o", str(kernel)]).exit_code == 0
    meta = read_metadata(kernel.read_text())
    need = verify_bytes(meta, parse_text(meta.graph))
    refused = CliRunner().invoke(main, ["verify", str(kernel), "--max-memory", "100M"])
    assert refused.exit_code == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        f"nmmc: error: {kernel}: verifying it needs about {-(-need // 2**20)} MiB (inputs, outputs and the float64 "
        "reference), more than --max-memory 100 MiB; raise --max-memory or verify on a machine with more memory"]
    allowed = CliRunner().invoke(main, ["verify", str(kernel), "--max-memory", "2G"])
    assert allowed.exit_code == 0, allowed.output

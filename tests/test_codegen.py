"""Emitted files: only the documented API subset of their dialect, deterministic, self-describing."""

from __future__ import annotations

import ast

import pytest

from helpers import compile_gemm
from neuronmm_compiler.codegen import TensorSpec, read_metadata
from neuronmm_compiler.schedule import PRESETS
from neuronmm_compiler.vocab import Dialect

ALLOWED = {
    "nki": {
        "nki": {"jit"},
        "nl": {"ndarray", "bfloat16", "float32", "sbuf", "psum", "shared_hbm", "add", "multiply", "silu", "copy"},
        "nisa": {"dma_copy", "dma_transpose", "nc_matmul", "nc_transpose", "tensor_copy", "tensor_tensor",
                 "activation", "memset"},
    },
    "neuronxcc": {
        "nki": {"jit"},
        "nl": {"ndarray", "zeros", "bfloat16", "float32", "sbuf", "psum", "shared_hbm", "load", "load_transpose2d",
               "store", "copy", "add", "multiply", "silu", "affine_range", "sequential_range", "static_range"},
        "nisa": {"nc_matmul", "nc_transpose"},
    },
}
IMPORTS = {
    "nki": {"numpy", "nki", "nki.isa", "nki.language"},
    "neuronxcc": {"numpy", "neuronxcc.nki", "neuronxcc.nki.isa", "neuronxcc.nki.language"},
}
CASES = [
    (shape, preset, params)
    for shape in [(1, 512, 128), (200, 700, 300), (1024, 2048, 2048)]
    for preset in PRESETS
    for params in ({}, {"a_transpose": "pe"}, {"accumulate": "sbuf", "loop_order": "knm", "tiles_in_block_k": 1})
]


def _api_uses(tree: ast.AST) -> dict[str, set[str]]:
    uses: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            uses.setdefault(node.value.id, set()).add(node.attr)
    return uses


@pytest.mark.parametrize("dialect", ["nki", "neuronxcc"])
@pytest.mark.parametrize(("shape", "preset", "params"), CASES)
def test_emitted_file_uses_only_its_dialects_subset(dialect, shape, preset, params):
    source = compile_gemm(*shape, schedule=preset, params=params, dialect=dialect).kernel.source
    tree = ast.parse(source)
    uses = _api_uses(tree)
    for module, allowed in ALLOWED[dialect].items():
        assert uses.get(module, set()) <= allowed, (module, uses.get(module, set()) - allowed)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        assert not isinstance(node, ast.ImportFrom)
        if isinstance(node, ast.keyword):
            assert node.arg != "address", "address= defeats the compiler's buffer rotation"
    assert imported == IMPORTS[dialect]
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions == ["gemm_kernel", "reference"]
    if dialect == "nki":
        assert "neuronxcc" not in source.split('"""NKI kernel emitted')[1]


def test_header_records_what_a_reader_needs():
    compiled = compile_gemm(200, 700, 300, schedule="aws-block-free", target="trn2", dialect="neuronxcc")
    source = compiled.kernel.source
    meta = read_metadata(source)
    assert meta == compiled.kernel.metadata
    assert meta.target == "trn2" and meta.dialect is Dialect.NEURONXCC
    assert [k.name for k in meta.kernels] == ["gemm_kernel"]
    assert meta.inputs == (TensorSpec("a", (200, 300), "bfloat16"), TensorSpec("b", (300, 700), "bfloat16"))
    assert meta.schedule.kind == "gemm" and meta.schedule.params["tiles_in_block_m"] == 2
    header = source.split('"""NKI kernel emitted')[0]
    for text in ("M=200 N=700 K=300", "aws-block-free", "tiles_in_block_m=2", "trn2", "nmmc 0.1.0", "predicted"):
        assert text in header


def test_reference_in_the_file_matches_the_graph():
    import numpy as np

    for layout in ("mk", "km"):
        source = compile_gemm(64, 96, 80, a_layout=layout, dtype="fp32").kernel.source
        tree = ast.parse(source)
        ref = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "reference")
        namespace: dict = {"np": np}
        exec(compile(ast.Module(body=[ref], type_ignores=[]), "<reference>", "exec"), namespace)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((64, 80) if layout == "mk" else (80, 64))
        b = rng.standard_normal((80, 96))
        expected = (a if layout == "mk" else a.T) @ b
        np.testing.assert_allclose(namespace["reference"](a, b), expected)

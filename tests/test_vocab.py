"""The typed vocabularies (vocab.py): members are their strings, and each conversion is defined once."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest

from neuronmm_compiler.codegen import DIALECTS, check_dialect
from neuronmm_compiler.codegen.printer import NL_OPS, PRINTERS
from neuronmm_compiler.codegen.reference import reference_source
from neuronmm_compiler.errors import UnknownNameError
from neuronmm_compiler.frontends import graph_file
from neuronmm_compiler.frontends.shapes import A_LAYOUTS, gemm_graph, mlp_graph
from neuronmm_compiler.interpreter.loader import PLAIN_IMPORTS
from neuronmm_compiler.interpreter.ops import ACTIVATION_FUNCS, BINARY_FUNCS
from neuronmm_compiler.ir import COMPUTE_KINDS, ELEMENTWISE_ARITY, KINDS, LAYOUTS, ORIENTS, Graph, evaluate
from neuronmm_compiler.verification.nki_backend import MIN_NKI_VERSION, PACKAGES
from neuronmm_compiler.vocab import ALayout, Dialect, ElementwiseOp, Layout, NodeKind, Orient, StrEnum

ENUMS: tuple[type[StrEnum], ...] = (Layout, ALayout, Orient, Dialect, NodeKind, ElementwiseOp)


@pytest.mark.parametrize("enum", ENUMS)
def test_members_are_their_strings(enum: type[StrEnum]) -> None:
    for member in enum:
        value = member.value
        assert type(value) is str
        assert member == value and value == member and hash(member) == hash(value)
        assert str(member) == f"{member}" == format(member) == "-".join([member]) == value
        assert f"{member:>12}" == f"{value:>12}"
        assert json.dumps({member: [member]}) == json.dumps({value: [value]})
        assert {value: 1}[member] == 1 and {member: 1}[value] == 1
        assert member in enum.values() and value in tuple(enum)
        assert pickle.loads(pickle.dumps(member)) is member and copy.deepcopy(member) is member
        assert enum(value) is member and enum.lookup(value) is member and enum.lookup(member) is member
        assert repr(member).startswith(f"<{enum.__name__}.")


@pytest.mark.parametrize("enum", ENUMS)
@pytest.mark.parametrize("value", ["", "ROW_MAJOR", "nope", None, 1, ["row_major"], {"mk": 1}])
def test_lookup_of_anything_else_is_none(enum: type[StrEnum], value: object) -> None:
    assert enum.lookup(value) is None


def test_values_in_definition_order() -> None:
    assert Layout.values() == ("row_major", "transposed")
    assert ALayout.values() == ("mk", "km")
    assert Orient.values() == ("normal", "transposed")
    assert (tuple(Layout), tuple(ALayout), tuple(Orient)) == (LAYOUTS, A_LAYOUTS, ORIENTS)


def test_layout_conversions_are_one_table() -> None:
    assert [layout.flipped for layout in Layout] == [Layout.TRANSPOSED, Layout.ROW_MAJOR]
    assert {a: a.layout for a in ALayout} == {ALayout.MK: Layout.ROW_MAJOR, ALayout.KM: Layout.TRANSPOSED}
    assert {o: o.layout for o in Orient} == {Orient.NORMAL: Layout.ROW_MAJOR, Orient.TRANSPOSED: Layout.TRANSPOSED}
    for layout in Layout:
        assert ALayout.of(layout).layout is layout and ALayout.of(layout.value).layout is layout
        assert Orient.of(layout).layout is layout
    with pytest.raises(ValueError):
        ALayout.of("mk")


def test_graph_holds_typed_layouts() -> None:
    graph = gemm_graph(64, 32, 16, a_layout="km")
    assert all(type(node.layout) is Layout for node in graph.nodes() if node.kind in ("input", "output"))
    assert "layout=row_major" in str(graph) and "Layout" not in str(graph)


def test_dialects_and_what_derives_from_them() -> None:
    assert Dialect.values() == ("nki", "neuronxcc")
    assert [(d.nki_version, d.module, d.top_module, d.versions) for d in Dialect] == [
        ("0.3", "nki", "nki", "NKI 0.3+"), ("0.1", "neuronxcc.nki", "neuronxcc", "NKI 0.1")]
    assert dict(DIALECTS) == {
        "nki": "NKI 0.3+ (import nki)",
        "neuronxcc": "NKI 0.1 (import neuronxcc.nki), as the NeuronMM paper used"}
    assert list(PRINTERS) == list(Dialect) and all(PRINTERS[d].dialect is d for d in Dialect)
    assert PRINTERS[Dialect.NKI].imports == ("import nki", "import nki.isa as nisa", "import nki.language as nl")
    assert PRINTERS[Dialect.NEURONXCC].imports == (
        "import neuronxcc.nki as nki", "import neuronxcc.nki.isa as nisa", "import neuronxcc.nki.language as nl")
    assert PACKAGES == {"nki": ("nki", "'nki' (NKI 0.3+, Neuron SDK 2.29 and later)"),
                        "neuronxcc": ("neuronxcc.nki",
                                      "'neuronx-cc' (neuronxcc.nki, NKI 0.1; Neuron SDK 2.29 and earlier)")}
    assert MIN_NKI_VERSION == (0, 3)
    assert check_dialect("neuronxcc") is Dialect.NEURONXCC
    with pytest.raises(UnknownNameError, match=r"unknown dialect 'cuda'; dialects: nki, neuronxcc"):
        check_dialect("cuda")


@pytest.mark.parametrize(("module", "dialect"), [
    ("nki", Dialect.NKI), ("nki.language", Dialect.NKI), ("neuronxcc", Dialect.NEURONXCC),
    ("neuronxcc.nki.isa", Dialect.NEURONXCC), ("numpy", None), ("nkix", None),
    *((m, None) for m in sorted(PLAIN_IMPORTS))])
def test_dialect_of_a_module(module: str, dialect: Dialect | None) -> None:
    assert Dialect.of_module(module) is dialect


def test_node_kinds() -> None:
    assert KINDS == tuple(NodeKind) == ("input", "matmul", "transpose", "elementwise", "norm", "output")
    assert COMPUTE_KINDS == ("matmul", "transpose", "elementwise", "norm")
    assert {kind: kind.arity for kind in NodeKind} == {
        "input": 0, "matmul": 2, "transpose": 1, "elementwise": None, "norm": None, "output": 1}
    graph = mlp_graph(4, 8, 16, None)
    assert all(type(node.kind) is NodeKind for node in graph.nodes())
    assert all(type(node.attrs["op"]) is ElementwiseOp for node in graph.nodes() if node.kind == NodeKind.ELEMENTWISE)


def test_one_elementwise_table_for_every_user() -> None:
    assert ElementwiseOp.values() == ("silu", "multiply", "add", "quantize", "dequantize", "row_scale", "quantize_mx")
    assert dict(ELEMENTWISE_ARITY) == {"silu": 1, "multiply": 2, "add": 2, "quantize": 2, "dequantize": 3,
                                       "row_scale": 1, "quantize_mx": 1}
    assert [op for op in ElementwiseOp if op.unary] == [ElementwiseOp.SILU]
    assert {op: NL_OPS[op] for op in ElementwiseOp} == {"silu": "nl.silu", "multiply": "nl.multiply", "add": "nl.add",
                                                       "quantize": "nl.divide", "dequantize": "nl.multiply",
                                                       "row_scale": "nl.maximum", "quantize_mx": "nl.divide"}
    assert dict(graph_file.OPS) == {"matmul": 2, "transpose": 1, "add": 2, "multiply": 2, "silu": 1, "rmsnorm": 2,
                                    "layernorm": 3}
    for op in ElementwiseOp:  # the interpreter implements every op kernels are printed with
        assert op.nki.removeprefix("nl.") in (ACTIVATION_FUNCS if op.unary else BINARY_FUNCS)
    assert ElementwiseOp.SILU.numpy_source("x") == "x / (1.0 + np.exp(-x))"
    assert ElementwiseOp.ADD.numpy_source("a", "b") == "a + b"


@pytest.mark.parametrize("op", [op for op in ElementwiseOp if not op.fp8])  # FP8 ops: tests/test_fp8*.py
def test_numpy_spelling_and_evaluation_agree(op: ElementwiseOp) -> None:
    """The reference source a kernel file prints and the evaluator compute the same op."""
    graph = Graph("g")
    args = [graph.add_input(name, (3, 5), "fp32") for name in ("a", "b")[: op.arity]]
    node = graph.add_elementwise(op.value, *args)
    assert node.startswith(op.info.id_prefix)
    graph.add_output("y", node)
    rng = np.random.default_rng(0)
    inputs = {name: rng.standard_normal((3, 5)) * 30 for name in ("a", "b")[: op.arity]}
    namespace: dict = {"np": np}
    exec("\n".join(reference_source(graph)), namespace)
    printed = namespace["reference"](*inputs.values())
    assert np.allclose(printed, evaluate(graph, inputs)["y"], rtol=1e-12, atol=0)

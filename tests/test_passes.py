"""Passes (before/expected, compared structurally and textually), the registry and the driver."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronmm_compiler.errors import InputError, IRError, UnknownNameError
from neuronmm_compiler.frontends.shapes import gemm_graph
from neuronmm_compiler.ir import Graph, evaluate, parse_text, to_text
from neuronmm_compiler.passes import (
    DEFAULT_PIPELINE,
    Canonicalize,
    FoldTransposes,
    Pass,
    get_pass,
    parse_pipeline,
    registered_passes,
    run_pipeline,
)
from test_ir_text import random_graphs


def check_pass(pass_: Pass, before: str, expected: str, *, changed: bool = True) -> None:
    """Apply ``pass_`` to ``before``; compare with ``expected`` structurally and as text."""
    graph = parse_text(before)
    assert pass_.apply(graph) is changed
    assert graph == parse_text(expected)
    assert to_text(graph) == expected


# ----------------------------------------------------------------------------- canonicalize

DEAD_BEFORE = """\
graph g {
  %x = input "x" [4, 8] bfloat16 layout=row_major
  %unused = input "unused" [2, 2] bfloat16 layout=row_major
  %t0 = transpose %x : [8, 4] bfloat16
  %silu0 = elementwise silu %t0 : [8, 4] bfloat16
  %silu1 = elementwise silu %x : [4, 8] bfloat16
  %y = output "y" %silu1
}
"""
DEAD_EXPECTED = """\
graph g {
  %x = input "x" [4, 8] bfloat16 layout=row_major
  %unused = input "unused" [2, 2] bfloat16 layout=row_major
  %silu1 = elementwise silu %x : [4, 8] bfloat16
  %y = output "y" %silu1
}
"""


def test_canonicalize_removes_dead_nodes_but_keeps_inputs():
    check_pass(Canonicalize(), DEAD_BEFORE, DEAD_EXPECTED)


DOUBLE_BEFORE = """\
graph g {
  %x = input "x" [4, 8] float32 layout=row_major
  %t0 = transpose %x : [8, 4] float32
  %t1 = transpose %t0 : [4, 8] float32
  %t2 = transpose %t1 : [8, 4] float32
  %mm0 = matmul %t1, %t2 : [4, 4] float32
  %y = output "y" %mm0
  %z = output "z" %t1
}
"""
DOUBLE_EXPECTED = """\
graph g {
  %x = input "x" [4, 8] float32 layout=row_major
  %t2 = transpose %x : [8, 4] float32
  %mm0 = matmul %x, %t2 : [4, 4] float32
  %y = output "y" %mm0
  %z = output "z" %x
}
"""


def test_canonicalize_cancels_double_transposes_to_a_fixed_point():
    check_pass(Canonicalize(), DOUBLE_BEFORE, DOUBLE_EXPECTED)


def test_canonicalize_reports_no_change():
    check_pass(Canonicalize(), DEAD_EXPECTED, DEAD_EXPECTED, changed=False)
    check_pass(Canonicalize(), DOUBLE_EXPECTED, DOUBLE_EXPECTED, changed=False)


def test_canonicalize_option_is_checked():
    with pytest.raises(InputError, match="max_iterations must be a positive integer"):
        Canonicalize(max_iterations=0)
    with pytest.raises(IRError, match="did not reach a fixed point within 1 rounds"):
        Canonicalize(max_iterations=1).apply(parse_text(DEAD_BEFORE))


# ----------------------------------------------------------------------------- fold-transposes

FOLD_BEFORE = """\
graph g {
  %a_t = input "a_t" [512, 1024] bfloat16 layout=row_major
  %b = input "b" [512, 2048] bfloat16 layout=row_major
  %t0 = transpose %a_t : [1024, 512] bfloat16
  %mm0 = matmul %t0, %b : [1024, 2048] bfloat16
  %c = output "c" %mm0
}
"""
FOLD_EXPECTED = """\
graph g {
  %a_t = input "a_t" [1024, 512] bfloat16 layout=transposed
  %b = input "b" [512, 2048] bfloat16 layout=row_major
  %mm0 = matmul %a_t, %b : [1024, 2048] bfloat16
  %c = output "c" %mm0
}
"""


def test_fold_transposes_turns_transpose_of_input_into_layout():
    check_pass(FoldTransposes(), FOLD_BEFORE, FOLD_EXPECTED)


BACK_BEFORE = """\
graph g {
  %x = input "x" [4, 8] float32 layout=transposed
  %t0 = transpose %x : [8, 4] float32
  %t1 = transpose %x : [8, 4] float32
  %add0 = elementwise add %t0, %t1 : [8, 4] float32
  %y = output "y" %add0
}
"""
BACK_EXPECTED = """\
graph g {
  %x = input "x" [8, 4] float32 layout=row_major
  %add0 = elementwise add %x, %x : [8, 4] float32
  %y = output "y" %add0
}
"""


def test_fold_transposes_of_transposed_input_folds_back_to_row_major():
    check_pass(FoldTransposes(), BACK_BEFORE, BACK_EXPECTED)


MIXED = """\
graph g {
  %x = input "x" [4, 8] float32 layout=row_major
  %w = input "w" [8, 4] float32 layout=row_major
  %t0 = transpose %x : [8, 4] float32
  %add0 = elementwise add %t0, %w : [8, 4] float32
  %mm0 = matmul %x, %add0 : [4, 4] float32
  %y = output "y" %mm0
}
"""


def test_fold_transposes_leaves_inputs_read_both_ways_alone():
    check_pass(FoldTransposes(), MIXED, MIXED, changed=False)
    check_pass(FoldTransposes(), DEAD_EXPECTED, DEAD_EXPECTED, changed=False)


def test_fold_transposes_keeps_the_users_storage_shape():
    graph = parse_text(FOLD_BEFORE)
    before = {node.name: node.storage_shape for node in graph.inputs()}
    FoldTransposes().apply(graph)
    assert {node.name: node.storage_shape for node in graph.inputs()} == before


# ----------------------------------------------------------------------------- registry and specs


def test_registry_and_default_pipeline():
    assert {"canonicalize", "fold-transposes"} <= set(registered_passes())
    assert parse_pipeline(DEFAULT_PIPELINE) == [Canonicalize(), FoldTransposes(), Canonicalize()]
    assert get_pass("canonicalize", max_iterations=7) == Canonicalize(max_iterations=7)
    assert parse_pipeline("  ") == []


def test_passes_are_frozen_dataclasses_with_docs():
    for name, cls in registered_passes().items():
        assert cls.name == name and cls.__doc__
        assert dataclasses.is_dataclass(cls)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Canonicalize().max_iterations = 3  # type: ignore[misc]


def test_pipeline_options_are_typed():
    [pass_] = parse_pipeline("canonicalize{max_iterations=5}")
    assert pass_ == Canonicalize(max_iterations=5)
    assert pass_.spec() == "canonicalize{max_iterations=5}"
    assert Canonicalize().spec() == "canonicalize"


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (
            "canonicalize,tile",
            UnknownNameError,
            r"unknown pass 'tile'; known passes: canonicalize, fold-transposes, fuse, group-epilogues, "
            r"implicit-transpose, place",
        ),
        ("canonicalize,,fold-transposes", InputError, r"malformed pipeline item ''"),
        ("canonicalize{max_iterations=5", InputError, r"malformed pipeline item"),
        ("canonicalize{max_iterations=five}", InputError, r"max_iterations='five' is not a valid int"),
        ("canonicalize{depth=2}", InputError, r"bad option 'depth=2'.*it takes max_iterations \(int\)"),
        ("canonicalize{max_iterations}", InputError, r"expected key=value"),
        ("fold-transposes{x=1}", InputError, r"it takes no options"),
    ],
)
def test_bad_pipeline_specs(spec, error, message):
    with pytest.raises(error, match=message):
        parse_pipeline(spec)


def test_get_pass_rejects_unknown_options():
    with pytest.raises(InputError, match=r"no option\(s\) depth"):
        get_pass("canonicalize", depth=3)


# ----------------------------------------------------------------------------- driver


def test_run_pipeline_works_on_a_copy_and_records_steps():
    graph = parse_text(FOLD_BEFORE)
    seen: list[tuple[str, bool, str]] = []
    result = run_pipeline(graph, DEFAULT_PIPELINE, on_step=lambda n, c, g: seen.append((n, c, to_text(g))))
    assert to_text(graph) == FOLD_BEFORE  # untouched
    assert to_text(result.graph) == FOLD_EXPECTED
    assert [(step.pass_name, step.changed) for step in result.steps] == [
        ("canonicalize", False),
        ("fold-transposes", True),
        ("canonicalize", False),
    ]
    assert result.steps[0].text == FOLD_BEFORE and result.steps[1].text == FOLD_EXPECTED
    assert seen == [(step.pass_name, step.changed, step.text) for step in result.steps]
    assert result.changed


def test_run_pipeline_verifies_the_input_first():
    graph = gemm_graph(4, 4, 4)
    graph.nx_graph.nodes["mm0"]["dtype"] = "float32"
    with pytest.raises(IRError, match=r"input graph is invalid \(before any pass ran\).*%mm0"):
        run_pipeline(graph, [])


@dataclass(frozen=True)
class BreakShapes(Pass):
    """Test-only pass that records a wrong shape on every matmul (not registered)."""

    name: ClassVar[str] = "break-shapes"

    def apply(self, graph: Graph) -> bool:
        for node in graph.nodes():
            if node.kind == "matmul":
                graph.nx_graph.nodes[node.id]["shape"] = (1, 1)
        return True


def test_run_pipeline_names_the_pass_that_broke_the_ir():
    passes = [Canonicalize(), BreakShapes(), Canonicalize()]
    with pytest.raises(
        IRError, match=r"pass 'break-shapes' produced invalid IR: .*%mm0: matmul is recorded as"
    ):
        run_pipeline(gemm_graph(4, 4, 4), passes)
    with pytest.raises(
        IRError, match=r"the pipeline canonicalize, break-shapes, canonicalize produced invalid IR"
    ):
        run_pipeline(gemm_graph(4, 4, 4), passes, verify_each=False)


# ----------------------------------------------------------------------------- properties


@settings(max_examples=120, deadline=None)
@given(random_graphs(), st.integers(0, 2**32 - 1))
def test_default_pipeline_preserves_values(graph, seed):
    rng = np.random.default_rng(seed)
    inputs = {node.name: rng.standard_normal(node.storage_shape) for node in graph.inputs()}
    result = run_pipeline(graph, DEFAULT_PIPELINE)
    expected, got = evaluate(graph, inputs), evaluate(result.graph, inputs)
    assert list(got) == list(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, atol=0)
    # the result is canonical: running canonicalize again changes nothing
    assert Canonicalize().apply(result.graph.copy()) is False
    # and no input that is read only through transposes is left unfolded
    for node in result.graph.inputs():
        users = [result.graph.node(user) for user in result.graph.users(node.id)]
        assert not users or any(user.kind != "transpose" for user in users)

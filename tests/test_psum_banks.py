"""Issue 12 finding 1: PSUM accumulators wider than one bank are emitted as one-bank tiles."""

from __future__ import annotations

import pytest

from helpers import compile_gemm, compile_graph
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.kernel_ir.expr import as_expr, var
from neuronmm_compiler.kernel_ir.program import (
    Alloc,
    Buffer,
    Loop,
    Matmul,
    Point,
    Program,
    Ref,
    span,
)
from neuronmm_compiler.kernel_ir.psum_banks import bank_name, split_psum_banks
from neuronmm_compiler.verification import verify_source
from neuronmm_compiler.verification.static_check import check_kernel_source

#: The issue's example: four output tiles accumulate in PSUM across the K blocks.
BLOCK_FREE_K2 = {"tiles_in_block_k": 2, "loop_order": "mnk"}


@pytest.mark.parametrize(("dialect", "target"), [("neuronxcc", "trn1"), ("nki", "trn2")])
def test_gemm_accumulators_are_one_bank_tiles(dialect, target):
    compiled = compile_gemm(1024, 2048, 1024, schedule="aws-block-free", params=BLOCK_FREE_K2, dialect=dialect,
                            target=target)
    source = compiled.kernel.source
    assert "(128, 4, 512)" not in source and all(f"acc_psum__b{i} = " in source for i in range(4))
    assert [v.rule_id for v in check_kernel_source(source, dialect=dialect, target=target)] == []
    report = verify_source(source, filename="block-free")
    assert report.ok, report.error
    # the same instructions as the program the cost model counted, in the same PSUM banks
    assert report.counters["matmul_instructions"] == compiled.cost.matmul_instructions
    assert report.counters["psum_peak_banks"] == compiled.footprints[0].psum_banks == 4


def test_fused_strip_across_k_blocks_with_ragged_trips_is_unrolled():
    """h @ u_down keeps one bank per feature tile across the K blocks, in feature blocks whose last one is
    shorter (a trip count min(6, 10 - 6 * f_blk)): the feature-block loop is unrolled too."""
    workload = mlp_workload(128, 2048, 8192, rank=1280)
    params = {"tokens_per_block": 128, "k_tiles_per_block": 16, "weight_block_kib": 24}
    compiled = compile_graph(workload, target="trn1", dialect="neuronxcc", params=params)
    source = compiled.kernel.source
    assert "h_ud_psum__b5" in source and "(128, 6, 512)" not in source
    assert check_kernel_source(source, dialect="neuronxcc", target="trn1") == []
    report = verify_source(source, filename="mlp")
    assert report.ok, report.error


def _program(trip) -> Program:
    acc = Buffer("acc_psum", (128, 2, 512), "float32", "psum")
    lhs = Buffer("lhs", (128, 128), "bfloat16", "sbuf")
    rhs = Buffer("rhs", (128, 512), "bfloat16", "sbuf")
    matmul = Matmul(Ref(acc, (span(0, 128), Point(var("t")), span(0, 512))),
                    Ref(lhs, (span(0, 128), span(0, 128))), Ref(rhs, (span(0, 128), span(0, 512))))
    return Program("k", [], [], [Alloc(acc, accumulator=True), Loop("t", trip, [matmul])])


def test_split_names_each_bank_and_leaves_narrow_programs_alone():
    split = split_psum_banks(_program(as_expr(2)), 2048)
    allocs = [s.buffer for s in split.body if isinstance(s, Alloc)]
    assert [b.name for b in allocs] == [bank_name("acc_psum", 0), bank_name("acc_psum", 1)]
    assert all(b.shape == (128, 512) for b in allocs)
    assert [s.dst.buffer.name for s in split.body if isinstance(s, Matmul)] == ["acc_psum__b0", "acc_psum__b1"]
    narrow = _program(as_expr(2))
    assert split_psum_banks(narrow, 4096) is narrow


def test_a_tile_loop_without_a_constant_trip_is_a_lowering_bug():
    with pytest.raises(ValueError, match="no constant trip count"):
        split_psum_banks(_program(var("n")), 2048)

"""Issue 12 finding 1: PSUM accumulators wider than one bank are emitted as one-bank tiles: since issue 26 item 5 a
Python list of tiles indexed by the (rolled) loops, each tile allocated at the width its accesses use."""

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
from neuronmm_compiler.kernel_ir.psum_banks import split_psum_banks
from neuronmm_compiler.verification import verify_source
from neuronmm_compiler.verification.static_check import check_kernel_source

#: The issue's example: four output tiles accumulate in PSUM across the K blocks.
BLOCK_FREE_K2 = {"tiles_in_block_k": 2, "loop_order": "mnk"}


@pytest.mark.parametrize(("dialect", "target"), [("neuronxcc", "trn1"), ("nki", "trn2")])
def test_gemm_accumulators_are_one_bank_tiles(dialect, target):
    compiled = compile_gemm(1024, 2048, 1024, schedule="aws-block-free", params=BLOCK_FREE_K2, dialect=dialect,
                            target=target)
    source = compiled.kernel.source
    assert "(128, 4, 512)" not in source and "acc_psum = []" in source and "acc_psum[2 * bm + bn][" in source
    assert "__b" not in source  # no tile spelled out by name, no loop unrolled for it
    assert [v.rule_id for v in check_kernel_source(source, dialect=dialect, target=target)] == []
    report = verify_source(source, filename="block-free")
    assert report.ok, report.error
    # the same instructions as the program the cost model counted, in the same PSUM banks
    assert report.counters["matmul_instructions"] == compiled.cost.matmul_instructions
    assert report.counters["psum_peak_banks"] == compiled.footprints[0].psum_banks == 4


def test_fused_strip_across_k_blocks_with_ragged_trips_stays_rolled():
    """h @ u_down keeps one bank per feature tile across the K blocks, in feature blocks whose last one is
    shorter (a trip count min(6, 10 - 6 * f_blk)): the list is indexed by the feature-tile loop, which NKI 0.1
    must unroll at trace time (nl.static_range), and the loops reusing its variable's name elsewhere stay
    affine."""
    workload = mlp_workload(128, 2048, 8192, rank=1280)
    params = {"tokens_per_block": 128, "k_tiles_per_block": 16, "weight_block_kib": 24}
    compiled = compile_graph(workload, target="trn1", dialect="neuronxcc", params=params)
    source = compiled.kernel.source
    assert "h_ud_psum[ft][0:F_TILE, 0:T] +=" in source and "(128, 6, 512)" not in source
    assert "h_ud_psum.append(nl.zeros((F_TILE, T)," in source  # the width the matmuls use, not a bank
    assert "for ft in nl.static_range(min(6, 10 - 6 * f_blk)):" in source
    assert source.count("for ft in nl.affine_range(min(6, 10 - 6 * f_blk)):") == 2  # x_ug, x_uu: no list, rolled
    assert check_kernel_source(source, dialect="neuronxcc", target="trn1") == []
    report = verify_source(source, filename="mlp")
    assert report.ok, report.error
    assert report.counters["psum_peak_banks"] == compiled.footprints[0].psum_banks


def _program(trip, width: int = 512) -> Program:
    acc = Buffer("acc_psum", (128, 2, 512), "float32", "psum")
    lhs = Buffer("lhs", (128, 128), "bfloat16", "sbuf")
    rhs = Buffer("rhs", (128, 512), "bfloat16", "sbuf")
    matmul = Matmul(Ref(acc, (span(0, 128), Point(var("t")), span(0, width))),
                    Ref(lhs, (span(0, 128), span(0, 128))), Ref(rhs, (span(0, 128), span(0, width))))
    return Program("k", [], [], [Alloc(acc, accumulator=True), Loop("t", trip, [matmul])])


def test_split_makes_a_list_buffer_and_leaves_the_loop_and_narrow_programs_alone():
    split = split_psum_banks(_program(as_expr(2)), 2048)
    alloc, loop = split.body
    assert alloc.buffer == Buffer("acc_psum", (128, 512), "float32", "psum", entries=2)
    assert isinstance(loop, Loop) and loop.var == "t"
    (matmul,) = loop.body
    assert matmul.dst.entry == var("t") and matmul.dst.code() == "acc_psum[t][0:128, 0:512]"
    assert split.peaks(2048)[1] == _program(as_expr(2)).peaks(2048)[1] == 2
    narrow = _program(as_expr(2))
    assert split_psum_banks(narrow, 4096) is narrow


def test_tiles_are_allocated_at_the_width_used():
    split = split_psum_banks(_program(var("n"), width=128), 2048)
    assert split.body[0].buffer.shape == (128, 128)
    assert split.peaks(2048)[1] == 2  # each entry still starts on its own bank


def test_a_list_ref_needs_an_entry_and_a_tensor_ref_none():
    listed = Buffer("acc", (128, 512), "float32", "psum", entries=2)
    with pytest.raises(ValueError, match="entry"):
        Ref(listed, (span(0, 128), span(0, 512)))
    with pytest.raises(ValueError, match="entry"):
        Ref(Buffer("t", (128, 512), "float32", "psum"), (span(0, 128), span(0, 512)), entry=var("t"))

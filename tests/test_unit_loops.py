"""Loops that run once are folded into their bodies (kernel_ir/fold.py), for the kernel a user reads; the cost model
counts the same work."""

from __future__ import annotations

from dataclasses import replace

from helpers import compile_gemm, verified_nki
from neuronmm_compiler.cost_model import estimate
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.kernel_ir.expr import Lin, add, minimum, named, naming, scale, var
from neuronmm_compiler.kernel_ir.fold import fold_unit_loops
from neuronmm_compiler.kernel_ir.lnc import PROGRAM_ID, distribute
from neuronmm_compiler.kernel_ir.program import Alloc, Buffer, Comment, DmaCopy, Loop, Program, Ref, Span, walk
from neuronmm_compiler.lowerings.gemm import gemm_problem_from_graph
from neuronmm_compiler.lowerings.lower_gemm import _GemmLowering
from neuronmm_compiler.targets import get_target, with_lnc
from neuronmm_compiler.verification import verify_source


def _once(program: Program) -> list[Loop]:
    return [s for s, _ in walk(program.body) if isinstance(s, Loop) and s.trip == Lin(1)]


def test_a_loop_that_runs_once_becomes_its_body_with_the_variable_at_zero():
    tile = named(512, "TILE")
    a = Buffer("a", (256, 1000), "bfloat16", "hbm")
    t = Buffer("t", (128, 512), "bfloat16", "sbuf")
    start = add(scale(var("blk"), tile), scale(var(PROGRAM_ID), tile))
    size = minimum(Lin(tile), Lin(1000, (("blk", -512),)))
    rows = Span(Lin(0), Lin(128))
    load = DmaCopy(Ref(t, (rows, Span(Lin(0), size))), Ref(a, (rows, Span(start, size))))
    inner = Loop("kt", Lin(2), [load])
    program = Program("k", [a], [], [Loop("blk", Lin(1), [Alloc(t), inner], comment="2 programs: each its 1 of 2")])
    folded = fold_unit_loops(program)
    assert [type(s) for s in folded.body] == [Comment, Alloc, Loop]
    assert folded.body[0] == Comment("2 programs: each its 1 of 2")
    dst, src = folded.body[2].body[0].dst, folded.body[2].body[0].src
    with naming():
        assert src.index[1].code() == "TILE * pid:TILE * pid + TILE"  # the named size still prints by its name
    assert dst.index[1].size == Lin(tile) and src.index[1].size == Lin(tile)  # min(TILE, 1000) is TILE
    assert fold_unit_loops(folded) is folded  # nothing left to fold: the same program


def test_a_divided_gemm_costs_the_same_folded_and_verifies():
    """700x1500x300 on a logical core of two: each program's one N block was a `for n_blk in range(1)` loop."""
    target = with_lnc(get_target("trn2"), 2)
    compiled = compile_gemm(700, 1500, 300, target=target, dialect="nki",
                            params={"tiles_in_block_m": 2, "psum_buffers": 2})
    problem, schedule = gemm_problem_from_graph(compiled.workload.graph()), compiled.schedule
    unfolded = distribute(_GemmLowering(problem, schedule, target).program(), schedule.lnc_split, target.lnc)
    assert _once(unfolded) and not _once(compiled.program)
    assert fold_unit_loops(unfolded).body == compiled.program.body
    before, after = estimate(unfolded, target), estimate(compiled.program, target)
    assert after.latency_us == before.latency_us and after.dma_transfers == before.dma_transfers
    assert "range(1)" not in compiled.kernel.source and "n_blk" not in compiled.kernel.source
    report = verify_source(compiled.kernel.source, filename="gemm 700x1500x300")
    assert report.ok, report.error
    assert report.counters["sbuf_peak_bytes"] == after.sbuf_bytes_per_partition


def test_a_kernel_wrapped_in_a_loop_that_runs_once_costs_what_it_did():
    """Every statement of a fused LNC=2 kernel inside one more loop of one iteration: the prologue and epilogue edges,
    the counts and the footprint are the kernel's own, and folding gives the kernel back."""
    compiled, _ = verified_nki(mlp_workload(8, 512, 1792, dense=True), target=with_lnc(get_target("trn2"), 2),
                               lnc_split="gather", weight_block_kib=4, k_tiles_per_block=0, weight_dma="row")
    program = compiled.program
    wrapped = replace(program, body=[Loop("w", Lin(1), list(program.body))])
    target = compiled.target
    before, after = estimate(wrapped, target), estimate(program, target)
    assert (before.latency_us, before.sbuf_bytes_per_partition) == (after.latency_us, after.sbuf_bytes_per_partition)
    assert fold_unit_loops(wrapped).body == program.body
    assert "range(1)" not in compiled.kernel.source

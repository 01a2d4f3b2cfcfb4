"""weight_dma=block: the slabs of a weight block loaded in one DMA through an access pattern (kernel_ir/coalesce.py)."""

from __future__ import annotations

import pytest

from helpers import compile_graph, verified_nki
from neuronmm_compiler.errors import ScheduleError
from neuronmm_compiler.frontends.workloads import chain_workload, mlp_workload
from neuronmm_compiler.kernel_ir.coalesce import coalesce_slab_loads
from neuronmm_compiler.kernel_ir.dims import iv
from neuronmm_compiler.kernel_ir.expr import Lin, add, minimum, scale, var
from neuronmm_compiler.kernel_ir.program import Buffer, DmaCopy, Loop, Point, Program, Ref, span, walk
from neuronmm_compiler.lowerings import lowering_for
from neuronmm_compiler.lowerings.nkilib_tkg import tkg_program
from neuronmm_compiler.schedule.fused import FusedSchedule
from neuronmm_compiler.targets import get_target, with_lnc

TRN2 = get_target("trn2")



@pytest.mark.parametrize("workload", [mlp_workload(3, 512, 1024, rank=384), mlp_workload(130, 512, 640, dense=True),
                                      chain_workload(77, 700, 512, rank=256)], ids=str)
@pytest.mark.parametrize("lnc", [1, 2])
def test_block_loads_move_the_same_bytes_in_fewer_dmas(workload, lnc):
    """The same kernel as weight_dma=row, its slab loops replaced by one DMA each: the same HBM bytes per tensor, the
    same result (both verify), fewer transfers, and the model's counts equal the interpreter's (_verified)."""
    target = with_lnc(TRN2, lnc)
    params = {"weight_block_kib": 16, "k_tiles_per_block": 0, **({"lnc_split": "hidden"} if lnc == 2 else {})}
    row, row_report = verified_nki(workload, target, weight_dma="row", **params)
    block, block_report = verified_nki(workload, target, weight_dma="block", **params)
    assert block_report.counters["hbm_bytes_read"] == row_report.counters["hbm_bytes_read"]
    assert block.cost.dma_transfers < row.cost.dma_transfers
    assert ".ap(pattern=[[" in block.kernel.source and ".ap(pattern=[[" not in row.kernel.source
    # not always faster: the first matmul of a block waits for all of its slabs (a longer prologue), so the search
    # weighs the fixed costs saved against it


def test_a_block_load_reads_rows_kt_times_p_plus_p():
    """The access pattern of one block: u's rows 128 * kt + p (kt = slot, p = partition), the block's columns."""
    compiled, _ = verified_nki(mlp_workload(1, 512, 1024, rank=384), weight_dma="block", weight_block_kib=16)
    source = compiled.kernel.source
    # U_gate [512, 384]: 4 slabs of 128 rows, all 384 columns, in one DMA
    assert "src=u_gate.ap(pattern=[[384, P], [49152, 4], [1, X_UG_BLOCK]], offset=0)" in source


def test_block_loads_need_the_nki_dialect():
    workload = mlp_workload(8, 512, 1024, rank=256)
    with pytest.raises(ScheduleError, match=r"weight_dma=block .* nki dialect"):
        compile_graph(workload, target=get_target("trn1"), dialect="neuronxcc", params={"weight_dma": "block"})


def test_the_search_costs_block_beside_each_row_schedule_in_the_nki_dialect_only():
    """block is not sampled (as a third value it left TPE in worse basins at 512 tokens): the evaluator costs it
    beside every row schedule and returns the faster; in the neuronxcc dialect it is never costed."""
    workload = mlp_workload(1, 4096, 1792, keep_ratio=0.9)
    target = with_lnc(TRN2, 2)
    row = FusedSchedule(tokens_per_block=1, token_tile=1, weight_block_kib=128, out_tile=256, x_transpose="pe",
                        lnc_split="hidden")
    spec, evaluate = lowering_for(workload).search_setup(workload, target, 1000, exchange=True)
    assert spec.space.candidates["weight_dma"] == ("row", "tile")
    best = evaluate(row)
    costed = {c.schedule.weight_dma: c.latency_us for c in evaluate.memo.values()}
    assert best.schedule.weight_dma == "block" and best.latency_us == costed["block"] < costed["row"]
    assert evaluate.raw[best.schedule].weight_dma == "row"  # the polish moves from the sampled point
    again = evaluate.fresh()  # what a stored study's catch-up starts from: costs the same way, remembers nothing
    assert not again.memo and again(row).schedule.weight_dma == "block"
    _, evaluate = lowering_for(workload).search_setup(workload, target, 1000, exchange=False)
    assert evaluate(row).schedule.weight_dma == "row" and len(evaluate.memo) == 1


def _slab_loop(trip, rows=128, slot_coef=1, row_coef=128, extra=()):
    w = Buffer("w", (1024, 256), "bfloat16", "hbm")
    buf = Buffer("w_block", (128, 8, 256), "bfloat16", "sbuf")
    kt = var("kt")
    load = DmaCopy(Ref(buf, (span(0, 128), Point(scale(kt, slot_coef)), span(0, 256))),
                   Ref(w, (span(add(64, scale(kt, row_coef)), rows), span(0, 256))))
    return Loop("kt", trip, [load, *extra]), w, buf


def test_coalesce_rewrites_only_loops_of_slab_loads():
    loop, w, _ = _slab_loop(Lin(4))
    (merged,) = coalesce_slab_loads(Program("k", [w], [], [loop])).body
    assert isinstance(merged, DmaCopy) and merged.slabs
    assert merged.src.code() == "w[64:576, 0:256]" and merged.dst.code() == "w_block[0:128, 0:4, 0:256]"
    kept = [_slab_loop(Lin(4), rows=64)[0],  # a partial slab: rows and partitions differ from the stride
            _slab_loop(Lin(4), slot_coef=2)[0],  # every other slot
            _slab_loop(Lin(4), row_coef=256)[0],  # every other slab of rows
            _slab_loop(iv("n", 4))[0]]  # a trip that is not a constant
    for original in kept:
        (same,) = coalesce_slab_loads(Program("k", [w], [], [original])).body
        assert same == original


def test_a_blocked_contractions_ragged_last_block_is_one_dma_too():
    """A contraction of 11 tiles in blocks of 4 loads 4, 4 and 3 slabs: each block in one DMA, its pattern count the
    block's min(), the same bytes as slab by slab, the model's counts the interpreter's (_verified)."""
    loop, w, _ = _slab_loop(minimum(4, Lin(11, (("k_blk", -4),))))
    (merged,) = coalesce_slab_loads(Program("k", [w], [], [loop])).body
    assert isinstance(merged, DmaCopy) and merged.slabs
    assert merged.dst.code() == "w_block[0:128, 0:min(4, 11 - 4 * k_blk), 0:256]"
    assert merged.src.code() == "w[64:min(576, 1472 - 512 * k_blk), 0:256]"  # rows 64 .. 64 + 128 * slabs
    by_program, _, _ = _slab_loop(minimum(4, Lin(11, (("pid", -4),))))  # a count of the launch: kept slab by slab
    assert coalesce_slab_loads(Program("k", [w], [], [by_program])).body == [by_program]
    workload = mlp_workload(8, 512, 1408, rank=384)  # down's U: 1408 rows = 11 tiles
    params = {"weight_block_kib": 16, "k_tiles_per_block": 4}
    row, row_report = verified_nki(workload, weight_dma="row", **params)
    block, block_report = verified_nki(workload, weight_dma="block", **params)
    assert "min(4, 11 - 4 * k_blk)], [1, " in block.kernel.source
    assert block_report.counters["hbm_bytes_read"] == row_report.counters["hbm_bytes_read"]
    assert block.cost.dma_transfers < row.cost.dma_transfers


def test_nkilib_decode_loads_a_gate_up_tile_per_dma():
    """nki-library's decode MLP loads each gate/up weight tile [2048, I] in one dma_copy (mlp_tkg_gate_up_projection
    .py:163-181); its model does too, and its down projection keeps one DMA per 128 rows."""
    program = tkg_program(1, 4096, 1792, with_lnc(TRN2, 2))
    loads = [s for s, _ in walk(program.body) if isinstance(s, DmaCopy) and s.is_load]
    slabs = [s for s in loads if s.slabs]
    assert {s.src.buffer.name for s in slabs} == {"w_gate", "w_up"}
    assert not any(s.slabs for s in loads if s.src.buffer.name == "w_down")

"""Explicit buffer copies: rotating PSUM accumulators (``psum_buffers``) and operand blocks
(``operand_buffers``): the rotation slot expression, the schedule's normalization, emission in both dialects
checked by the interpreter, and the cost model's stall term."""

from __future__ import annotations

import itertools

import pytest

from conftest import compile_and_verify
from helpers import compile_gemm
from neuronmm_compiler.cost_model import estimate
from neuronmm_compiler.cost_model.counts import count_program, psum_stall_us
from neuronmm_compiler.cost_model.params import params_of
from neuronmm_compiler.errors import ScheduleError
from neuronmm_compiler.kernel_ir.expr import Lin, Mod, add, minimum, modulo, scale, var
from neuronmm_compiler.schedule.gemm import GemmProblem, GemmSchedule, normalize
from neuronmm_compiler.targets import get_target


def test_modulo_evaluates_substitutes_and_folds():
    slot = modulo(add(scale(var("bn"), 4), var("bm")), 2)
    assert isinstance(slot, Mod) and slot.variables() == {"bn", "bm"}
    assert [slot.evaluate({"bn": bn, "bm": bm}) for bn in range(2) for bm in range(4)] == [0, 1, 0, 1] * 2
    assert slot.substitute({"bn": 1, "bm": 3}) == Lin(1)  # bound everywhere: a constant
    assert slot.substitute({"bn": 1}) == Mod(add(var("bm"), 4), 2)
    assert modulo(7, 3) == Lin(1) and modulo(var("x"), 1) == Lin(0)
    assert slot.code() == "(4 * bn + bm) % 2" and modulo(var("m_blk"), 3).code() == "m_blk % 3"
    for arithmetic in (lambda: add(slot, 1), lambda: scale(slot, 2), lambda: minimum(slot, 3)):
        with pytest.raises(ValueError, match="rotation slot"):
            arithmetic()


@pytest.mark.parametrize(("params", "expected"), [
    ({"psum_buffers": 3, "tiles_in_block_m": 2, "accumulate": "sbuf"}, 2),  # clipped to the block's 2 tiles
    ({"psum_buffers": 2, "tiles_in_block_m": 1, "accumulate": "sbuf"}, 1),  # one tile: one copy is all it uses
    ({"psum_buffers": 2, "accumulate": "psum", "tiles_in_block_k": 1, "tiles_in_block_m": 2}, 0),  # held across K
    ({"psum_buffers": 2, "accumulate": "psum", "tiles_in_block_k": 8, "tiles_in_block_m": 2}, 2),  # one K block
    ({"psum_buffers": 2, "accumulate": "sbuf", "tiles_in_block_k": 1, "tiles_in_block_m": 2}, 2),
])
def test_normalize_clips_psum_buffers(params, expected):
    problem = GemmProblem(256, 1024, 512)  # 2 x 2 x 4 tiles
    assert normalize(problem, GemmSchedule(**params)).psum_buffers == expected


def test_psum_buffers_domain_is_the_bank_count():
    with pytest.raises(ScheduleError, match=r"psum_buffers=9 is outside 0\.\.8"):
        compile_gemm(256, 1024, 512, schedule="aws-tiled", params={"psum_buffers": 9})


CASES = [  # (shape, preset, params): ragged and exact shapes, both tile orders, both accumulations, pe and dma A^T
    ((300, 1100, 700), "aws-tiled", {"tiles_in_block_m": 2, "tiles_in_block_n": 2, "tiles_in_block_k": 8,
                                     "accumulate": "psum"}),
    ((300, 1100, 700), "aws-tiled", {"tiles_in_block_m": 3, "tiles_in_block_n": 2, "tiles_in_block_k": 2,
                                     "accumulate": "sbuf", "tile_order": "nm"}),
    ((1000, 1500, 300), "aws-hoist-load", {"tiles_in_block_n": 3, "a_transpose": "pe"}),
    ((512, 2048, 512), "aws-fully-optimized", {"tiles_in_block_m": 4, "tiles_in_block_n": 1}),
    ((130, 600, 260), "aws-block-free", {"dma": "tile", "tiles_in_block_k": 3}),
]


@pytest.mark.parametrize(("case", "buffers", "dialect"),
                         list(itertools.product(range(len(CASES)), (1, 2, 3), ("nki", "neuronxcc"))))
def test_rotating_psum_verifies_in_both_dialects(case, buffers, dialect):
    """Every rotated kernel computes the product: each tile's first matmul starts the sums in its copy
    (``accumulate=False`` / ``=``), so a copy an earlier tile used adds nothing; the interpreter's counts equal
    the model's, and its PSUM peak equals the footprint."""
    shape, preset, params = CASES[case]
    target = "trn2" if dialect == "nki" else "trn1"
    compiled, report = compile_and_verify(*shape, schedule=preset, params={**params, "psum_buffers": buffers},
                                          dialect=dialect, target=target, seed=case)
    source, schedule = compiled.kernel.source, compiled.schedule
    starts = source.count("accumulate=False") if dialect == "nki" else source.count("] = nisa.nc_matmul(")
    assert (starts > 0) == (schedule.psum_buffers > 0)
    assert report.counters["psum_peak_banks"] == compiled.footprints[0].psum_banks
    assert report.counters["matmul_instructions"] == compiled.cost.matmul_instructions
    if schedule.psum_buffers > 1:
        # a list of one-bank copies, the slot picked by a loop NKI 0.1 unrolls at trace time
        assert "c_psum = []" in source and "c_psum[" in source
        assert dialect != "neuronxcc" or "nl.static_range" in source


def test_rotation_changes_only_the_accumulators():
    """Same loads, matmuls and stores as the default kernel; the PSUM footprint is the copies."""
    base = compile_gemm(512, 2048, 512, schedule="aws-fully-optimized", params={"tiles_in_block_n": 4})
    rotated = compile_gemm(512, 2048, 512, schedule="aws-fully-optimized",
                           params={"tiles_in_block_n": 4, "psum_buffers": 3})
    for field in ("hbm_bytes_read", "hbm_bytes_written", "dma_transfers", "matmul_instructions", "psum_evictions"):
        assert getattr(rotated.cost, field) == getattr(base.cost, field), field
    assert base.footprints[0].psum_banks == 1 and rotated.footprints[0].psum_banks == 3


NKIGYM = {"tiles_in_block_m": 16, "tiles_in_block_n": 4, "tiles_in_block_k": 16, "dma": "row"}


def _costed(buffers: int):
    return compile_gemm(2048, 2048, 2048, a_layout="km", target="trn2", schedule="aws-tiled",
                        params={**NKIGYM, "psum_buffers": buffers})


def test_one_explicit_copy_stalls_the_tensor_engine():
    """nki-autotune's single-bank kernel (one PSUM buffer hoisted above the M loop) measured 0.366 ms and the same
    kernel with two rotating copies 0.262 ms: with one copy the next tile's matmuls wait for the eviction."""
    target = get_target("trn2")
    fresh, single, double = _costed(0), _costed(1), _costed(2)
    program = single.programs[0]
    counts = count_program(program, params_of(target))
    use = counts.psum["c_psum"]
    assert (use.copies, use.allocations, use.evictions) == (1, 1, 64)
    pe_us, vec_us = use.pe_cycles / (1000 * single.cost.values["f_pe"]), use.vector_cycles / (1000 * 0.96)
    expected = (use.evictions - use.allocations) * min(pe_us, vec_us) / use.evictions
    assert single.cost.values["T_stall"] == pytest.approx(expected)
    assert psum_stall_us(counts, single.cost.values["f_pe"], 0.96, 1.2) == pytest.approx(expected)
    assert expected > 0.1 * single.cost.values["T_pe"]
    assert single.cost.latency_us == pytest.approx(double.cost.latency_us + expected)
    # a fresh tile per output tile (the compiler rotates it) and two explicit copies do not stall
    assert fresh.cost.values["T_stall"] == double.cost.values["T_stall"] == 0.0
    assert fresh.cost.latency_us == pytest.approx(double.cost.latency_us)


def test_stall_is_in_the_explained_formula():
    from neuronmm_compiler.cost_model.formulas import latency, steady_times, symbolic

    single = _costed(1).cost
    terms, total, _ = symbolic()
    assert "T_stall" in terms and "T_stall" in str(total)
    assert latency(steady_times(single.values)) == pytest.approx(single.latency_us)
    assert estimate(_costed(1).programs[0], get_target("trn2")).latency_us == pytest.approx(single.latency_us)


# ----------------------------------------------------------------------------- operand blocks

OPERAND_CASES = [  # (shape, preset, params, layout): every operand loaded inside a loop of several trips
    ((700, 1500, 1300), "aws-fully-optimized", {"tiles_in_block_m": 2, "tiles_in_block_n": 1, "tiles_in_block_k": 4},
     "km"),
    ((700, 1500, 1300), "aws-tiled", {"tiles_in_block_m": 2, "tiles_in_block_k": 4, "loop_order": "mkn",
                                      "a_transpose": "pe"}, "mk"),
    ((300, 2100, 600), "aws-block-free", {"tiles_in_block_k": 2, "loop_order": "knm", "dma": "tile",
                                          "accumulate": "sbuf"}, "mk"),
    ((512, 1024, 1024), "aws-hoist-load", {"tiles_in_block_k": 2, "accumulate": "sbuf"}, "km"),
]


@pytest.mark.parametrize(("case", "copies", "dialect"),
                         list(itertools.product(range(len(OPERAND_CASES)), (2, 3), ("nki", "neuronxcc"))))
def test_rotating_operand_blocks_verify_in_both_dialects(case, copies, dialect):
    """Blocks loaded into explicit copies compute the product; the loads, matmuls and stores are the default
    kernel's; the footprint holds the copies (the interpreter measures the same peak)."""
    shape, preset, params, layout = OPERAND_CASES[case]
    target = "trn2" if dialect == "nki" else "trn1"
    options = {"schedule": preset, "dialect": dialect, "target": target, "a_layout": layout}
    base = compile_gemm(*shape, params=params, **options)
    rotated, report = compile_and_verify(*shape, params={**params, "operand_buffers": copies}, seed=case, **options)
    assert rotated.schedule.operand_buffers >= 2
    assert " % " in rotated.kernel.source
    if dialect == "neuronxcc":  # a loop that picks a copy is unrolled at trace time
        assert "nl.static_range" in rotated.kernel.source
    for field in ("hbm_bytes_read", "hbm_bytes_written", "dma_transfers", "matmul_instructions", "latency_us"):
        assert getattr(rotated.cost, field) == getattr(base.cost, field), field
    assert rotated.footprints[0].sbuf_bytes_per_partition > base.footprints[0].sbuf_bytes_per_partition
    assert report.counters["sbuf_peak_bytes"] == rotated.footprints[0].sbuf_bytes_per_partition


@pytest.mark.parametrize(("params", "expected"), [
    ({"operand_buffers": 3, "loop_order": "mnk", "tiles_in_block_m": 1}, 3),  # A loaded per (m, k): 2 x 4 trips
    ({"operand_buffers": 8, "loop_order": "kmn", "tiles_in_block_k": 4, "tiles_in_block_m": 2,
      "tiles_in_block_n": 2}, 0),  # both blocks loaded in loops of 1 trip: nothing to rotate
    ({"operand_buffers": 8, "loop_order": "mnk", "tiles_in_block_k": 1}, 4),  # loaded in the k loop: 4 trips
])
def test_normalize_clips_operand_buffers(params, expected):
    problem = GemmProblem(256, 1024, 512)  # 2 x 2 x 4 tiles
    assert normalize(problem, GemmSchedule(**params)).operand_buffers == expected


def test_one_operand_copy_is_refused():
    with pytest.raises(ScheduleError, match="operand_buffers=1 would make every block load wait"):
        compile_gemm(256, 1024, 512, schedule="aws-tiled", params={"operand_buffers": 1})

"""Schedule space, presets and lowering, checked on the loop-nest program (no interpreter)."""

from __future__ import annotations

import itertools
import math

import pytest

from neuronmm_compiler.errors import InputError, ScheduleError, UnknownNameError
from neuronmm_compiler.kernel_ir.expr import Lin, Min, add, minimum, scale, sub, var
from neuronmm_compiler.kernel_ir.program import DmaCopy, Loop, Matmul, TensorTensor, instruction_counts, walk
from neuronmm_compiler.lowerings.lower_gemm import lower_gemm
from neuronmm_compiler.schedule import GemmProblem, GemmSchedule, normalize, preset
from neuronmm_compiler.schedule.gemm import LOOP_ORDERS
from neuronmm_compiler.schedule.params import check_schedule
from neuronmm_compiler.targets import get_target

TRN1 = get_target("trn1")


def test_expr_folds_and_prints():
    m = var("m_blk")
    assert add(scale(m, 256), 128).code() == "256 * m_blk + 128"
    assert sub(300, scale(var("bk"), 128)).code() == "300 - 128 * bk"
    assert minimum(128, 300).code() == "128"
    assert minimum(add(m, 3), add(m, 1)) == add(m, 1)
    ragged = minimum(128, sub(300, scale(var("bk"), 128)))
    assert isinstance(ragged, Min) and ragged.code() == "min(128, 300 - 128 * bk)"
    assert add(ragged, 5).code() == "min(133, 305 - 128 * bk)"
    assert ragged.evaluate({"bk": 2}) == 44
    assert Lin(0).code() == "0"


def _enumerate(body, env, mult=1):
    """Reference for instruction_counts: every iteration, one by one."""
    for stmt in body:
        if isinstance(stmt, Loop):
            for i in range(stmt.trip.evaluate(env)):
                yield from _enumerate(stmt.body, {**env, stmt.var: i})
        else:
            yield stmt, env, 1


def _totals(pairs):
    out: dict[str, int] = {}
    for stmt, env, mult in pairs:
        key = type(stmt).__name__
        if isinstance(stmt, DmaCopy):
            key += "-load" if stmt.is_load else "-store"
            size = 1
            for extent in stmt.src.shape:
                size *= extent.evaluate(env)
            out[key + "-elems"] = out.get(key + "-elems", 0) + mult * size
        out[key] = out.get(key, 0) + mult
    return out


SHAPES = [(1, 512, 128), (200, 700, 300), (300, 1100, 700), (256, 1024, 2048)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["aws-tiled", "aws-hoist-load", "aws-block-free", "aws-fully-optimized"])
@pytest.mark.parametrize("layout", ["mk", "km"])
def test_closed_form_counts_equal_enumeration(shape, name, layout):
    problem = GemmProblem(*shape, a_layout=layout)
    program = lower_gemm(problem, preset(name, problem), TRN1)
    assert _totals(instruction_counts(program.body)) == _totals(_enumerate(program.body, {}))


def _count(program, predicate):
    return sum(mult for stmt, _, mult in instruction_counts(program.body) if predicate(stmt))


def _loads(program, tensor):
    return _count(program, lambda s: isinstance(s, DmaCopy) and s.is_load and s.src.buffer.name == tensor)


@pytest.mark.parametrize("shape", [(512, 1024, 512), (1024, 2048, 1024), (4096, 2048, 4096)])
def test_presets_are_structurally_faithful(shape):
    """Loads per iteration as in AWS's tutorial kernels (A given transposed, as the tutorial does)."""
    m, n, k = shape
    problem = GemmProblem(m, n, k, a_layout="km")
    tiles_m, tiles_n, tiles_k = m // 128, n // 512, k // 128
    matmuls = tiles_m * tiles_n * tiles_k

    tiled = lower_gemm(problem, preset("aws-tiled", problem), TRN1)
    assert _loads(tiled, "a_t") == matmuls and _loads(tiled, "b") == matmuls  # two loads per matmul
    hoist = lower_gemm(problem, preset("aws-hoist-load", problem), TRN1)
    assert _loads(hoist, "a_t") == tiles_m * tiles_k  # A^T strip once per m tile
    assert _loads(hoist, "b") == tiles_m * tiles_n * tiles_k  # B strip per (m, n)
    block = lower_gemm(problem, preset("aws-block-free", problem), TRN1)
    assert _loads(block, "a_t") == tiles_m * tiles_k
    assert _loads(block, "b") == (tiles_m // 2) * tiles_n * tiles_k  # B strip per (m block, n tile)
    full = lower_gemm(problem, preset("aws-fully-optimized", problem), TRN1)
    blocks_m, blocks_n = math.ceil(tiles_m / 16), math.ceil(tiles_n / 2)
    assert _loads(full, "b") == blocks_n * tiles_k  # one DMA per K tile row of a B block
    assert _loads(full, "a_t") == blocks_n * blocks_m * tiles_k  # one DMA per K tile row of an A block
    assert _count(full, lambda s: isinstance(s, TensorTensor)) == matmuls // min(8, tiles_k)
    assert _count(full, lambda s: isinstance(s, DmaCopy) and not s.is_load) == blocks_n * tiles_m
    for program in (tiled, hoist, block, full):
        assert _count(program, lambda s: isinstance(s, Matmul)) == matmuls
    # The fully optimized kernel's K-block loop is the sequential one.
    loops = {s.var: s for s, _ in walk(full.body) if isinstance(s, Loop)}
    if "k_blk" in loops:
        assert loops["k_blk"].sequential


def test_fully_optimized_loop_nest_order():
    problem = GemmProblem(4096, 2048, 2048, a_layout="km")
    program = lower_gemm(problem, preset("aws-fully-optimized", problem), TRN1)
    enclosing = {s.var: tuple(loop.var for loop in loops) for s, loops in walk(program.body) if isinstance(s, Loop)}
    assert enclosing["m_blk"] == ("n_blk", "k_blk")


def test_decode_shape_is_not_padded():
    problem = GemmProblem(1, 4096, 4096)
    sched = preset("aws-fully-optimized", problem)
    assert sched.tile_m == 1 and sched.tiles_in_block_m == 1
    program = lower_gemm(problem, sched, TRN1)
    elems = sum(
        mult * math.prod(e.evaluate(env) for e in stmt.src.shape)
        for stmt, env, mult in instruction_counts(program.body)
        if isinstance(stmt, DmaCopy) and stmt.is_load and stmt.src.buffer.name == "a"
    )
    assert elems == 1 * 4096 * math.ceil(4096 / 1024)  # A re-read once per N block, never padded


@pytest.mark.parametrize("order", LOOP_ORDERS)
@pytest.mark.parametrize("accumulate", ["psum", "sbuf"])
def test_every_loop_order_lowers_with_exact_counts(order, accumulate):
    problem = GemmProblem(300, 1100, 700)
    sched = GemmSchedule(tiles_in_block_m=2, tiles_in_block_n=1, tiles_in_block_k=2, loop_order=order,
                         accumulate=accumulate)
    program = lower_gemm(problem, sched, TRN1)
    totals = _totals(instruction_counts(program.body))
    assert totals == _totals(_enumerate(program.body, {}))
    assert totals["Matmul"] == 3 * 3 * 6
    assert totals["DmaCopy-store-elems"] == 300 * 1100


def test_normalize_clips_to_problem():
    problem = GemmProblem(100, 300, 50)
    s = normalize(problem, GemmSchedule(tiles_in_block_m=16, tiles_in_block_n=4, tiles_in_block_k=8))
    assert (s.tile_m, s.tile_n, s.tile_k) == (100, 300, 50)
    assert (s.tiles_in_block_m, s.tiles_in_block_n, s.tiles_in_block_k) == (1, 1, 1)


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"tile_m": 256}, ScheduleError),
        ({"tile_n": 1024}, ScheduleError),
        ({"tile_k": 0}, ScheduleError),
        ({"tiles_in_block_m": 0}, ScheduleError),
    ],
)
def test_check_ranges_rejects_limits(params, error):
    with pytest.raises(error):
        check_schedule(GemmSchedule().with_params(params), get_target("trn1"))


@pytest.mark.parametrize(
    ("params", "error", "fragment"),
    [
        ({"bogus": 1}, UnknownNameError, "parameters:"),
        ({"loop_order": "mmk"}, InputError, "must be one of"),
        ({"tile_m": "big"}, InputError, "integer"),
    ],
)
def test_with_params_rejects_bad_values(params, error, fragment):
    with pytest.raises(error, match=fragment):
        GemmSchedule().with_params(params)


def test_unknown_preset_lists_presets():
    with pytest.raises(UnknownNameError, match="aws-tiled"):
        preset("fastest", GemmProblem(128, 512, 128))


@pytest.mark.parametrize("bad", [(0, 1, 1), (1, -2, 1), (1, 1, 1.5)])
def test_problem_rejects_bad_dims(bad):
    with pytest.raises(InputError):
        GemmProblem(*bad)


def test_all_parameter_combinations_lower():
    """Smoke over the categorical space on a ragged shape: every point lowers."""
    problem = GemmProblem(130, 600, 260)
    for order, tile_order, acc, dma, a_t in itertools.product(
        LOOP_ORDERS, ("mn", "nm"), ("psum", "sbuf"), ("tile", "row"), ("dma", "pe")
    ):
        sched = GemmSchedule(tiles_in_block_m=2, tiles_in_block_n=2, tiles_in_block_k=2, loop_order=order,
                             tile_order=tile_order, accumulate=acc, dma=dma, a_transpose=a_t)
        program = lower_gemm(problem, sched, TRN1)
        assert _count(program, lambda s: isinstance(s, Matmul)) == 2 * 2 * 3

"""PE column tiles (nc_matmul tile_position / tile_size): the ``column_tiles`` schedule knob of decode GEMMs and fused
kernels' row-major matmuls, what it emits in both dialects, the interpreter's and the rule book's checks of it
(NKI-MATMUL-TILE, NKI-MATMUL-TILE-DST), its cost (a tile's share of the PE array) and where the search samples it."""

from __future__ import annotations

import pytest

from helpers import compile_gemm, compile_graph
from neuronmm_compiler.cost_model import count_program
from neuronmm_compiler.cost_model.params import params_of
from neuronmm_compiler.errors import ScheduleError
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings.fused import fused_space
from neuronmm_compiler.lowerings.gemm import gemm_space
from neuronmm_compiler.schedule import GemmProblem, GemmSchedule
from neuronmm_compiler.schedule.params import column_tile_candidates
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source

TRN1, TRN2 = get_target("trn1"), get_target("trn2")
#: a decode GEMM whose K (8 tiles) lies in one block accumulated in PSUM: the column-tiled path
DECODE = dict(m=8, n=1024, k=1000, a_layout="km", schedule="aws-hoist-load")


def _gemm(columns: int, target=TRN2, dialect="nki"):
    m, n, k = DECODE["m"], DECODE["n"], DECODE["k"]
    return compile_gemm(m, n, k, a_layout=DECODE["a_layout"], target=target, dialect=dialect,
                        preset=DECODE["schedule"], params={"column_tiles": columns})


def _pe_us(compiled) -> float:
    return compiled.cost.engine_us["tensor"]


@pytest.mark.parametrize(("target", "dialect", "columns", "width"),
                         [(TRN2, "nki", 4, 32), (TRN2, "neuronxcc", 2, 64), (TRN1, "neuronxcc", 2, 64)],
                         ids=["trn2-nki-4", "trn2-neuronxcc-2", "trn1-neuronxcc-2"])
def test_a_decode_gemm_runs_in_column_tiles_and_verifies(target, dialect, columns, width):
    plain, tiled = _gemm(1, target, dialect), _gemm(columns, target, dialect)
    source = tiled.kernel.source
    assert f"tile_position=(0, {width} * ct), tile_size=(P, {width})" in source and "    P = 128" in source
    assert "tile_position" not in plain.kernel.source
    report = verify_source(source, target=target, rules=True)
    assert report.ok, report.error or report.violations
    # the model counts what the interpreter ran: every matmul in a column tile
    counts = count_program(tiled.programs[0], params_of(target), {"pid": 0}, pe_columns=target.gemm_stationary_fmax)
    assert report.counters["matmul_instructions"] == tiled.cost.matmul_instructions
    assert report.counters["pe_tiled_matmuls"] == report.counters["matmul_instructions"]
    assert counts.pe_tiled_matmuls * target.lnc == report.counters["pe_tiled_matmuls"]
    # the same matmuls at 1/columns of the PE time each
    assert tiled.cost.matmul_instructions == plain.cost.matmul_instructions
    assert _pe_us(tiled) == pytest.approx(_pe_us(plain) / columns)


def test_default_off_leaves_schedules_and_kernels_as_they_were():
    schedule = GemmSchedule()
    assert "column_tiles" not in schedule.as_dict() and "column_tiles" not in schedule.describe()
    assert GemmSchedule().with_params({"column_tiles": "4"}).as_dict()["column_tiles"] == 4
    default = compile_gemm(8, 1024, 1000, a_layout="km", target=TRN2, dialect="nki", preset="aws-hoist-load")
    code = _gemm(1).kernel.source  # the header names the --param given; the kernel is the same
    marker = "@nki.jit"
    assert code.partition(marker)[2] == default.kernel.source.partition(marker)[2]


def test_only_documented_tile_counts():
    with pytest.raises(ScheduleError, match=r"column_tiles=4: trn1 \(NeuronCore-v2\) documents PE tiles of 64, 128"):
        _gemm(4, TRN1, "neuronxcc")
    with pytest.raises(ScheduleError, match="1, 2 or 4 column tiles"):
        _gemm(3)


def test_narrowed_where_the_stationary_does_not_fit_or_k_is_split():
    # M = 48 fits a 64-column tile, not a 32-column one; K in several blocks keeps the whole array
    assert compile_gemm(48, 512, 512, a_layout="km", target=TRN2, preset="aws-hoist-load",
                        params={"column_tiles": 4}).schedule.column_tiles == 2
    assert compile_gemm(8, 512, 2048, a_layout="km", target=TRN2, preset="aws-fully-optimized",
                        params={"column_tiles": 4}).schedule.column_tiles == 1


def test_search_samples_column_tiles_only_for_small_stationaries():
    assert column_tile_candidates(8) == (1, 2, 4)
    assert column_tile_candidates(48) == (1, 2)
    assert column_tile_candidates(8, TRN1.max_column_tiles) == (1, 2)
    assert column_tile_candidates(128) == (1,)
    assert gemm_space(GemmProblem(16, 4096, 4096)).candidates["column_tiles"] == (1, 2, 4)
    assert gemm_space(GemmProblem(512, 4096, 4096)).candidates["column_tiles"] == (1,)
    assert fused_space(False, True).candidates["column_tiles"] == (1,)


@pytest.mark.parametrize("mutation", [("32 * ct), tile_size", "32 * ct + 16), tile_size", "NKI-MATMUL-TILE"),
                                      ("c_psum[32 * ct:32 * ct + TILE_M", "c_psum[0:TILE_M", "NKI-MATMUL-TILE-DST")],
                         ids=["misaligned-position", "dst-not-at-its-columns"])
def test_an_edited_tile_fails_verify_with_its_rule(mutation):
    before, after, rule = mutation
    source = _gemm(4).kernel.source
    assert before in source
    report = verify_source(source.replace(before, after), target=TRN2, rules=True)
    assert not report.ok and rule in (report.error or "")


def test_a_decode_mlp_column_tiles_its_down_projection():
    workload = mlp_workload(8, 256, 1024, dense=True)
    plain = compile_graph(workload, target=TRN2, params={})
    tiled = compile_graph(workload, target=TRN2, params={"column_tiles": 4})
    assert "tile_position=(0, 32 * ct), tile_size=(P, 32)" in tiled.kernel.source
    report = verify_source(tiled.kernel.source, target=TRN2, rules=True)
    assert report.ok, report.error or report.violations
    assert _pe_us(tiled) < _pe_us(plain)

"""row_k_tiles: the row-major matmul's own contraction blocks (lowerings/fused_rows.py, _k_blocked_rows), costed by
the search's last descent beside every one-token-tile schedule (lowerings/fused.late_forms)."""

from __future__ import annotations

from helpers import compile_graph, verified_nki
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings.fused import late_forms
from neuronmm_compiler.schedule.fused import ROW_K_TILES, FusedSchedule
from neuronmm_compiler.targets import get_target, with_lnc

TRN2 = get_target("trn2")



def test_the_down_projection_takes_its_own_k_blocks_and_verifies():
    """row_k_tiles blocks the down projection's 14 contraction tiles (8 and 6) while gate and up keep all of
    theirs (k_tiles_per_block=0): the down block then holds several 512-column output tiles, rows of 2 KiB and more
    instead of the 1 KiB of one tile, and the result and the counts are the interpreter's."""
    workload = mlp_workload(8, 1536, 1792, dense=True)
    params = {"weight_block_kib": 16, "k_tiles_per_block": 0, "weight_dma": "row", "out_tile": 512}
    whole, whole_report = verified_nki(workload, **params)
    blocked, report = verified_nki(workload, **params, row_k_tiles=8)
    source = blocked.kernel.source
    assert "weight rows in blocks of 8 K tiles" in source
    assert "weight rows in blocks" not in whole.kernel.source
    assert source.count("across K blocks") == 1  # the down projection's accumulators only: gate and up are whole
    assert 2048 in blocked.cost.dma_bytes_per_partition and 2048 not in whole.cost.dma_bytes_per_partition
    assert blocked.cost.latency_us < whole.cost.latency_us
    assert report.counters["hbm_bytes_read"] == whole_report.counters["hbm_bytes_read"]


def test_row_k_tiles_zero_follows_k_tiles_per_block():
    """0 keeps the down projection on k_tiles_per_block, so schedules stored before the parameter lower as before."""
    workload = mlp_workload(8, 512, 1792, dense=True)
    params = {"weight_block_kib": 16, "k_tiles_per_block": 8, "weight_dma": "row"}
    shared = compile_graph(workload, target=TRN2, dialect="nki", params=params).kernel.source
    explicit = compile_graph(workload, target=TRN2, dialect="nki", params={**params, "row_k_tiles": 8}).kernel.source
    assert "weight rows in blocks of 8 K tiles" in shared
    assert _body(shared) == _body(explicit)


def _body(source: str) -> str:
    """The kernel's statements: from its decorator on, without the comment naming the schedule."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("@"))
    return "\n".join(line for line in lines[start:] if "# schedule:" not in line)


def test_late_forms_add_the_row_k_blocks_to_both_orientations():
    base = FusedSchedule(tokens_per_block=8, token_tile=8)
    forms = late_forms(base)
    assert {(f.stationary, f.row_k_tiles) for f in forms} == \
        {("tokens", 0)} | {(o, k) for o in ("weights", "tokens") for k in ROW_K_TILES}
    assert late_forms(FusedSchedule(row_k_tiles=16, stationary="tokens")) == []


def test_the_search_blocks_qwen3_4b_down_projection_at_96_tokens():
    """Qwen3-4B's dense MLP at 96 tokens on trn2 LNC=1: the down projection in K blocks (3 output tiles of 512
    columns, 3 KiB rows, against one tile's 1 KiB rows) takes the tuned kernel from 440.0 us to 434.1, past
    nki-library's decode kernel (437.0) where it was slower (benchmarks/results/vs_nkilib-2026-12-04b.txt)."""
    from neuronmm_compiler.driver import tune

    result = tune(mlp_workload(96, 2560, 9728, dense=True), target=with_lnc(TRN2, 1), dialect="nki", trials=150)
    assert result.compiled.schedule.row_k_tiles in ROW_K_TILES
    assert result.compiled.cost.latency_us < result.baselines["nkilib-mlp"].cost.latency_us

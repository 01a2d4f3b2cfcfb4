"""Odd tile counts divided between the two programs of a logical core: two shares of ``ceil(tiles / 2)`` tiles that
overlap by one (kernel_ir/dims.py ``Dim.overlapping_shares``; lowerings/fused_transposed.py ``_shares``), each program
computing one tile more than half instead of both computing every tile."""

from __future__ import annotations

import pytest

from helpers import compile_graph
from neuronmm_compiler.driver import cost_workload
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.kernel_ir.dims import Dim
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc
from neuronmm_compiler.verification import verify_source


def _bytes(workload, name: str) -> int:
    node = next(n for n in workload.graph().inputs() if n.attrs["name"] == name)
    return 2 * node.shape[0] * node.shape[1]


def test_shares_cover_the_tiles_with_the_least_overlap():
    assert Dim.overlapping_shares(14, 2) == (7, 7)  # even: side by side
    assert Dim.overlapping_shares(13, 2) == (7, 6)  # tiles 0-6 and 6-12
    assert Dim.overlapping_shares(3, 2) == (2, 1)
    assert Dim.overlapping_shares(13, 4) == (4, 3)  # 0-3, 3-6, 6-9, 9-12
    assert Dim.overlapping_shares(1, 2) == (0, 0)  # one tile: nothing to divide
    assert Dim.overlapping_shares(10, 4) == (0, 0)  # shares of 3 cannot end at tile 9 evenly


@pytest.mark.parametrize("split", ["intermediate", "gather"])
def test_odd_rank_tiles_are_divided_and_verify(split):
    """Rank 384 is 3 tiles: each program computes 2 of x @ U's tiles (the middle one both), sends the one only it
    computed and receives the other's, so U crosses HBM 4/3 times instead of twice; both programs verify."""
    workload = mlp_workload(8, 512, 1024, ranks=(384, 384, 384))
    compiled = compile_graph(workload, target=with_lnc(get_target("trn2"), 2), dialect="nki",
                             params={"lnc_split": split})
    source = compiled.kernel.source
    assert "2 shares of 2 of the 3 feature tiles, 1 apart: tile 1 is computed by both programs" in source
    assert "exchange the tiles of x_ug_strip only it computed" in source
    report = verify_source(source, filename="<overlapping shares>")
    assert report.ok, report.error
    assert report.counters["hbm_bytes_read"]["u_gate"] == compiled.cost.hbm_bytes_read_by_tensor["u_gate"]
    assert compiled.cost.hbm_bytes_read_by_tensor["u_gate"] == _bytes(workload, "u_gate") * 4 // 3


def test_qwen3_4b_rank_1664_is_no_longer_computed_by_both_programs():
    """Qwen3-4B's SVD MLP at keep 0.8 has rank 1664, 13 tiles. Under ``intermediate`` both programs computed all 13
    tiles of x @ U_gate and x @ U_up, each U crossing HBM twice; now 7 each, 14/13 of U."""
    target = with_launch(with_lnc(get_target("trn2"), 2), IN_GRAPH)
    workload = mlp_workload(96, 2560, 9728, keep_ratio=0.8)
    costed = cost_workload(workload, target=target, dialect="nki", params={
        "tokens_per_block": 96, "token_tile": 96, "weight_block_kib": 64, "k_tiles_per_block": 0,
        "out_tile": 256, "weight_dma": "block", "lnc_split": "intermediate"})
    assert costed.cost.hbm_bytes_read_by_tensor["u_gate"] == _bytes(workload, "u_gate") * 14 // 13
    assert costed.cost.hbm_bytes_read_by_tensor["u_up"] == _bytes(workload, "u_up") * 14 // 13

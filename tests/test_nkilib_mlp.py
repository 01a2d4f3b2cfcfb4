"""nki-library's fused MLP as nmmc models it (lowerings/nkilib_mlp.py): its selection rule, its schedules run in the
interpreter with every program of the logical core, what it refuses, and mutations that verification catches."""

from __future__ import annotations

import pytest

from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings.nkilib_cte import split_on_intermediate, token_tile
from neuronmm_compiler.lowerings.nkilib_mlp import NotModelled, nkilib_baseline, nkilib_program, nkilib_source
from neuronmm_compiler.lowerings.nkilib_tkg import column_tile
from neuronmm_compiler.targets import get_target, with_lnc
from neuronmm_compiler.verification import verify_source

TRN2 = {lnc: with_lnc(get_target("trn2"), lnc) for lnc in (1, 2)}


def test_selection_and_tiling_rules_follow_the_source():
    assert nkilib_program(96, 256, 512, TRN2[1]).name == "nkilib_mlp_tkg"  # <= 96 tokens: decode kernel
    assert nkilib_program(97, 256, 512, TRN2[1]).name == "nkilib_mlp_cte"
    assert [column_tile(t) for t in (1, 32, 33, 64, 65, 96)] == [32, 32, 64, 64, 128, 128]
    assert [token_tile(4096, 2048, i) for i in (1024, 2048, 4096)] == [512, 256, 128]
    assert token_tile(768, 8192, 1024) == 384
    assert split_on_intermediate(512, 8192, 5120) and not split_on_intermediate(4096, 4096, 4096)
    assert split_on_intermediate(128, 8192, 2048) and not split_on_intermediate(4096, 8192, 2000)


@pytest.mark.parametrize(("tokens", "hidden", "inter", "lnc", "split"), [
    (8, 512, 1000, 2, "hidden"),      # four column tiles, a ragged I tile, fp32 all-reduce
    (48, 256, 640, 1, ""),            # two column tiles
    (96, 256, 384, 2, "hidden"),      # the whole PE array
    (300, 512, 640, 2, "tokens"),     # prefill: token halves, a ragged tile
    (130, 512, 4608, 2, "intermediate"),  # prefill: I halves reduce-scattered over H
])
def test_schedules_verify_with_every_program(tokens, hidden, inter, lnc, split):
    program = nkilib_program(tokens, hidden, inter, TRN2[lnc])
    assert program.split == split
    report = verify_source(nkilib_source(tokens, hidden, inter, TRN2[lnc]), rules=True)
    assert report.ok, report.error
    assert report.rel_error < 1e-2


def test_decode_kernel_uses_column_tiles_and_one_exchange():
    source = nkilib_source(8, 1024, 1024, TRN2[2])
    assert "tile_position=(0, 96), tile_size=(128, 32)" in source
    assert source.count("nki.lnc.sendrecv(") == 1


def test_mutations_fail_verification():
    source = nkilib_source(8, 1024, 1024, TRN2[2])
    exchange = next(line for line in source.splitlines() if "nki.lnc.sendrecv(" in line)
    assert not verify_source(source.replace(exchange, ""), rules=True).ok  # partial sums never exchanged
    added = next(line for line in source.splitlines() if "data2=gate_psum[it][32:40" in line)
    dropped = verify_source(source.replace(added, ""), rules=True)  # one column tile's partial sums lost
    assert not dropped.ok and dropped.rel_error > 0.05


def test_what_it_does_not_run_says_why():
    with pytest.raises(NotModelled, match="multiple of 256"):
        nkilib_program(8, 384, 512, TRN2[2])
    with pytest.raises(NotModelled, match="trn1"):
        nkilib_program(8, 256, 512, get_target("trn1"))
    baseline = nkilib_baseline(mlp_workload(1, 4096, 14336, dense=True), TRN2[2])  # [T, 2I] fp32 twice: no room
    assert baseline.cost is None and "SBUF window" in baseline.reason
    assert baseline.details["variant"] == "tkg"


def test_nmmc_decode_packs_k_blocked_accumulators_and_exchanges_once(tmp_path):
    """What nmmc's own dense MLP took from nki-library's decode kernel: the accumulators of many feature tiles side
    by side in one PSUM bank across K blocks (wide weight rows, few DMAs), and one exchange of gate's and up's partial
    sums under the hidden split."""
    from neuronmm_compiler.driver import compile_workload

    workload = mlp_workload(8, 512, 2048, dense=True)
    packed = compile_workload(workload, target=TRN2[2], dialect="nki",
                              params={"k_tiles_per_block": 2, "weight_block_kib": 192, "lnc_split": "gather"})
    source = packed.kernel.source
    assert "side by side in one PSUM bank" in source and "nl.ndarray((F_TILE, 8, T), dtype=nl.float32" in source
    assert verify_source(source, rules=True).ok
    hidden = compile_workload(workload, target=TRN2[2], dialect="nki", params={"lnc_split": "hidden"}).kernel.source
    assert hidden.count("nki.lnc.sendrecv(") == 1 and verify_source(hidden, rules=True).ok


@pytest.mark.parametrize(("lnc", "split"), [(1, "none"), (2, "gather")])
def test_nmmc_down_projection_streams_weight_rows_in_k_blocks(lnc, split):
    """The row-major (down) matmul of a decode MLP with k_tiles_per_block: the output tiles' accumulators live
    across K blocks of weight rows (as nki-library's decode down projection), a ragged shape included."""
    from neuronmm_compiler.driver import compile_workload

    workload = mlp_workload(5, 640, 1000, dense=True)
    compiled = compile_workload(workload, target=TRN2[lnc], dialect="nki",
                                params={"k_tiles_per_block": 2, "weight_block_kib": 16, "out_tile": 256,
                                        "lnc_split": split})
    source = compiled.kernel.source
    assert "weight rows in blocks of 2 K tiles" in source and "one PSUM bank per output tile, across K blocks" in source
    assert verify_source(source, rules=True).ok

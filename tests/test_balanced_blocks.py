"""Balanced weight blocks (kernel_ir/dims.balanced_block): a last block of less than half a block is evened out."""

from __future__ import annotations

import re

import pytest

from helpers import verified_nki
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.kernel_ir.dims import balanced_block


@pytest.mark.parametrize(("tiles", "per_block", "expected"), [
    (14, 6, 5),  # 6, 6, 2 -> 5, 5, 4: the same three blocks
    (38, 9, 8),  # a share of Qwen3-4B's intermediate: 9, 9, 9, 9, 2 -> 8, 8, 8, 8, 6
    (32, 9, 9),  # 9, 9, 9, 5: a last block of at least half a block is kept
    (12, 4, 4),  # whole blocks
    (20, 16, 10),  # K tiles: 16, 4 -> 10, 10
    (3, 8, 3),  # one block: all of the tiles
    (7, 0, 1),
])
def test_balanced_block(tiles, per_block, expected):
    assert balanced_block(tiles, per_block) == expected
    assert -(-tiles // expected) == -(-tiles // max(1, per_block))  # the same number of blocks


def test_feature_blocks_are_balanced_and_verify():
    """14 intermediate tiles where a 6 KiB block holds 6 (4 K tiles x 128 columns x 2 bytes = 1 KiB a tile): blocks
    of 5, 5 and 4 tiles, so no weight DMA moves rows of 2 tiles (512 bytes) as 6, 6, 2 did."""
    compiled, report = verified_nki(mlp_workload(8, 512, 1792, dense=True), weight_block_kib=6, k_tiles_per_block=0,
                                    weight_dma="row", out_tile=512)
    source = compiled.kernel.source
    assert re.search(r"H_BLOCK = 640  # 5 tiles of 128", source)
    rows = {int(k) for k in report.counters["dma_bytes_per_partition"]}
    assert 512 not in rows and {1280, 1024} <= rows


def test_k_blocks_are_balanced_and_verify():
    """The down projection's 14 contraction tiles in K blocks of 12 become blocks of 7 (12 and 2 before)."""
    compiled, _ = verified_nki(mlp_workload(8, 512, 1792, dense=True), weight_block_kib=16, k_tiles_per_block=12,
                               weight_dma="row", out_tile=512)
    assert "weight rows in blocks of 7 K tiles" in compiled.kernel.source

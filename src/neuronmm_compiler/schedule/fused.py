"""The schedule space of fused kernels (matmul chains with elementwise epilogues).

A fused kernel walks the tokens in blocks. For each block it holds the transposed activations
(X^T: features on partitions, the block's tokens on the free axis) in SBUF as a *strip*, and runs
the kernel's matmuls one after another, each reading its input strip from SBUF:

* a matmul whose result feeds another matmul is computed *transposed* (TrainiumFusion's implicit
  transposition): ``psum[n, tokens] = W_tile[k, n].T @ strip[k, tokens]`` gives (X W)^T, whose
  contraction dimension for the next matmul is already on the partitions;
* elementwise epilogues (silu, multiply, add) are applied on those PSUM tiles as they are evicted;
* the last matmul is computed in the normal orientation,
  ``psum[tokens, n] = strip[k, tokens].T @ W[k, n]``, and stored row-major.

:class:`FusedSchedule` sets the block and tile sizes, how weights are moved and which stay resident
across token blocks, and how X^T is produced when X is row-major.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..errors import ScheduleError
from .gemm import ParamSpec, ScheduleParams

WEIGHT_DMA = ("row", "tile")
CACHE_WEIGHTS = ("none", "stage1", "all")
X_TRANSPOSE = ("dma", "pe")
MLP_MODES = ("whole", "split")

FUSED_PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("tokens_per_block", int, None,
              "tokens per block (BM): the strip width, <= 512; a multiple of token_tile when larger than it"),
    ParamSpec("token_tile", int, None, "tokens per stationary tile of the final, row-major matmul, 1..128"),
    ParamSpec("weight_block_kib", int, None,
              "SBUF KiB per partition of one weight block (all of its contraction rows, as many output "
              "tiles as fit, at least one): larger blocks mean fewer, longer weight DMAs"),
    ParamSpec("k_tiles_per_block", int, None,
              "contraction tiles per weight block of a transposed matmul; 0 = all of them. Blocking K "
              "keeps a PSUM bank per feature tile across K blocks, so long contractions (the down "
              "projection's U) stream wide weight rows instead of narrow ones"),
    ParamSpec("out_tile", int, None, "output columns per matmul of the final, row-major matmul, 1..512"),
    ParamSpec("weight_dma", str, WEIGHT_DMA, "row: one DMA per 128-row slab of a weight block; tile: per tile"),
    ParamSpec("cache_weights", str, CACHE_WEIGHTS,
              "weights loaded once and kept in SBUF across token blocks: none, stage1 (the factors applied "
              "to the kernel's inputs, e.g. U), or all"),
    ParamSpec("x_transpose", str, X_TRANSPOSE,
              "how X^T strips are made from a row-major X: dma (transposing load) or pe (TensorE)"),
    ParamSpec("mlp", str, MLP_MODES,
              "how a gated MLP is split into kernels: whole (one kernel, h stays in SBUF) or split "
              "(gate/up kernel, then down kernel; h^T goes through HBM)"),
)
FUSED_PARAM_NAMES = tuple(p.name for p in FUSED_PARAMS)


@dataclass(frozen=True)
class FusedSchedule(ScheduleParams):
    """A point of the fused-kernel schedule space (see the module docstring)."""

    SPECS: ClassVar[tuple[ParamSpec, ...]] = FUSED_PARAMS
    WHAT: ClassVar[str] = "fused-schedule"

    tokens_per_block: int = 128
    token_tile: int = 128
    weight_block_kib: int = 16
    k_tiles_per_block: int = 0
    out_tile: int = 512
    weight_dma: str = "row"
    cache_weights: str = "none"
    x_transpose: str = "dma"
    mlp: str = "whole"


def check_fused(schedule: FusedSchedule, moving_fmax: int = 512, stationary_fmax: int = 128) -> None:
    """Raise ScheduleError when a parameter is outside its domain or a TensorEngine limit."""
    s = schedule
    if not 1 <= s.tokens_per_block <= moving_fmax:
        raise ScheduleError(f"tokens_per_block={s.tokens_per_block} is outside 1..{moving_fmax} "
                            "(the strip is the moving operand of the transposed matmuls)")
    if not 1 <= s.token_tile <= stationary_fmax:
        raise ScheduleError(f"token_tile={s.token_tile} is outside 1..{stationary_fmax} (stationary free size)")
    if s.tokens_per_block > s.token_tile and s.tokens_per_block % s.token_tile:
        raise ScheduleError(f"tokens_per_block={s.tokens_per_block} must be a multiple of token_tile={s.token_tile}")
    if not 1 <= s.out_tile <= moving_fmax:
        raise ScheduleError(f"out_tile={s.out_tile} is outside 1..{moving_fmax} (moving free size)")
    if s.k_tiles_per_block < 0:
        raise ScheduleError(f"k_tiles_per_block={s.k_tiles_per_block} must be 0 (all) or positive")
    if s.weight_block_kib < 1:
        raise ScheduleError(f"weight_block_kib={s.weight_block_kib} must be at least 1")
    for spec in FUSED_PARAMS:
        if spec.choices and getattr(s, spec.name) not in spec.choices:
            raise ScheduleError(f"{spec.name}={getattr(s, spec.name)!r} is not one of {', '.join(spec.choices)}")


def normalize_fused(schedule: FusedSchedule, tokens: int) -> FusedSchedule:
    """Clip the token block and tile to the number of tokens (a decode step gets 1-token strips)."""
    block = min(schedule.tokens_per_block, tokens)
    tile = min(schedule.token_tile, block)
    if block > tile and block % tile:
        block = (block // tile) * tile
    return replace(schedule, tokens_per_block=block, token_tile=tile)


def tiles_per_weight_block(schedule: FusedSchedule, k_tiles: int, tile_cols: int, itemsize: int,
                           tiles: int) -> int:
    """Output tiles of ``tile_cols`` columns that fit a weight block of ``weight_block_kib`` KiB per
    partition when the block holds all ``k_tiles`` contraction tiles (at least 1, at most all)."""
    per_tile = k_tiles * tile_cols * itemsize
    return max(1, min(tiles, schedule.weight_block_kib * 1024 // per_tile))

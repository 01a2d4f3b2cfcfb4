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
from typing import TYPE_CHECKING, ClassVar

from ..errors import ScheduleError
from ..kernel_ir.lnc import divisible_blocking
from .params import (
    CLASS,
    EXCHANGE,
    ParamSpec,
    ScheduleParams,
    categorical,
    check_column_tiles,
    column_tiles_spec,
    integer,
    max_tiles_per_block,
    sbuf_kib_per_partition,
    usable_column_tiles,
)

if TYPE_CHECKING:
    from ..targets import Target

WEIGHT_DMA = ("row", "tile", "block")
CACHE_WEIGHTS = ("none", "stage1", "all")
X_TRANSPOSE = ("dma", "pe")
MLP_MODES = ("whole", "split")
#: Which operand the matmuls of a value held transposed keep stationary (lowerings/fused_stationary.py).
STATIONARY = ("weights", "tokens")
#: Where an MX weight block's scales are loaded (lowerings/mx.py): with each K block of the weight, or once per column
#: block before its K-block loop ("hoisted"). Only MX schedules have the second.
MX_SCALES = ("block", "hoisted")
#: How an LNC=2 fused kernel divides its work between the two programs (kernel_ir/lnc.py); none on one core.
FUSED_SPLITS = ("none", "tokens", "features", "gather", "hidden", "intermediate")

#: The fused schedule space, in :class:`FusedSchedule`'s field order. The search narrows
#: ``x_transpose`` to ``dma`` when no activation is row-major, and ``mlp`` to ``whole`` when no
#: matmul reads an elementwise result.
FUSED_PARAMS: tuple[ParamSpec, ...] = (
    integer("tokens_per_block", 1, "gemm_moving_fmax",
            "the strip is the moving operand of the transposed matmuls", (32, 64, 128, 256, 512),
            "tokens per block (BM): the strip width, 1..512; a multiple of token_tile when larger than it",
            role=EXCHANGE),
    integer("token_tile", 1, "gemm_stationary_fmax", "stationary free size", (128,),
            "tokens per stationary tile of the final, row-major matmul, 1..128"),
    integer("weight_block_kib", 1, sbuf_kib_per_partition, "SBUF KiB per partition: a larger block cannot fit",
            (4, 8, 16, 32, 64, 128, 192),
            "SBUF KiB per partition of one weight block (all of its contraction rows, as many output "
            "tiles as fit, at least one), 1..SBUF KiB per partition (192 on trn1): larger blocks mean "
            "fewer, longer weight DMAs", role=EXCHANGE, refine=(48, 96)),
    integer("k_tiles_per_block", 0, max_tiles_per_block,
            "0 = all; at most SBUF bytes per partition / 2: a block of more tiles cannot fit", (0, 8, 16, 32),
            "contraction tiles per weight block of a transposed matmul, 0..SBUF bytes per partition / 2 "
            "(98304 on trn1); 0 = all of them. Blocking K keeps a PSUM bank per feature tile across K "
            "blocks, so long contractions (the down projection's U) stream wide weight rows instead of "
            "narrow ones; over one token tile it blocks the final row-major matmul too, unless row_k_tiles sets its "
            "own", role=EXCHANGE, refine=(2, 4)),
    integer("out_tile", 1, "gemm_moving_fmax", "moving free size", (512, 256),
            "output columns per matmul of the final, row-major matmul, 1..512"),
    categorical("weight_dma", WEIGHT_DMA, ("row", "tile"),
                "row: one DMA per 128-row slab of a weight block; tile: per tile; block: the slabs of a block in one "
                "DMA through an access pattern (nki dialect; kernel_ir/coalesce.py; the search costs it as a variant "
                "of every row schedule it samples)"),
    categorical("cache_weights", CACHE_WEIGHTS, ("none", "stage1", "all"),
                "weights loaded once and kept in SBUF across token blocks: none, stage1 (the factors applied "
                "to the kernel's inputs, e.g. U), or all", role=CLASS),
    categorical("x_transpose", X_TRANSPOSE, ("dma", "pe"),
                "how X^T strips are made from a row-major X: dma (transposing load) or pe (TensorE)", role=CLASS),
    categorical("mlp", MLP_MODES, ("whole", "split"),
                "how a gated MLP is split into kernels: whole (one kernel, h stays in SBUF) or split "
                "(gate/up kernel, then down kernel; h^T goes through HBM)", role=CLASS),
    categorical("lnc_split", FUSED_SPLITS, FUSED_SPLITS,
                "on an LNC=2 target, what the two programs of the logical core divide: tokens (the token blocks); "
                "features (the output-column blocks of the final row-major matmul; everything before it is computed "
                "by both); gather (the feature blocks of every matmul group, each program sending the half it "
                "computed of a value used on chip to the other with nisa.sendrecv: every weight streamed once; nki "
                "dialect); hidden (every matmul over a kernel input, e.g. gate and up over the hidden dimension, "
                "divides its contraction, the programs adding their partial sums with nisa.sendrecv before the "
                "epilogue, as "
                "AWS's decode MLP does, and so does an SVD MLP's h U_down over the intermediate dimension; the "
                "other later groups divide their features; nki dialect); intermediate (the group "
                "reading the gated value, or a chain's last, divides its "
                "contraction and the programs add their partial sums with nisa.sendrecv; the groups before it divide "
                "their features; nki dialect). A divided loop needs an even number of blocks; none on one physical "
                "core (docs/logical-cores.md)",
                role=CLASS, rival=True),
    column_tiles_spec("token_tile"),
    categorical("stationary", STATIONARY, (),
                "which operand the matmuls of a value held transposed (a strip a later matmul reads, e.g. gate and "
                "up) keep stationary: weights (128 features per matmul accumulate [features, tokens]) or tokens (the "
                "activations' strip stationary and out_tile weight columns moving into a [tokens, out_tile] "
                "accumulator, evaluated row-major and transposed into the strip on the TensorEngine, as nki-library's "
                "decode MLP computes gate and up; lowerings/fused_stationary.py); not sampled: where the tokens are "
                "one token tile, the search's last descent costs tokens beside every schedule it visits"),
    integer("row_k_tiles", 0, max_tiles_per_block,
            "0 = as k_tiles_per_block; at most SBUF bytes per partition / 2: a block of more tiles cannot fit", (),
            "contraction tiles per weight block of a row-major matmul over one token tile (the last one, e.g. the "
            "down projection at decode), 0..SBUF bytes per partition / 2; 0 = k_tiles_per_block's (which also blocks "
            "the transposed matmuls, whose rows it narrows). Its output tiles' accumulators are held across the K "
            "blocks, so a weight block holds several output tiles of wide rows instead of one tile's 1 KiB rows of "
            "every contraction row, as nki-library's decode down projection streams its weight. Not sampled: where "
            "the tokens are one token tile, the search's last descent costs 8 and 16 beside every schedule it "
            "visits"),
    categorical("mx_scales", MX_SCALES, (),
                "MX weights only (docs/mx.md): where the scales of a weight streamed in K blocks are loaded: block "
                "(with each K block, one DMA per SBUF quadrant per K block) or hoisted (a scale buffer spanning every "
                "K tile of the column block, loaded before the K-block loop: one DMA per quadrant per column block, "
                "at the cost of K-tiles x columns bytes per partition of SBUF beside the weight block); not sampled: "
                "the search costs hoisted beside every MX schedule that blocks a contraction"),
)

#: The ``row_k_tiles`` the search's last descent costs beside each schedule it visits (search/tuner.py, ``_late``).
ROW_K_TILES = (8, 16)


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
    lnc_split: str = "none"
    column_tiles: int = 1
    stationary: str = "weights"
    row_k_tiles: int = 0
    mx_scales: str = "block"

    QUIET: ClassVar[dict[str, int | str]] = {"column_tiles": 1, "stationary": "weights", "row_k_tiles": 0,
                                             "mx_scales": "block"}

    def check_relations(self) -> None:
        """A token block wider than a token tile is a whole number of tiles; PE column tiles split the array
        evenly."""
        check_column_tiles(self.column_tiles)
        if self.tokens_per_block > self.token_tile and self.tokens_per_block % self.token_tile:
            raise ScheduleError(f"tokens_per_block={self.tokens_per_block} must be a multiple of "
                                f"token_tile={self.token_tile}")


def normalize_fused(schedule: FusedSchedule, tokens: int, lnc: int = 1, pe_columns: int = 128,
                    max_column_tiles: int = 4) -> FusedSchedule:
    """Clip the token block and tile to the number of tokens (a decode step gets 1-token strips). On a logical
    core of ``lnc`` > 1 programs dividing the tokens (``lnc_split=tokens``), the token blocks are made an even
    number of whole blocks of an even number of tiles where the tokens allow it (kernel_ir/lnc.py). ``column_tiles``
    is narrowed to what a token tile (the row-major matmul's stationary free size) fits in a column tile of the
    ``pe_columns``-wide PE array (the target's ``gemm_stationary_fmax``), at most ``max_column_tiles`` (the
    target's); the lowering narrows it further per matmul to its contraction tiles."""
    block = min(schedule.tokens_per_block, tokens)
    tile = min(schedule.token_tile, block)
    if block > tile and block % tile:
        block = (block // tile) * tile
    if lnc > 1 and schedule.lnc_split == "tokens":
        tiles = -(-tokens // tile)
        if tiles % lnc and tokens >= lnc:
            tile = -(-tokens // (tiles + lnc - tiles % lnc))
            tiles = -(-tokens // tile)
        block = tile * divisible_blocking(tiles, max(1, block // tile), lnc)
    asked = min(schedule.column_tiles, max_column_tiles)
    columns = usable_column_tiles(asked, tile, asked, pe_columns)
    return replace(schedule, tokens_per_block=block, token_tile=tile, column_tiles=columns)


#: The parameters :func:`normalize_fused` reads or changes; it passes every other one through (the search counts
#: distinct schedules from these alone: ``SearchSpace.distinct_size``).
NORMALIZED_PARAMS = ("tokens_per_block", "token_tile", "column_tiles", "lnc_split")


def normalize_on(schedule: FusedSchedule, tokens: int, target: Target) -> FusedSchedule:
    """:func:`normalize_fused` for ``target``: its logical-core degree, PE array width and column tile count."""
    return normalize_fused(schedule, tokens, target.lnc, target.gemm_stationary_fmax, target.max_column_tiles)


def tiles_per_weight_block(schedule: FusedSchedule, k_tiles: int, tile_cols: int, itemsize: int,
                           tiles: int) -> int:
    """Output tiles of ``tile_cols`` columns that fit a weight block of ``weight_block_kib`` KiB per
    partition when the block holds all ``k_tiles`` contraction tiles (at least 1, at most all)."""
    per_tile = k_tiles * tile_cols * itemsize
    return max(1, min(tiles, schedule.weight_block_kib * 1024 // per_tile))

"""The GEMM problem and its schedule space.

``C[M, N] = A[M, K] @ B[K, N]`` (the BLAS convention). On the TensorEngine a matmul contracts over
the partition axis of both operands: ``psum[M, N] = stationary[K, M].T @ moving[K, N]``. nmmc
feeds A^T tiles as the stationary operand (free size <= 128) and B tiles as the moving operand
(free size <= 512), so C comes out with M on partitions, in its natural row-major layout.

A :class:`GemmSchedule` fixes the tile sizes, how many tiles make a block along each dimension,
the order of the three block loops, the order of the two free-dimension tile loops inside a block,
where partial sums over K live when K spans several blocks, how DMAs are grouped, how A^T tiles
are produced when A is stored row-major, and how many PSUM copies the output tiles of a block rotate
through (``psum_buffers``). Operand blocks are loaded in the body of the innermost
block loop they depend on, so they stay in SBUF across the loops nested inside: loop order and
block sizes together decide what is cached across which loop. A loop of one trip is not emitted
but still positions the loads (order ``kmn`` with one K block keeps an A^T strip across the n loop).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from itertools import permutations
from typing import TYPE_CHECKING, ClassVar

from ..errors import InputError, ScheduleError, UnknownNameError
from ..kernel_ir.lnc import divisible_blocking
from ..vocab import ALayout
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
    usable_column_tiles,
)

if TYPE_CHECKING:
    from ..targets import Target

DTYPES = ("bfloat16", "float32")
A_LAYOUTS: tuple[ALayout, ...] = tuple(ALayout)
LOOP_ORDERS = tuple("".join(p) for p in permutations("mnk"))
TILE_ORDERS = ("mn", "nm")
ACCUMULATE = ("psum", "sbuf")
DMA_MODES = ("tile", "row")
A_TRANSPOSE = ("dma", "pe")
ACCUMULATOR_DTYPES = ("float32", "output")
#: How an LNC=2 kernel divides its work between the two programs (kernel_ir/lnc.py): the M or N block loop;
#: ``none`` on one physical core.
GEMM_SPLITS = ("none", "m", "n")


@dataclass(frozen=True)
class GemmProblem:
    """``C[M, N] = A[M, K] @ B[K, N]``; ``a_layout="km"`` means A is stored transposed, as [K, M]."""

    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    a_layout: ALayout = ALayout.MK

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"GEMM dimension {name.upper()} must be a positive integer; got {value!r}")
        if self.dtype not in DTYPES:
            raise InputError(f"unknown dtype {self.dtype!r}; accepted: {', '.join(DTYPES)}")
        layout = ALayout.lookup(self.a_layout)
        if layout is None:
            raise InputError(
                f"unknown A layout {self.a_layout!r}; accepted: mk (A stored [M,K]), km (A stored [K,M])"
            )
        object.__setattr__(self, "a_layout", layout)

    @property
    def a_name(self) -> str:
        return "a" if self.a_layout == ALayout.MK else "a_t"

    @property
    def a_storage_shape(self) -> tuple[int, int]:
        return (self.m, self.k) if self.a_layout == ALayout.MK else (self.k, self.m)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def shape_text(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def describe(self) -> str:
        a = "A[M,K]" if self.a_layout == ALayout.MK else "A stored as A_t[K,M]"
        return f"C[M,N] = A[M,K] @ B[K,N], M={self.m} N={self.n} K={self.k}, {self.dtype}, {a}"


_TILES_LIMIT = "SBUF bytes per partition / 2: a block of more tiles cannot fit"


def _tiles_in_block(dim: str) -> ParamSpec:
    return integer(
        f"tiles_in_block_{dim}", 1, max_tiles_per_block, _TILES_LIMIT,
        (1, 2, 4, 8) if dim == "n" else (1, 2, 4, 8, 16, 32),
        f"{dim.upper()} tiles per block, 1..SBUF bytes per partition / 2 (98304 on trn1: a block keeps at least "
        "2 bytes per tile and partition in SBUF); clipped to the tile count", role=EXCHANGE)


#: The GEMM schedule space, in :class:`GemmSchedule`'s field order. Left out of the search on purpose:
#: ``tile_order`` (one candidate: it changes no count the model sees, only the order of independent
#: tiles) and ``accumulator_dtype`` (partial sums stay in fp32: trading accuracy for speed is the
#: user's call, via ``--param``). ``a_transpose`` is narrowed to ``dma`` when A is stored [K, M].
PARAMS: tuple[ParamSpec, ...] = (
    integer("tile_m", 1, "gemm_stationary_fmax", "the TensorEngine's stationary free size limit", (128, 64),
            "stationary free size of a tile (rows of C), 1..128"),
    integer("tile_n", 1, "gemm_moving_fmax", "the TensorEngine's moving free size limit", (512, 256),
            "moving free size of a tile (columns of C), 1..512"),
    integer("tile_k", 1, "pmax", "the TensorEngine's partition count limit", (128,),
            "partition size of a tile (contraction), 1..128"),
    _tiles_in_block("m"),
    _tiles_in_block("n"),
    _tiles_in_block("k"),
    categorical("loop_order", LOOP_ORDERS, LOOP_ORDERS, "order of the block loops, outermost first"),
    categorical("tile_order", TILE_ORDERS, ("mn",), "order of the M and N tile loops inside a block"),
    categorical("accumulate", ACCUMULATE, ("psum", "sbuf"),
                "where partial sums over K blocks live: psum (banks held across the K loop) or sbuf", role=CLASS),
    categorical("dma", DMA_MODES, ("row", "tile"),
                "tile: one DMA per tile; row: one DMA per partition row of a block", role=CLASS),
    categorical("a_transpose", A_TRANSPOSE, ("dma", "pe"),
                "how A^T tiles are made when A is row-major: dma (transposing load) or pe (TensorE)", role=CLASS),
    categorical("accumulator_dtype", ACCUMULATOR_DTYPES, (),
                "dtype of SBUF partial sums: float32 or the output dtype"),
    integer("operand_buffers", 0, 8, "nmmc's bound on explicit copies", (),
            "explicit copies of the A^T and B blocks, 0 or 2..8. 0: each block is allocated where it is loaded (the "
            "compiler picks the physical copies and rotates them). B >= 2: B copies allocated once before the loop "
            "that loads the block, the loads of consecutive iterations going to consecutive copies, so a load never "
            "waits for the matmuls still reading the block before it (SBUF holds B blocks). Clipped to that loop's "
            "trips. Not searched: the model rates an explicit rotation equal to the compiler's "
            "(docs/cost_model.md 3b)"),
    integer("psum_buffers", 0, "psum_banks", "the target's PSUM bank count", (),
            "PSUM copies the output tiles of a block rotate through, 0..PSUM banks. 0: a fresh accumulator per "
            "output tile, allocated in the tile loops (the compiler picks the physical copies and rotates them). "
            "B >= 1: B one-bank copies allocated once per block, tile t using copy t % B; with B = 1 a tile's "
            "matmuls wait for the previous tile's eviction, with B >= 2 they overlap it. Clipped to the tiles of a "
            "block; 0 when partial sums stay in PSUM across K blocks (accumulate=psum with several K blocks). Not "
            "searched: the model rates an explicit rotation equal to the compiler's (docs/cost_model.md 3b)"),
    categorical("lnc_split", GEMM_SPLITS, GEMM_SPLITS,
                "on an LNC=2 target, which block loop the two programs of the logical core divide: m or n (each "
                "program its half of the blocks; the loop must come before k in loop_order, unless each output "
                "tile is finished inside the K loop, and have an even number of blocks); none on one physical "
                "core (docs/logical-cores.md)", role=CLASS),
    column_tiles_spec("tile_m"),
)


@dataclass(frozen=True)
class GemmSchedule(ScheduleParams):
    """A point of the GEMM schedule space. See the module docstring for the meaning."""

    SPECS: ClassVar[tuple[ParamSpec, ...]] = PARAMS

    tile_m: int = 128
    tile_n: int = 512
    tile_k: int = 128
    tiles_in_block_m: int = 1
    tiles_in_block_n: int = 1
    tiles_in_block_k: int = 1
    loop_order: str = "mnk"
    tile_order: str = "mn"
    accumulate: str = "psum"
    dma: str = "tile"
    a_transpose: str = "dma"
    accumulator_dtype: str = "float32"
    operand_buffers: int = 0
    psum_buffers: int = 0
    lnc_split: str = "none"
    column_tiles: int = 1

    QUIET: ClassVar[dict[str, int | str]] = {"column_tiles": 1}

    def check_relations(self) -> None:
        """One explicit operand copy would make every load wait for the matmuls of the block before it; PE column
        tiles split the array evenly."""
        check_column_tiles(self.column_tiles)
        if self.operand_buffers == 1:
            raise ScheduleError("operand_buffers=1 would make every block load wait for the matmuls still reading "
                                "the block before it; use 0 (the compiler rotates the blocks) or 2 or more copies")


def load_levels(loop_order: str) -> dict[str, int]:
    """Where each operand block is loaded: the position in ``loop_order`` of the innermost block loop it
    depends on (A^T on m and k, B on k and n); the block is loaded in that loop's body."""
    return {"a": max(loop_order.index(d) for d in "mk"), "b": max(loop_order.index(d) for d in "kn")}


def tile_counts(problem: GemmProblem, schedule: GemmSchedule) -> dict[str, int]:
    """Number of tiles along m, n, k."""
    return {
        "m": math.ceil(problem.m / schedule.tile_m),
        "n": math.ceil(problem.n / schedule.tile_n),
        "k": math.ceil(problem.k / schedule.tile_k),
    }


#: The parameters :func:`normalize` reads or changes; it passes every other one (``tile_order``, ``dma``,
#: ``a_transpose``, ``accumulator_dtype``) through (the exhaustive search walks these alone: ``SearchSpace.distinct``).
NORMALIZED_PARAMS = ("tile_m", "tile_n", "tile_k", "tiles_in_block_m", "tiles_in_block_n", "tiles_in_block_k",
                     "loop_order", "accumulate", "operand_buffers", "psum_buffers", "lnc_split", "column_tiles")


def normalize(problem: GemmProblem, schedule: GemmSchedule, lnc: int = 1, pe_columns: int = 128,
              max_column_tiles: int = 4) -> GemmSchedule:
    """Clip tile sizes to the problem and tiles-in-block to the tile counts, so that a decode-sized
    M (1..127 tokens) gets tiles of exactly M rows and equivalent schedules compare equal. On a logical core of
    ``lnc`` > 1 programs, the dimension ``lnc_split`` divides gets a blocking the programs can share: an even
    number of tiles (narrower tiles where the count is odd) in an even number of whole blocks
    (kernel_ir/lnc.py). ``column_tiles`` is narrowed to what the output tiles can use (:func:`usable_column_tiles`:
    an A^T tile of ``tile_m`` columns fitting a column tile of the ``pe_columns``-wide array, the target's
    ``gemm_stationary_fmax``; K in one block accumulated in a PSUM tile per output tile, no rotating copies), and to
    the target's ``max_column_tiles``."""
    # plain locals, not per-dimension dicts: a search normalizes every schedule it meets (the GEMM space's size alone
    # takes thousands, SearchSpace.distinct_size)
    m, n, k = problem.m, problem.n, problem.k
    tile_m, tile_n, tile_k = min(schedule.tile_m, m), min(schedule.tile_n, n), min(schedule.tile_k, k)
    per_m, per_n, per_k = schedule.tiles_in_block_m, schedule.tiles_in_block_n, schedule.tiles_in_block_k
    if lnc > 1 and schedule.lnc_split == "m":
        tile_m, per_m = _divisible(m, tile_m, per_m, lnc)
    elif lnc > 1 and schedule.lnc_split == "n":
        tile_n, per_n = _divisible(n, tile_n, per_n, lnc)
    count_m, count_n, count_k = -(-m // tile_m), -(-n // tile_n), -(-k // tile_k)  # tile_counts of the clipped tiles
    per_m, per_n, per_k = min(per_m, count_m), min(per_n, count_n), min(per_k, count_k)
    blocks = {"m": -(-count_m // per_m), "n": -(-count_n // per_n), "k": -(-count_k // per_k)}
    load_trips = max(blocks[dim] for dim in _load_dims(schedule.loop_order))
    copies = min(schedule.operand_buffers, load_trips)
    held = schedule.accumulate == "psum" and count_k > per_k
    psum_buffers = 0 if held else min(schedule.psum_buffers, per_m * per_n)
    per_tile = schedule.accumulate == "psum" and count_k == per_k and psum_buffers == 0
    asked = min(schedule.column_tiles, max_column_tiles)
    columns = usable_column_tiles(asked, tile_m, count_k, pe_columns) if per_tile else 1
    # one replace (each costs microseconds, and an exhaustive search normalizes every point of its space)
    return replace(schedule, tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, tiles_in_block_m=per_m,
                   tiles_in_block_n=per_n, tiles_in_block_k=per_k,
                   operand_buffers=copies if copies >= 2 else 0, psum_buffers=psum_buffers, column_tiles=columns)


@functools.cache
def _load_dims(loop_order: str) -> tuple[str, ...]:
    """The block loops the operand loads sit in (:func:`load_levels`), as dimensions."""
    return tuple(loop_order[level] for level in load_levels(loop_order).values())


def normalize_on(problem: GemmProblem, schedule: GemmSchedule, target: Target) -> GemmSchedule:
    """:func:`normalize` for ``target``: its logical-core degree, PE array width and column tile count."""
    return normalize(problem, schedule, target.lnc, target.gemm_stationary_fmax, target.max_column_tiles)


def _divisible(size: int, tile: int, per_block: int, programs: int) -> tuple[int, int]:
    """The tile and tiles per block of a dimension of ``size`` blocked so that ``programs`` programs share its
    blocks evenly."""
    tiles = -(-size // tile)
    if tiles % programs:
        narrower = -(-size // (tiles + programs - tiles % programs))
        if -(-size // narrower) % programs == 0:
            tile, tiles = narrower, -(-size // narrower)
    return tile, divisible_blocking(tiles, min(per_block, tiles), programs)


# ----------------------------------------------------------------------------- presets


def _aws_tiled(problem: GemmProblem) -> GemmSchedule:
    """AWS tutorial 'tiled': m, n tile loops; inside, a K loop loading both operand tiles per matmul."""
    return GemmSchedule(loop_order="mnk")


def _aws_hoist_load(problem: GemmProblem) -> GemmSchedule:
    """AWS 'hoisted loads': the whole K strip of A^T loaded per m tile, of B per (m, n) tile."""
    whole_k = math.ceil(problem.k / 128)
    return GemmSchedule(tiles_in_block_k=whole_k, loop_order="kmn")


def _aws_block_free(problem: GemmProblem) -> GemmSchedule:
    """AWS 'blocked free dimensions': 2 x 2 tiles per (m, n) block, K not blocked."""
    whole_k = math.ceil(problem.k / 128)
    return GemmSchedule(tiles_in_block_m=2, tiles_in_block_n=2, tiles_in_block_k=whole_k, loop_order="kmn")


def _aws_fully_optimized(problem: GemmProblem) -> GemmSchedule:
    """AWS 'fully optimized': blocks of 16/2/8 tiles (M/N/K), loops n > k (sequential) > m, partial
    sums accumulated in SBUF in the output dtype, one DMA per partition row of a block, packed stores."""
    return GemmSchedule(
        tiles_in_block_m=16, tiles_in_block_n=2, tiles_in_block_k=8, loop_order="nkm", tile_order="nm",
        accumulate="sbuf", dma="row", accumulator_dtype="output",
    )


PRESETS = {
    "aws-tiled": _aws_tiled,
    "aws-hoist-load": _aws_hoist_load,
    "aws-block-free": _aws_block_free,
    "aws-fully-optimized": _aws_fully_optimized,
}
DEFAULT_PRESET = "aws-fully-optimized"


def preset(name: str, problem: GemmProblem) -> GemmSchedule:
    """The named preset for a problem (normalized to the problem's dimensions)."""
    try:
        factory = PRESETS[name]
    except KeyError:
        raise UnknownNameError(f"unknown schedule preset {name!r}; presets: {', '.join(PRESETS)}") from None
    return normalize(problem, factory(problem))


def preset_doc(name: str) -> str:
    doc = PRESETS[name].__doc__ or ""
    return " ".join(doc.split())

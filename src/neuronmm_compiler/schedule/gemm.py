"""The GEMM problem and its schedule space.

``C[M, N] = A[M, K] @ B[K, N]`` (the BLAS convention). On the TensorEngine a matmul contracts over
the partition axis of both operands: ``psum[M, N] = stationary[K, M].T @ moving[K, N]``. nmmc
feeds A^T tiles as the stationary operand (free size <= 128) and B tiles as the moving operand
(free size <= 512), so C comes out with M on partitions, in its natural row-major layout.

A :class:`GemmSchedule` fixes the tile sizes, how many tiles make a block along each dimension,
the order of the three block loops, the order of the two free-dimension tile loops inside a block,
where partial sums over K live when K spans several blocks, how DMAs are grouped, and how A^T tiles
are produced when A is stored row-major. Operand blocks are loaded in the body of the innermost
block loop they depend on, so they stay in SBUF across the loops nested inside: loop order and
block sizes together decide what is cached across which loop. A loop of one trip is not emitted
but still positions the loads (order ``kmn`` with one K block keeps an A^T strip across the n loop).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from itertools import permutations
from typing import ClassVar, TypeVar

from ..errors import InputError, ScheduleError, UnknownNameError

DTYPES = ("bfloat16", "float32")
A_LAYOUTS = ("mk", "km")
LOOP_ORDERS = tuple("".join(p) for p in permutations("mnk"))
TILE_ORDERS = ("mn", "nm")
ACCUMULATE = ("psum", "sbuf")
DMA_MODES = ("tile", "row")
A_TRANSPOSE = ("dma", "pe")
ACCUMULATOR_DTYPES = ("float32", "output")


@dataclass(frozen=True)
class GemmProblem:
    """``C[M, N] = A[M, K] @ B[K, N]``; ``a_layout="km"`` means A is stored transposed, as [K, M]."""

    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    a_layout: str = "mk"

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"GEMM dimension {name.upper()} must be a positive integer; got {value!r}")
        if self.dtype not in DTYPES:
            raise InputError(f"unknown dtype {self.dtype!r}; accepted: {', '.join(DTYPES)}")
        if self.a_layout not in A_LAYOUTS:
            raise InputError(
                f"unknown A layout {self.a_layout!r}; accepted: mk (A stored [M,K]), km (A stored [K,M])"
            )

    @property
    def a_name(self) -> str:
        return "a" if self.a_layout == "mk" else "a_t"

    @property
    def a_storage_shape(self) -> tuple[int, int]:
        return (self.m, self.k) if self.a_layout == "mk" else (self.k, self.m)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def shape_text(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def describe(self) -> str:
        a = "A[M,K]" if self.a_layout == "mk" else "A stored as A_t[K,M]"
        return f"C[M,N] = A[M,K] @ B[K,N], M={self.m} N={self.n} K={self.k}, {self.dtype}, {a}"


@dataclass(frozen=True)
class ParamSpec:
    name: str
    kind: type
    choices: tuple[str, ...] | None
    help: str


PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("tile_m", int, None, "stationary free size of a tile (rows of C), 1..128"),
    ParamSpec("tile_n", int, None, "moving free size of a tile (columns of C), 1..512"),
    ParamSpec("tile_k", int, None, "partition size of a tile (contraction), 1..128"),
    ParamSpec("tiles_in_block_m", int, None, "M tiles per block (>= 1; clipped to the tile count)"),
    ParamSpec("tiles_in_block_n", int, None, "N tiles per block (>= 1; clipped to the tile count)"),
    ParamSpec("tiles_in_block_k", int, None, "K tiles per block (>= 1; clipped to the tile count)"),
    ParamSpec("loop_order", str, LOOP_ORDERS, "order of the block loops, outermost first"),
    ParamSpec("tile_order", str, TILE_ORDERS, "order of the M and N tile loops inside a block"),
    ParamSpec("accumulate", str, ACCUMULATE,
              "where partial sums over K blocks live: psum (banks held across the K loop) or sbuf"),
    ParamSpec("dma", str, DMA_MODES, "tile: one DMA per tile; row: one DMA per partition row of a block"),
    ParamSpec("a_transpose", str, A_TRANSPOSE,
              "how A^T tiles are made when A is row-major: dma (transposing load) or pe (TensorE)"),
    ParamSpec("accumulator_dtype", str, ACCUMULATOR_DTYPES,
              "dtype of SBUF partial sums: float32 or the output dtype"),
)
PARAM_NAMES = tuple(p.name for p in PARAMS)


def parse_params(specs: tuple[ParamSpec, ...], params: dict[str, str | int], what: str) -> dict[str, int | str]:
    """Check ``--param key=value`` pairs against ``specs``; values typed (ints parsed)."""
    by_name = {p.name: p for p in specs}
    changes: dict[str, int | str] = {}
    for key, raw in params.items():
        spec = by_name.get(key)
        if spec is None:
            names = ", ".join(by_name)
            raise UnknownNameError(f"unknown {what} parameter {key!r}; parameters: {names}")
        if spec.kind is int:
            try:
                changes[key] = int(raw)
            except (TypeError, ValueError):
                raise InputError(f"schedule parameter {key} takes an integer; got {raw!r}") from None
        else:
            if spec.choices and str(raw) not in spec.choices:
                raise InputError(f"schedule parameter {key} must be one of {', '.join(spec.choices)}; got {raw!r}")
            changes[key] = str(raw)
    return changes


_S = TypeVar("_S", bound="ScheduleParams")


class ScheduleParams:
    """What every schedule dataclass offers: its parameters as a dict, one readable line, and
    ``--param key=value`` overrides checked against the class's ``SPECS``."""

    SPECS: ClassVar[tuple[ParamSpec, ...]] = ()
    WHAT: ClassVar[str] = "schedule"

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)  # type: ignore[call-overload]

    def describe(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))  # type: ignore[arg-type]

    def with_params(self: _S, params: dict[str, str | int]) -> _S:
        """A copy with ``--param key=value`` overrides applied (values may be strings)."""
        return replace(self, **parse_params(self.SPECS, params, self.WHAT))  # type: ignore[type-var]


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


def tile_counts(problem: GemmProblem, schedule: GemmSchedule) -> dict[str, int]:
    """Number of tiles along m, n, k."""
    return {
        "m": math.ceil(problem.m / schedule.tile_m),
        "n": math.ceil(problem.n / schedule.tile_n),
        "k": math.ceil(problem.k / schedule.tile_k),
    }


def check_ranges(schedule: GemmSchedule, pmax: int = 128, stationary_fmax: int = 128,
                 moving_fmax: int = 512) -> None:
    """Raise ScheduleError when a parameter is outside its domain or a tile limit."""
    limits = {"tile_m": (stationary_fmax, "stationary free size"), "tile_n": (moving_fmax, "moving free size"),
              "tile_k": (pmax, "partition count")}
    for name, (limit, what) in limits.items():
        value = getattr(schedule, name)
        if not 1 <= value <= limit:
            raise ScheduleError(f"{name}={value} is outside 1..{limit} (the TensorEngine's {what} limit)")
    for name in ("tiles_in_block_m", "tiles_in_block_n", "tiles_in_block_k"):
        if getattr(schedule, name) < 1:
            raise ScheduleError(f"{name}={getattr(schedule, name)} must be at least 1")
    for spec in PARAMS:
        if spec.choices and getattr(schedule, spec.name) not in spec.choices:
            raise ScheduleError(
                f"{spec.name}={getattr(schedule, spec.name)!r} is not one of {', '.join(spec.choices)}"
            )


def normalize(problem: GemmProblem, schedule: GemmSchedule) -> GemmSchedule:
    """Clip tile sizes to the problem and tiles-in-block to the tile counts, so that a decode-sized
    M (1..127 tokens) gets tiles of exactly M rows and equivalent schedules compare equal."""
    clipped = replace(
        schedule,
        tile_m=min(schedule.tile_m, problem.m),
        tile_n=min(schedule.tile_n, problem.n),
        tile_k=min(schedule.tile_k, problem.k),
    )
    counts = tile_counts(problem, clipped)
    return replace(
        clipped,
        tiles_in_block_m=min(clipped.tiles_in_block_m, counts["m"]),
        tiles_in_block_n=min(clipped.tiles_in_block_n, counts["n"]),
        tiles_in_block_k=min(clipped.tiles_in_block_k, counts["k"]),
    )


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

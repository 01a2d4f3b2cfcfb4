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
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from itertools import permutations
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..errors import InputError, ScheduleError, UnknownNameError
from ..vocab import ALayout

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


#: How the search treats a parameter (its *role*). Integers are ordinal: Optuna samples an index
#: into their candidate list, so neighbouring candidates are related. Strings are categorical.
#: ``exchange`` (an ordinal block size) and ``class`` (a structural categorical) add what the
#: polish does with them: it trades one exchange parameter's step against another's, and it
#: starts one descent per combination of class values.
ORDINAL = "ordinal"
EXCHANGE = "exchange"
CATEGORICAL = "categorical"
CLASS = "class"
ROLES = (ORDINAL, EXCHANGE, CATEGORICAL, CLASS)

#: An integer parameter's upper bound: a number, the name of a :class:`~neuronmm_compiler.targets.Target`
#: attribute, or a function of the target.
Bound = int | str | Callable[["Target"], int]

#: Bytes of the narrowest element a schedule tiles (bf16).
MIN_ITEMSIZE = 2


def max_tiles_per_block(target: Target) -> int:
    """The most tiles a block may have along one dimension on ``target``: SBUF bytes per partition
    / 2 (98304 on trn1). A block of T tiles keeps at least T elements per partition of one operand
    in SBUF (the A^T and B blocks hold every tile of theirs side by side on the free axis, a fused
    weight block every contraction tile), at least 2 bytes each, so a larger block can never fit;
    a larger value could only ever be clipped to the problem's tile count."""
    return target.sbuf_bytes_per_partition // MIN_ITEMSIZE


def sbuf_kib_per_partition(target: Target) -> int:
    """SBUF KiB per partition on ``target`` (192 on trn1): the most one weight block can hold."""
    return target.sbuf_bytes_per_partition // 1024


@dataclass(frozen=True)
class ParamSpec:
    """One schedule parameter, declared once: its name and type, its domain (``choices`` of a
    categorical; ``low..high`` of an integer, ``high`` a number, a Target attribute or a function of
    the Target, ``limit`` saying what it is), the values the search tries (``candidates``, in
    Optuna's index order; empty: not searched, the dataclass default is used), its role in the
    search (:data:`ROLES`), and the help ``nmmc schedules`` prints. Defaults are the schedule
    dataclass's field defaults. Build with :func:`integer` or :func:`categorical`."""

    name: str
    kind: type
    choices: tuple[str, ...] | None
    help: str
    low: int = 0
    high: Bound = 0
    limit: str = ""
    candidates: tuple = ()
    role: str = CATEGORICAL

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: unknown role {self.role!r}")
        if self.kind is int:
            if self.choices is not None or not self.ordinal:
                raise ValueError(f"{self.name}: an integer parameter is ordinal and has no choices")
            bad = [v for v in self.candidates if not _is_int(v) or v < self.low
                   or (isinstance(self.high, int) and v > self.high)]
        elif self.kind is str:
            if not self.choices or self.ordinal:
                raise ValueError(f"{self.name}: a string parameter is categorical and has choices")
            bad = [v for v in self.candidates if v not in self.choices]
        else:
            raise ValueError(f"{self.name}: parameters are int or str, not {self.kind!r}")
        if bad or len(set(self.candidates)) != len(self.candidates):
            raise ValueError(f"{self.name}: candidates {self.candidates} repeat or leave the domain")

    @property
    def searched(self) -> bool:
        """True when the search samples this parameter."""
        return bool(self.candidates)

    @property
    def ordinal(self) -> bool:
        """Optuna samples an index into the candidates (else the candidate itself, categorically)."""
        return self.role in (ORDINAL, EXCHANGE)

    @property
    def exchange(self) -> bool:
        """The polish trades a step of this block size against a step of another."""
        return self.role == EXCHANGE

    @property
    def polish_class(self) -> bool:
        """Structural: the polish starts once per combination of these parameters' values."""
        return self.role == CLASS

    def upper(self, target: Target) -> int:
        """The largest value an integer parameter may take on ``target``."""
        if isinstance(self.high, int):
            return self.high
        if isinstance(self.high, str):
            return int(getattr(target, self.high))
        return self.high(target)

    def check(self, value: object, target: Target) -> None:
        """Raise ScheduleError when ``value`` is outside this parameter's domain on ``target``."""
        if self.kind is str:
            if value not in (self.choices or ()):
                raise ScheduleError(f"{self.name}={value!r} is not one of {', '.join(self.choices or ())}")
            return
        if not _is_int(value):
            raise ScheduleError(f"{self.name}={value!r} is not an integer")
        high = self.upper(target)
        if not self.low <= value <= high:  # type: ignore[operator]
            raise ScheduleError(f"{self.name}={value} is outside {self.low}..{high} ({self.limit})")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(name: str, low: int, high: Bound, limit: str, candidates: tuple[int, ...], help: str, *,
            role: str = ORDINAL) -> ParamSpec:
    """An integer parameter with domain ``low..high`` (``limit``: what ``high`` is, for errors)."""
    return ParamSpec(name, int, None, help, low=low, high=high, limit=limit, candidates=candidates, role=role)


def categorical(name: str, choices: tuple[str, ...], candidates: tuple[str, ...], help: str, *,
                role: str = CATEGORICAL) -> ParamSpec:
    """A string parameter with domain ``choices``."""
    return ParamSpec(name, str, choices, help, candidates=candidates, role=role)


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
)


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
    """What every schedule dataclass offers: its parameters as a dict, one readable line,
    ``--param key=value`` overrides checked against the class's ``SPECS`` (which name the
    dataclass's fields, in order), and a check of every parameter against its domain."""

    SPECS: ClassVar[tuple[ParamSpec, ...]] = ()
    WHAT: ClassVar[str] = "schedule"

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)  # type: ignore[call-overload]

    def describe(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))  # type: ignore[arg-type]

    def with_params(self: _S, params: dict[str, str | int]) -> _S:
        """A copy with ``--param key=value`` overrides applied (values may be strings)."""
        return replace(self, **parse_params(self.SPECS, params, self.WHAT))  # type: ignore[type-var]

    def check_relations(self) -> None:
        """Raise ScheduleError when parameters contradict each other (each within its domain)."""

    def normalized(self: _S, context: Any) -> _S:
        """The equivalent schedule with sizes clipped to the workload ``context`` describes."""
        raise NotImplementedError


def check_schedule(schedule: ScheduleParams, target: Target) -> None:
    """Raise ScheduleError when a parameter of ``schedule`` is outside its declared domain on
    ``target`` (see its class's ``SPECS``) or parameters contradict each other."""
    for spec in schedule.SPECS:
        spec.check(getattr(schedule, spec.name), target)
    schedule.check_relations()


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

    def normalized(self, context: GemmProblem) -> GemmSchedule:
        """:func:`normalize` to the problem ``context``."""
        return normalize(context, self)


def tile_counts(problem: GemmProblem, schedule: GemmSchedule) -> dict[str, int]:
    """Number of tiles along m, n, k."""
    return {
        "m": math.ceil(problem.m / schedule.tile_m),
        "n": math.ceil(problem.n / schedule.tile_n),
        "k": math.ceil(problem.k / schedule.tile_k),
    }


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

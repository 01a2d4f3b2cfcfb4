"""Schedule parameters, declared once: :class:`ParamSpec` (a parameter's domain, search
candidates, role and help), the :class:`ScheduleParams` base of every schedule dataclass, ``--param``
parsing and :func:`check_schedule`. The schedule classes (:mod:`.gemm`, :mod:`.fused`) declare
their ``SPECS`` with these; the search derives its spaces from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, ClassVar, TypeVar

from ..errors import InputError, ScheduleError, UnknownNameError

if TYPE_CHECKING:
    from ..targets import Target

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


#: The most PE column tiles any generation documents: 4 x 32 columns from NeuronCore-v3 (nki.isa.nc_matmul,
#: "Tiling mode"); each target's own count is :attr:`~neuronmm_compiler.targets.Target.max_column_tiles`.
COLUMN_TILES = (1, 2, 4)


def check_column_tiles(value: int, target: Target | None = None) -> None:
    """PE column tiles split the array into equal tiles of a documented size: 1, 2 or 4 of them, and at most as
    many as ``target`` documents (2 on trn1). The domain of ``column_tiles`` is what some target documents; the
    lowering entries check a requested schedule against its own target here, as they check a transposing load
    (lowerings/base.py, transpose_choice), and the lowerings clip a stored or searched one to the target."""
    if value not in COLUMN_TILES:
        raise ScheduleError(f"column_tiles={value}: the PE array splits into 1, 2 or 4 column tiles (nc_matmul "
                            "tile_size column sizes 128, 64, 32; rule NKI-MATMUL-TILE)")
    if target is not None and value > target.max_column_tiles:
        sizes = ", ".join(map(str, target.pe_tile_sizes))
        raise ScheduleError(f"column_tiles={value}: {target.name} ({target.core}) documents PE tiles of {sizes} "
                            f"columns, so at most {target.max_column_tiles} column tiles (nki.isa.nc_matmul, Tiling "
                            "mode: 2 x 64 from NeuronCore-v2, 4 x 32 from NeuronCore-v3; rule NKI-MATMUL-TILE)")


def usable_column_tiles(asked: int, stationary_free: int, k_tiles: int, pe_columns: int) -> int:
    """``asked`` column tiles narrowed to what a matmul sequence can use: at most ``k_tiles`` (the independent
    matmuls of one output tile, one per contraction tile), and a stationary of ``stationary_free`` columns fitting
    one tile of the ``pe_columns``-wide array (1 where it is wider than half of it)."""
    tiles = asked
    while tiles > 1 and (tiles > k_tiles or stationary_free > pe_columns // tiles):
        tiles //= 2
    return max(tiles, 1)


def column_tile_candidates(stationary_free: int, max_tiles: int = 4, pe_columns: int = 128) -> tuple[int, ...]:
    """The ``column_tiles`` values a search tries for row-major matmuls with ``stationary_free`` columns of
    stationary (a GEMM's M, a fused kernel's tokens): where that is at most half the ``pe_columns``-wide array
    (decode), 1 and every count up to ``max_tiles`` (the target's :attr:`~neuronmm_compiler.targets.Target.
    max_column_tiles`) whose tiles it fits; elsewhere column tiles cannot apply, and the space holds 1 only."""
    if stationary_free > pe_columns // 2:
        return (1,)
    return tuple(c for c in (1, 2, 4) if c <= max_tiles and stationary_free <= pe_columns // c)


def column_tiles_spec(stationary: str) -> ParamSpec:
    """The ``column_tiles`` parameter of a schedule whose row-major matmuls have ``stationary`` free elements."""
    return integer(
        "column_tiles", 1, COLUMN_TILES[-1],
        "the most PE column tiles a target documents (nki.isa.nc_matmul, Tiling mode: 4 x 32 columns from "
        "NeuronCore-v3; 2 x 64 on NeuronCore-v2, checked against the target)", COLUMN_TILES,
        f"PE column tiles (1, 2 or 4) the contraction tiles of one output tile are spread over, so that up to that "
        f"many matmuls run at once (nc_matmul tile_position/tile_size), their partial sums added on eviction; 1: "
        f"the whole array. For a stationary of at most 128/column_tiles columns ({stationary}, e.g. decode tokens); "
        f"narrowed to what the stationary fits and the contraction tiles; at most 2 on trn1 (docs/cost_model.md)")


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
    #: values between the candidates that only the polish visits (one-parameter moves from the sampled optimum),
    #: not Optuna: a finer grid where a boundary (SBUF room) makes the best value fall between coarse candidates,
    #: without diluting what the 150 trials sample (docs/architecture.md, "Search")
    refine: tuple = ()
    #: a structural class parameter (``role`` CLASS) whose classes the polish keeps a rival of: after the free
    #: descents, the best start with each other value than the winner's is polished once more within its class
    #: (search/tuner.py, ``_rivals``)
    rival: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: unknown role {self.role!r}")
        if self.rival and self.role != CLASS:
            raise ValueError(f"{self.name}: only a structural class parameter keeps a rival")
        if self.kind is int:
            if self.choices is not None or not self.ordinal:
                raise ValueError(f"{self.name}: an integer parameter is ordinal and has no choices")
            bad = [v for v in self.candidates + self.refine if not _is_int(v) or v < self.low
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
            role: str = ORDINAL, refine: tuple[int, ...] = ()) -> ParamSpec:
    """An integer parameter with domain ``low..high`` (``limit``: what ``high`` is, for errors); ``refine``: values
    only the polish visits (:attr:`ParamSpec.refine`)."""
    return ParamSpec(name, int, None, help, low=low, high=high, limit=limit, candidates=candidates, role=role,
                     refine=refine)


def categorical(name: str, choices: tuple[str, ...], candidates: tuple[str, ...], help: str, *,
                role: str = CATEGORICAL, rival: bool = False) -> ParamSpec:
    """A string parameter with domain ``choices``."""
    return ParamSpec(name, str, choices, help, candidates=candidates, role=role, rival=rival)


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


_NO_VALUE = object()  # a value no parameter holds


class ScheduleParams:
    """What every schedule dataclass offers: its parameters as a dict, one readable line,
    ``--param key=value`` overrides checked against the class's ``SPECS`` (which name the
    dataclass's fields, in order), and a check of every parameter against its domain."""

    SPECS: ClassVar[tuple[ParamSpec, ...]] = ()
    WHAT: ClassVar[str] = "schedule"
    #: Parameters left out of :meth:`as_dict` and :meth:`describe` while they hold these values: parameters added
    #: after kernels, caches and locks were written, so a schedule that does not use them is stored and emitted
    #: byte for byte as before (a stored decision without them reads back with the default).
    QUIET: ClassVar[dict[str, int | str]] = {}

    def as_dict(self) -> dict[str, int | str]:
        quiet = self.QUIET  # the fields are ints and strings: read directly, not deep-copied as asdict() does
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) != quiet.get(f.name, _NO_VALUE)}

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.as_dict().items())

    def with_params(self: _S, params: dict[str, str | int]) -> _S:
        """A copy with ``--param key=value`` overrides applied (values may be strings)."""
        return replace(self, **parse_params(self.SPECS, params, self.WHAT))  # type: ignore[type-var]

    def check_relations(self) -> None:
        """Raise ScheduleError when parameters contradict each other (each within its domain)."""


def check_schedule(schedule: ScheduleParams, target: Target) -> None:
    """Raise ScheduleError when a parameter of ``schedule`` is outside its declared domain on
    ``target`` (see its class's ``SPECS``) or parameters contradict each other."""
    for spec in schedule.SPECS:
        spec.check(getattr(schedule, spec.name), target)
    schedule.check_relations()

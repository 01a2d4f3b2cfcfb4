"""The loop-nest program: what a schedule lowers to, what codegen prints and the cost model counts.

A :class:`Program` is one kernel: HBM parameters and outputs, and a body of statements: loops,
on-chip buffer allocations, and the instructions of the NKI subset nmmc emits (DMA copies, matmul,
transposes, PSUM evictions, vector ops). Indices are :mod:`.expr` expressions over loop variables.
Nothing here is dialect specific: the dialect printers in :mod:`neuronmm_compiler.codegen` decide
how each statement is spelled. It is a little longer than the 400-line guideline: one small class per kind of
instruction, which the printers, the cost model and the interpreter's contract all read from this one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from ..vocab import ElementwiseOp
from .expr import Expr, Lin, add, as_expr, code, literal

Memory = Literal["hbm", "sbuf", "psum"]

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float32": 4, "float16": 2, "float8_e4m3": 1, "float8_e5m2": 1,
                               "float8_e4m3fn": 1,
                               # MX: four packed elements per element (kernel_ir/mx.py), and E8M0 scales as uint8
                               "float8_e4m3fn_x4": 4, "float8_e5m2_x4": 4, "float4_e2m1fn_x4": 2, "uint8": 1}
#: ``nc_matmul`` performance modes (``nki.isa.matmul_perf_mode``): ``double_row`` is "Double FP8 mode, 2x matmul
#: throughput by packing two FP8 weight/ifmap element pairs", on NeuronCore-v3/v4 only, never with column tiling
#: (rules NKI-MATMUL-DOUBLE-ROW*, verification/rules.py).
PerfMode = Literal["none", "double_row"]


@dataclass(frozen=True)
class Span:
    """A half-open slice ``start:start + size`` of one tensor axis. The extent is kept as the
    lowering gave it (an affine form, or the min() of a ragged tile), so the cost model reads it
    without rebuilding ``stop - start``; only starts are affine, only sizes may be min()."""

    start: Expr
    size: Expr

    @cached_property
    def stop(self) -> Expr:
        """``start + size`` (built when printed: the search never needs it)."""
        return add(self.start, self.size)

    def code(self) -> str:
        return f"{code(self.start)}:{code(self.stop)}"


@dataclass(frozen=True)
class Point:
    """A single index that drops its axis (used for the tile axis of multi-tile buffers)."""

    index: Expr

    def code(self) -> str:
        return code(self.index)


Index = Span | Point


def span(start: int | Expr, size: int | Expr) -> Span:
    return Span(as_expr(start), as_expr(size))


@dataclass(frozen=True)
class Buffer:
    """A tensor: an HBM kernel argument/output, or an on-chip allocation (dim 0 = partitions). ``entries`` > 0: a
    Python list of that many separate tensors of ``shape``, each its own allocation, that a :class:`Ref` picks by
    ``entry`` (the NKI migration guide's replacement for a block dimension; :mod:`.psum_banks`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    memory: Memory
    entries: int = 0

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_partition(self) -> int:
        """Bytes per partition of one tensor (of one entry of a list)."""
        size = self.itemsize
        for extent in self.shape[1:]:
            size *= extent
        return size

    def footprint(self, granule: int = 1) -> int:
        """What the buffer occupies per partition, each tensor rounded up to whole ``granule`` s (PSUM banks: a
        PSUM allocation starts on a bank boundary): in bytes for ``granule`` 1, else in granules."""
        return max(self.entries, 1) * -(-self.bytes_per_partition // granule)


@dataclass(frozen=True)
class Ref:
    """A region of a buffer: one index per axis; ``entry`` picks the tensor of a list buffer (:attr:`Buffer.entries`),
    an expression of loops that are unrolled at trace time (a Python list takes a Python int)."""

    buffer: Buffer
    index: tuple[Index, ...]
    entry: Expr | None = None

    def __post_init__(self) -> None:
        if len(self.index) != len(self.buffer.shape):
            raise ValueError(f"{self.buffer.name}: {len(self.index)} indices for rank {len(self.buffer.shape)}")
        if (self.entry is None) != (self.buffer.entries == 0):
            raise ValueError(f"{self.buffer.name}: a list buffer takes an entry index, a tensor none")

    @cached_property
    def shape(self) -> tuple[Expr, ...]:
        """The extent of every sliced axis (built once per region)."""
        return tuple(ix.size for ix in self.index if isinstance(ix, Span))

    def code(self) -> str:
        entry = "" if self.entry is None else f"[{code(self.entry)}]"
        return f"{self.buffer.name}{entry}[" + ", ".join(ix.code() for ix in self.index) + "]"


def whole(buffer: Buffer) -> Ref:
    return Ref(buffer, tuple(span(0, extent) for extent in buffer.shape))


# ----------------------------------------------------------------------------- statements


@dataclass(frozen=True)
class Alloc:
    """Allocate an on-chip buffer. ``zero`` fills it with 0 (partial sums start at zero);
    ``accumulator`` marks a PSUM buffer that matmuls accumulate into (0.1 dialects zero it).
    ``copies``: 0 for a buffer each execution allocates afresh (the compiler chooses how many physical
    copies rotate); B >= 1 for B copies along axis 1 that the uses inside the allocation's scope rotate
    through explicitly (a copy is reused only after the B - 1 uses since its last one)."""

    buffer: Buffer
    zero: bool = False
    accumulator: bool = False
    comment: str = ""
    copies: int = 0


@dataclass(frozen=True)
class DmaCopy:
    """HBM -> SBUF load or SBUF -> HBM store. ``transpose`` loads a 2-D HBM region transposed. ``broadcast``: a
    load whose source region holds one row ([1, F] of a row-major HBM array, or [F, 1] of an [N, 1] column, both F
    contiguous elements) repeated on every partition of ``dst`` [P, F] (an access pattern with partition step 0,
    ``.ap``; docs/quantization.md: how scales reach every partition). ``fold``: a load whose source region holds ``P *
    F``
    contiguous elements of an [N, 1] column, laid out row by row over ``dst`` [P, F] (the access pattern
    ``[[F, P], [1, F]]``: one transfer of F-element rows instead of one per partition column; docs/quantization.md).
    ``slabs``: a load of ``KT`` slabs of ``P`` rows of a row-major HBM array in one transfer, source rows
    ``[r0, r0 + KT * P)`` into ``dst`` [P, KT, F], row ``r0 + kt * P + p`` to partition p, slot kt (the access pattern
    ``[[C, P], [P * C, KT], [1, F]]`` of an array of C columns; :mod:`.coalesce`)."""

    dst: Ref
    src: Ref
    transpose: bool = False
    broadcast: bool = False
    fold: bool = False
    slabs: bool = False

    @property
    def is_load(self) -> bool:
        return self.src.buffer.memory == "hbm"


@dataclass(frozen=True)
class PeTile:
    """The part of the TensorEngine's 128 x 128 PE array one matmul occupies (``nc_matmul`` ``tile_position`` /
    ``tile_size``): PE rows ``row .. row + rows`` hold the stationary's partitions (K), PE columns ``col .. col +
    cols`` its free elements (M), whose results land on PSUM partitions ``col ..``. Matmuls in distinct tiles run
    concurrently (NKI API reference, nki.isa.nc_matmul, "Tiling mode"; rule NKI-MATMUL-TILE in
    verification/rules.py). The starts are expressions (the docs allow affine ones); the sizes are constants."""

    row: Expr
    col: Expr
    rows: int
    cols: int

    def map(self, fn: Callable[[Expr], Expr]) -> PeTile:
        """This tile with ``fn`` applied to its start expressions (loop rewrites: unrolling, program offsets)."""
        return PeTile(fn(self.row), fn(self.col), self.rows, self.cols)

    def code(self) -> tuple[str, str]:
        """(``tile_position``, ``tile_size``) as printed: ``(0, ct * 32)``, ``(128, 32)``."""
        return f"({code(self.row)}, {code(self.col)})", f"({literal(self.rows)}, {literal(self.cols)})"


@dataclass(frozen=True)
class Matmul:
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` on the TensorEngine, into PSUM. ``overwrite``: this
    matmul starts the accumulation (a rotating PSUM copy that still holds an earlier tile's sums); otherwise it
    accumulates into a freshly allocated tile, whose first write overwrites. ``tile``: the PE tile it runs in
    (None: the whole array, as ``nc_matmul`` without ``tile_position``). ``perf_mode``: ``double_row`` for FP8
    operands on a target that documents it (twice the PE rate; :data:`PerfMode`)."""

    dst: Ref
    stationary: Ref
    moving: Ref
    overwrite: bool = False
    tile: PeTile | None = None
    perf_mode: PerfMode = "none"


@dataclass(frozen=True)
class PeTranspose:
    """TensorEngine transpose of an SBUF tile into PSUM."""

    dst: Ref
    src: Ref


@dataclass(frozen=True)
class Copy:
    """Engine copy with cast to dst's dtype (PSUM -> SBUF eviction, packing)."""

    dst: Ref
    src: Ref


@dataclass(frozen=True)
class TensorTensor:
    """Elementwise ``dst = op(lhs, rhs)`` on the VectorEngine, in fp32 (a binary op: add, multiply)."""

    dst: Ref
    lhs: Ref
    rhs: Ref
    op: ElementwiseOp


#: The ScalarEngine functions a program applies besides the graph's unary ops: ``copy`` (the identity),
#: ``square`` and ``rsqrt`` (the norm prologue), from the table "Supported Activation Functions for NKI ISA".
ActivationFn = ElementwiseOp | Literal["copy", "square", "rsqrt"]


@dataclass(frozen=True)
class Activation:
    """``dst = op(src * scale + bias)`` on the ScalarEngine, in fp32 (a unary op: silu; or copy, rsqrt). ``scale``
    is a number or a ``[P, 1]`` region (one value per partition), ``bias`` None or a ``[P, 1]`` region: the
    engine applies both in the same instruction at no extra cost (nki.isa.activation)."""

    dst: Ref
    src: Ref
    op: ActivationFn
    scale: Ref | float = 1.0
    bias: Ref | None = None


@dataclass(frozen=True)
class ActivationReduce:
    """``dst = op(src * scale)`` on the ScalarEngine and ``reduce_res[p, 0] = sum(dst[p, :])`` in the same
    instruction (nki.isa.activation_reduce; the reduction is an add). ``reduce_res`` is ``[P, 1]``."""

    dst: Ref
    src: Ref
    op: ActivationFn
    reduce_res: Ref
    scale: float = 1.0


@dataclass(frozen=True)
class BnStats:
    """VectorEngine statistics of each partition of ``src`` (at most ``bn_stats_fmax`` elements of it):
    six values per partition in ``dst`` (count, mean, variance * count of the even and of the odd elements;
    nki.isa.bn_stats)."""

    dst: Ref
    src: Ref


@dataclass(frozen=True)
class BnAggr:
    """VectorEngine aggregation of one or more :class:`BnStats` results per partition into ``dst = [mean,
    variance]`` (nki.isa.bn_aggr)."""

    dst: Ref
    src: Ref


ScalarOp = Literal["subtract", "multiply", "add", "divide", "minimum", "maximum"]


@dataclass(frozen=True)
class TensorScalar:
    """``dst = (src op0 operand0) op1 operand1`` on the VectorEngine, the operands ``[P, 1]`` regions broadcast
    along the free axis or numbers (nki.isa.tensor_scalar); ``op1``/``operand1`` optional. The FP8 quantization is
    ``(x divide scale) minimum max`` then ``maximum -max`` into the FP8 tile (docs/quantization.md)."""

    dst: Ref
    src: Ref
    op0: ScalarOp
    operand0: Ref | float
    op1: ScalarOp | None = None
    operand1: Ref | float | None = None


@dataclass(frozen=True)
class TensorScalarReduce:
    """``dst = |src|`` on the VectorEngine and ``reduce_res[p, 0] = max(dst[p, :])`` in the same instruction
    (nki.isa.tensor_scalar_reduce with ``op0=nl.abs``, ``reduce_op=nl.maximum``): the absolute maximum of each
    partition's elements, a token's when tokens are on the partitions (a per-token FP8 scale, docs/quantization.md).
    ``reduce_res`` is ``[P, 1]``; ``dst`` is written and not read (the instruction has one)."""

    dst: Ref
    src: Ref
    reduce_res: Ref


@dataclass(frozen=True)
class TensorReduce:
    """``dst[p, 0] = max(src[p, :])`` along the free axis on the VectorEngine (nki.isa.tensor_reduce, ``op=nl.maximum``,
    ``axis=1``); ``dst`` is ``[P, 1]``."""

    dst: Ref
    src: Ref


@dataclass(frozen=True)
class Memset:
    """Fill an on-chip region with a constant (nki.isa.memset), e.g. the ``eps`` column a norm adds."""

    dst: Ref
    value: float


@dataclass(frozen=True)
class SendRecv:
    """Exchange SBUF regions with the other program of a logical core (``nisa.sendrecv``): this program's ``src``
    lands in the other's ``dst`` and the other's ``src`` in this one's ``dst``; both programs issue it, with
    regions of the same shape, and each continues once both halves arrived."""

    dst: Ref
    src: Ref


@dataclass
class Loop:
    """``for var in range(trip)``. ``sequential`` marks a loop-carried dependence (SBUF partial sums).
    ``split``: the families of work splits this loop belongs to (``m``, ``n``, ``tokens``, ...), set by a lowering
    on a loop whose iterations write disjoint parts of the outputs and carry nothing; :mod:`.lnc` divides the
    loops of one family between the programs of a logical core."""

    var: str
    trip: Expr
    body: list[Stmt] = field(default_factory=list)
    sequential: bool = False
    comment: str = ""
    split: tuple[str, ...] = ()

    @property
    def runs_once(self) -> bool:
        """Whether the trip is the constant 1."""
        return isinstance(self.trip, Lin) and self.trip.is_const and self.trip.const == 1


@dataclass(frozen=True)
class Comment:
    text: str


Stmt = (Alloc | DmaCopy | Matmul | PeTranspose | Copy | TensorTensor | Activation | ActivationReduce | BnStats | BnAggr
        | TensorScalar | TensorScalarReduce | TensorReduce | Memset | SendRecv | Loop | Comment)


@dataclass
class Program:
    """One kernel: ``outputs = name(*params)``. ``programs``: how many programs of a logical core run it (the
    LNC degree), each with its own ``nl.program_id`` (the variable :data:`~.lnc.PROGRAM_ID` in index expressions);
    ``split`` the loop family divided between them; ``split_error`` why the work could not be divided (the
    program is then infeasible, see :func:`~.lnc.distribute`); ``checks`` see below."""

    name: str
    params: list[Buffer]
    outputs: list[Buffer]
    body: list[Stmt]
    doc: str = ""
    programs: int = 1
    split: str = ""
    split_error: str | None = None
    #: equalities the kernel asserts at trace time, each with the message it fails with: conditions on counts read
    #: from the arguments that the program needs (true at the size it was built for)
    checks: tuple[tuple[Expr, Expr, str], ...] = ()

    def live_intervals(self, walked: list[tuple[Stmt, tuple[Loop, ...]]] | None = None
                       ) -> list[tuple[int, int, Buffer]]:
        """(first, last, buffer) of every allocation site, in positions of the program read once in
        order (a loop body counted once): a buffer occupies memory from its allocation to its last
        use. A use inside a loop that the allocation is outside of keeps the buffer live to the end
        of that loop (later iterations use it again). Every iteration repeats its body's intervals,
        so the peak over this pass is the kernel's peak; the interpreter measures the same. ``walked``: the body's
        :func:`walked` list, when the caller has it."""
        walked = walked_list(self.body) if walked is None else walked
        loop_end: dict[int, int] = {}
        for position, (_, loops) in enumerate(walked):
            for loop in loops:
                loop_end[id(loop)] = position
        intervals: list[list] = []
        current: dict[int, tuple[list, tuple[Loop, ...]]] = {}
        for position, (stmt, loops) in enumerate(walked):
            if isinstance(stmt, Alloc):
                record = [position, position, stmt.buffer]
                current[id(stmt.buffer)] = (record, loops)
                intervals.append(record)
                continue
            for ref in refs_of(stmt):
                found = current.get(id(ref.buffer))
                if found is None:
                    continue
                record, alloc_loops = found
                end = position
                if loops is not alloc_loops:  # the outermost loop around the use that is not around the allocation
                    for loop in loops:
                        if not any(loop is a for a in alloc_loops):
                            end = loop_end[id(loop)]
                            break
                if end > record[1]:
                    record[1] = end
        return [(a, b, buf) for a, b, buf in intervals]

    @staticmethod
    def _peak(intervals: list[tuple[int, int, Buffer]], memory: str, size: Callable[[Buffer], int]) -> int:
        events: list[tuple[int, int]] = []
        for first, last, buf in intervals:
            if buf.memory == memory:
                amount = size(buf)
                events += [(first, amount), (last + 1, -amount)]
        peak = live = 0
        for _, delta in sorted(events):  # by position, then frees (negative) before allocations
            live += delta
            peak = max(peak, live)
        return peak

    def rotating_loads(self, walked: list[tuple[Stmt, tuple[Loop, ...]]] | None = None) -> set[int]:
        """The ids of the SBUF buffers a loop's iterations fill with one DMA of several slabs (``slabs``, a block in
        one transfer): allocated (``copies`` 0) inside a loop whose trip is not the constant 1. That transfer writes
        the whole block at once, so it cannot start before every read of the previous iteration's block at the same
        address is done: the model's overlap of it with that compute needs a second copy's room (:meth:`peaks`). A
        block loaded slab by slab needs none: each slab is refilled once its readers are done, as AWS's measured
        'hoisted loads' GEMM shows (docs/cost_model.md, "Room to rotate"). ``walked`` as for :meth:`live_intervals`."""
        allocated: set[int] = set()
        loaded: set[int] = set()
        for stmt, loops in (walked_list(self.body) if walked is None else walked):
            if isinstance(stmt, Alloc):
                if (stmt.copies == 0 and stmt.buffer.memory == "sbuf"
                        and any(not loop.runs_once for loop in loops)):
                    allocated.add(id(stmt.buffer))
            elif isinstance(stmt, DmaCopy) and stmt.slabs and id(stmt.dst.buffer) in allocated:
                loaded.add(id(stmt.dst.buffer))
        return loaded

    def peaks(self, bank_bytes: int) -> tuple[int, int, int]:
        """``(peak SBUF bytes per partition, peak PSUM banks, peak SBUF bytes per partition with room to rotate)``
        (see :meth:`live_intervals`; each PSUM allocation starts on a bank boundary and takes whole banks of
        ``bank_bytes``), from one pass of the intervals. The third counts every buffer of :meth:`rotating_loads`
        twice: the next iteration's load lands in a second copy while the compute still reads the first
        (docs/cost_model.md, "Room to rotate")."""
        walked = walked_list(self.body)
        intervals = self.live_intervals(walked)
        rotating = self.rotating_loads(walked)
        return (self._peak(intervals, "sbuf", lambda b: b.footprint()),
                self._peak(intervals, "psum", lambda b: b.footprint(bank_bytes)),
                self._peak(intervals, "sbuf", lambda b: b.footprint() * (2 if id(b) in rotating else 1)))


_NO_REFS = (Loop, Comment, Alloc)  # a tuple: isinstance(x, A | B) builds the union on every call


def refs_of(stmt: Stmt) -> list[Ref]:
    """The tensor regions an instruction reads or writes (none for loops, comments, allocations)."""
    if isinstance(stmt, _NO_REFS):
        return []
    return [value for value in vars(stmt).values() if isinstance(value, Ref)]


def map_regions(stmt: Stmt, region: Callable[[Ref], Ref], start: Callable[[Expr], Expr] | None = None) -> Stmt:
    """An instruction with every region it reads or writes passed through ``region`` and, given ``start``, the start
    expressions of its PE tile through ``start`` (the loop rewrites: program offsets, folded loops, PSUM lists)."""
    changes: dict[str, object] = {name: region(value) for name, value in vars(stmt).items() if isinstance(value, Ref)}
    if start is not None and isinstance(stmt, Matmul) and stmt.tile is not None:
        changes["tile"] = stmt.tile.map(start)
    return with_fields(stmt, changes) if changes else stmt


def with_fields(stmt: Stmt, changes: Mapping[str, object]) -> Stmt:
    """``dataclasses.replace(stmt, **changes)`` for a statement: its fields' values are its ``__dict__`` (no statement
    class has a ``__post_init__``, an ``InitVar`` or a cached property), so the copy is that dictionary updated,
    without ``__init__``'s per-field ``object.__setattr__`` (the search rewrites ~10^5 statements)."""
    if hasattr(stmt, "__post_init__"):
        return replace(stmt, **changes)
    copy = object.__new__(type(stmt))
    copy.__dict__.update(vars(stmt))
    copy.__dict__.update(changes)
    return copy


def walk(body: list[Stmt], loops: tuple[Loop, ...] = ()) -> Iterator[tuple[Stmt, tuple[Loop, ...]]]:
    """Every statement in program order with the loops enclosing it (outermost first)."""
    for stmt in body:
        yield stmt, loops
        if isinstance(stmt, Loop):
            yield from walk(stmt.body, (*loops, stmt))


def walked_list(body: list[Stmt]) -> list[tuple[Stmt, tuple[Loop, ...]]]:
    """``list(walk(body))``, built without generators (the search reads every candidate's program this way)."""
    out: list[tuple[Stmt, tuple[Loop, ...]]] = []
    _walk_into(body, (), out)
    return out


def _walk_into(body: list[Stmt], loops: tuple[Loop, ...], out: list[tuple[Stmt, tuple[Loop, ...]]]) -> None:
    append = out.append
    for stmt in body:
        append((stmt, loops))
        if isinstance(stmt, Loop):
            _walk_into(stmt.body, (*loops, stmt), out)


Counted = Iterator[tuple[Stmt, dict[str, int], int]]
Visit = Callable[[Stmt, dict[str, int], int], None]


def instruction_counts(body: list[Stmt], env: Mapping[str, int] | None = None,
                       memo: dict[int, frozenset[str]] | None = None) -> Counted:
    """Yield (statement, loop environment, multiplicity) for every leaf statement, evaluating
    loops in closed form: an iteration space is split into its first and last iterations, the
    only ones that can differ (ragged tiles are always the last). The first stands for all but
    the last. A loop whose variable appears in no extent (:attr:`Ref.shape`) or trip count inside
    it has identical iterations: it is visited once, at its last iteration, for all of them. So a
    consumer may read a statement's extents and trip counts in the environment, not its offsets.
    Exact for the programs nmmc's lowerings build; tests compare it with enumeration. ``memo``: the loops'
    extent variables found so far (:func:`extent_variables`), to share between walks of one body."""
    found: list[tuple[Stmt, dict[str, int], int]] = []
    _visit(body, dict(env or {}), 1, {} if memo is None else memo, lambda *leaf: found.append(leaf))
    yield from found


def visit_counts(body: list[Stmt], visit: Visit, env: Mapping[str, int] | None = None,
                 memo: dict[int, frozenset[str]] | None = None) -> None:
    """``visit(statement, loop environment, multiplicity)`` for what :func:`instruction_counts` yields, in its order,
    without a generator per loop level (the cost model counts every candidate of a search this way)."""
    _visit(body, dict(env or {}), 1, {} if memo is None else memo, visit)


def _visit(body: list[Stmt], env: dict[str, int], mult: int, memo: dict[int, frozenset[str]], visit: Visit) -> None:
    for stmt in body:
        if isinstance(stmt, Loop):
            trip = stmt.trip.evaluate(env)
            if trip <= 0:
                continue
            last = {**env, stmt.var: trip - 1}
            if trip > 1 and stmt.var not in _extent_variables(stmt, memo):
                _visit(stmt.body, last, mult * trip, memo, visit)
                continue
            if trip > 1:
                _visit(stmt.body, {**env, stmt.var: 0}, mult * (trip - 1), memo, visit)
            _visit(stmt.body, last, mult, memo, visit)
        else:
            visit(stmt, env, mult)


def extent_variables(body: list[Stmt], memo: dict[int, frozenset[str]] | None = None) -> frozenset[str]:
    """The variables that the extents (:attr:`Ref.shape`) and trip counts of ``body`` read: all that
    :func:`instruction_counts` evaluates, so two environments that agree on these count alike. ``memo`` (loop id ->
    its variables) is filled as :func:`instruction_counts` fills it, for a count of the same body to reuse."""
    memo = {} if memo is None else memo
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, Loop):
            names |= _extent_variables(stmt, memo)
        else:
            for ref in refs_of(stmt):
                for extent in ref.shape:
                    names |= extent.variables()
    return frozenset(names)


def _extent_variables(loop: Loop, memo: dict[int, frozenset[str]]) -> frozenset[str]:
    """The loop variables that the extents and trip counts inside ``loop`` (and its trip) use."""
    found = memo.get(id(loop))
    if found is None:
        names: set[str] = set(loop.trip.variables())
        for stmt in loop.body:
            if isinstance(stmt, Loop):
                names |= _extent_variables(stmt, memo)
            elif not isinstance(stmt, _NO_REFS):
                for ref in vars(stmt).values():  # refs_of, inlined: this runs for every loop of every candidate
                    if isinstance(ref, Ref):
                        for extent in ref.shape:
                            if type(extent) is Lin:
                                names.update(name for name, _ in extent.terms)
                            else:
                                names |= extent.variables()
        found = memo[id(loop)] = frozenset(names)
    return found

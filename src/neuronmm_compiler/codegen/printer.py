"""Print a loop-nest :class:`Program` as NKI source, one printer per dialect.

``nki`` is NKI 0.3+ (``import nki``): every ISA call names its destination with ``dst=``, loops are
plain Python ``range`` (unrolled at trace time), outputs live in ``nl.shared_hbm``; an exchange is
``nki.lnc.sendrecv`` for SDK 2.34+, ``nisa.sendrecv(..., pipe_id=0)`` before (NKI-ISA-LNC-DEPRECATED, NKI-LNC-MODULE).
``neuronxcc`` is the older NKI 0.1 API (``import neuronxcc.nki``) that the NeuronMM paper used:
instructions return values that are assigned into buffers, loads and stores are ``nl.load`` /
``nl.store``, matmul results accumulate with ``+=`` into a zeroed PSUM tile (``=`` starts the sums in a
rotating PSUM copy, ``accumulate=False`` in 0.3+), and loops are
``nl.affine_range`` (independent), ``nl.sequential_range`` (loop-carried partial sums) or
``nl.static_range`` (a loop whose variable sizes a ragged tile, picks a rotating copy or indexes a list of
PSUM tiles, so it must be unrolled at trace time). In both, sizes a lowering named
(:class:`~neuronmm_compiler.kernel_ir.expr.Named`) print by name, declared at the kernel's top. The module is a little
longer than the 400-line guideline: one branch per statement kind of the subset in each dialect, kept side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..errors import ScheduleError
from ..kernel_ir.expr import CeilDiv, Min, Mod, add, code, literal, naming, scale
from ..kernel_ir.lnc import PROGRAM_ID, exchanges
from ..kernel_ir.program import (
    Activation,
    ActivationReduce,
    Alloc,
    BnAggr,
    BnStats,
    Comment,
    Copy,
    DmaCopy,
    Loop,
    Matmul,
    Memset,
    PeTranspose,
    Program,
    Ref,
    SendRecv,
    Span,
    Stmt,
    TensorReduce,
    TensorScalar,
    TensorScalarReduce,
    TensorTensor,
    refs_of,
    walk,
)
from ..kernel_ir.psum_banks import ENTRY_VAR
from ..support import newest_release, uses_nki_lnc
from ..vocab import Dialect, ElementwiseOp

INDENT = "    "
NL_DTYPES = {"bfloat16": "nl.bfloat16", "float32": "nl.float32", "float16": "nl.float16",
             "float8_e4m3": "nl.float8_e4m3", "float8_e5m2": "nl.float8_e5m2",
             "float8_e4m3fn": "nl.float8_e4m3fn"}
NL_MEMORY = {"sbuf": "nl.sbuf", "psum": "nl.psum", "hbm": "nl.shared_hbm"}
#: The ``nl.*`` op of each program op: the graph's elementwise ops (their NKI spelling) and ``copy``.
NL_OPS: Mapping[str, str] = MappingProxyType({**{op: op.nki for op in ElementwiseOp}, "copy": "nl.copy",
                                              "square": "nl.square", "rsqrt": "nl.rsqrt", "subtract": "nl.subtract",
                                              "divide": "nl.divide", "minimum": "nl.minimum",
                                              "maximum": "nl.maximum"})
#: The statements of the norm prologue, printed in the nki dialect only.
PROLOGUE_STATEMENTS = (ActivationReduce, BnStats, BnAggr, TensorScalar, Memset)


def _operand(value: object) -> str:
    """A scale or bias: a region's code, or a number (Python's repr, exact)."""
    return value.code() if hasattr(value, "code") else repr(float(value))  # type: ignore[union-attr]

#: Each dialect and its one-line description (kernel file headers, ``--dialect`` choices).
DIALECTS: Mapping[Dialect, str] = MappingProxyType({dialect: dialect.description for dialect in Dialect})


def _imports(dialect: Dialect) -> tuple[str, ...]:
    """The import lines of a kernel file in ``dialect``: its NKI module as ``nki``, ``nisa``, ``nl``."""
    module = dialect.module
    top = f"import {module}" if module == "nki" else f"import {module} as nki"
    return (top, f"import {module}.isa as nisa", f"import {module}.language as nl")


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(literal(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


class _Printer:
    dialect: Dialect
    imports: tuple[str, ...] = ()

    def __init__(self, sdk: str | None = None) -> None:
        """A printer of kernels for Neuron SDK release ``sdk`` (None: the newest release of the dialect)."""
        self.lines: list[str] = []
        self.sdk = sdk or newest_release(self.dialect)

    def file_imports(self, programs: list[Program]) -> tuple[str, ...]:
        """The import lines of a file holding ``programs``: :attr:`imports`, and what their calls need besides."""
        return self.imports

    def emit(self, depth: int, text: str) -> None:
        self.lines.append(INDENT * depth + text)

    def kernel(self, program: Program) -> list[str]:
        """The kernel's lines, its named tile sizes (:class:`~neuronmm_compiler.kernel_ir.expr.Named`) declared at
        its top; a name the program gives two values is printed as numbers instead."""
        taken = {b.name for b in (*program.params, *program.outputs)} | {
            stmt.buffer.name if isinstance(stmt, Alloc) else stmt.var for stmt, _ in walk(program.body)
            if isinstance(stmt, Alloc | Loop)}
        off = frozenset(taken)  # a name the kernel binds otherwise stays a number
        while True:
            with naming(off) as names:
                lines = self._kernel(program)
            clashes = frozenset(name for name, (values, _, _) in names.used.items() if len(values) > 1)
            if not clashes:
                break
            off |= clashes
        declarations: list[str] = []
        computed: list[str] = []  # declared after the program id, which they may read
        derived = {name: i for i, name in enumerate(names.derived)}  # computed from the names above them, in order

        def order(item: tuple[str, tuple[set[int], str, str]]) -> tuple[int, int, str]:
            name, (_, _, source) = item
            return (1, derived[name], "") if name in derived else (0 if source else 2, 0, name)

        for name, (values, note, source) in sorted(names.used.items(), key=order):
            value = values.pop()
            line = f"{INDENT}{name} = {source or value}" + (f"  # {note}" if note else "")
            (computed if name in derived else declarations).append(line)
            if source and name not in derived:  # read from the arguments: at most the size the program was built for
                declarations.append(f"{INDENT}assert 1 <= {name} <= {value}, f\"{name} = {{{name}}}: this kernel "
                                    f"takes 1 to {value}\"")
        return (lines[:self.top] + declarations + lines[self.top:self.computed_at] + computed
                + lines[self.computed_at:])

    def _kernel(self, program: Program) -> list[str]:
        self.lines = []
        args = ", ".join(p.name for p in program.params)
        self.emit(0, "@nki.jit")
        self.emit(0, f"def {program.name}({args}):")
        doc_lines = program.doc.splitlines() or [program.name]
        self.emit(1, '"""' + doc_lines[0])
        for line in doc_lines[1:]:
            self.emit(1, line)
        self.emit(1, '"""')
        self.top = len(self.lines)
        for p in program.params:
            shape = _shape(p.shape)
            self.emit(1, f"assert tuple({p.name}.shape) == {shape}, "
                         f"f\"{p.name}: expected shape {shape}, got {{{p.name}.shape}}\"")
        if program.programs > 1:
            n = program.programs
            self.emit(1, f"assert nl.num_programs() == {n}, f\"an LNC={n} kernel launched with {{nl.num_programs()}} "
                         f"program(s): launch it on a logical core of {n} physical cores (see the file header)\"")
            self.emit(1, f"{PROGRAM_ID} = nl.program_id(0)  # this program's share of the '{program.split}' split "
                         f"(0..{n - 1})")
        self.computed_at = len(self.lines)
        for lhs, rhs, why in program.checks:
            self.emit(1, f"assert {code(lhs)} == {code(rhs)}, f{why!r}")
        for out in program.outputs:
            self.emit(1, f"{out.name} = nl.ndarray({_shape(out.shape)}, dtype={NL_DTYPES[out.dtype]}, "
                         f"buffer=nl.shared_hbm)")
        self.block(program.body, 1)
        outs = ", ".join(o.name for o in program.outputs)
        self.emit(1, f"return {outs}")
        return self.lines

    def block(self, body: list[Stmt], depth: int) -> None:
        for stmt in body:
            self.stmt(stmt, depth)

    def stmt(self, stmt: Stmt, depth: int) -> None:
        if isinstance(stmt, Comment):
            self.emit(depth, f"# {stmt.text}")
        elif isinstance(stmt, Loop):
            if stmt.comment:
                self.emit(depth, f"# {stmt.comment}")
            self.emit(depth, f"for {stmt.var} in {self.range_call(stmt)}:")
            self.block(stmt.body, depth + 1)
        elif isinstance(stmt, Alloc):
            if stmt.comment:
                self.emit(depth, f"# {stmt.comment}")
            self.alloc(stmt, depth)
        else:
            self.instruction(stmt, depth)

    def alloc(self, stmt: Alloc, depth: int) -> None:
        """``name = nl.ndarray(...)``, or for a list buffer (:attr:`Buffer.entries`) the migration guide's list
        filled by a loop unrolled at trace time (:mod:`~neuronmm_compiler.kernel_ir.psum_banks`)."""
        buffer = stmt.buffer
        fn, memset = self.allocation(stmt)
        call = f"{fn}({_shape(buffer.shape)}, dtype={NL_DTYPES[buffer.dtype]}, buffer={NL_MEMORY[buffer.memory]})"
        target = buffer.name
        if buffer.entries:
            each = ", one PSUM bank each (NKI-PSUM-TILE-FMAX)" if buffer.memory == "psum" else ""
            self.emit(depth, f"{buffer.name} = []  # {buffer.entries} tiles{each}")
            self.emit(depth, f"for {ENTRY_VAR} in {self.static_range(buffer.entries)}:")
            depth, target = depth + 1, f"{buffer.name}[{ENTRY_VAR}]"
            self.emit(depth, f"{buffer.name}.append({call})")
        else:
            self.emit(depth, f"{buffer.name} = {call}")
        if memset:
            self.emit(depth, f"nisa.memset(dst={target}, value=0.0)")

    def allocation(self, stmt: Alloc) -> tuple[str, bool]:
        """(the allocating function, whether a memset zeroes the tile after it)."""
        raise NotImplementedError

    def static_range(self, trip: int) -> str:
        """A loop over ``range(trip)`` whose variable is a Python int at trace time."""
        raise NotImplementedError

    def range_call(self, loop: Loop) -> str:
        raise NotImplementedError

    def instruction(self, stmt: Stmt, depth: int) -> None:
        raise NotImplementedError


class NkiPrinter(_Printer):
    """NKI 0.3+."""

    dialect = Dialect.NKI
    imports = _imports(dialect)
    #: An exchange through nki.lnc imports it: no page says ``import nki`` alone loads it (conservatively).
    LNC_IMPORT = "import nki.lnc"

    def file_imports(self, programs: list[Program]) -> tuple[str, ...]:
        return self.imports + ((self.LNC_IMPORT,) if uses_nki_lnc(self.sdk) and exchanges(programs) else ())

    def range_call(self, loop: Loop) -> str:
        return f"range({code(loop.trip)})"

    def static_range(self, trip: int) -> str:
        return f"range({trip})"

    def allocation(self, stmt: Alloc) -> tuple[str, bool]:
        return "nl.ndarray", stmt.zero

    def instruction(self, stmt: Stmt, depth: int) -> None:
        if isinstance(stmt, DmaCopy):
            fn = "nisa.dma_transpose" if stmt.transpose else "nisa.dma_copy"
            src = _pattern_source(stmt) if stmt.broadcast or stmt.fold or stmt.slabs else stmt.src.code()
            self.emit(depth, f"{fn}(dst={stmt.dst.code()}, src={src})")
        elif isinstance(stmt, Matmul):
            start = ", accumulate=False" if stmt.overwrite else ""
            mode = "" if stmt.perf_mode == "none" else f", perf_mode=nisa.matmul_perf_mode.{stmt.perf_mode}"
            self.emit(depth, f"nisa.nc_matmul(dst={stmt.dst.code()}, stationary={stmt.stationary.code()}, "
                             f"moving={stmt.moving.code()}{start}{_pe_tile(stmt)}{mode})")
        elif isinstance(stmt, PeTranspose):
            self.emit(depth, f"nisa.nc_transpose(dst={stmt.dst.code()}, data={stmt.src.code()})")
        elif isinstance(stmt, Copy):
            self.emit(depth, f"nisa.tensor_copy(dst={stmt.dst.code()}, src={stmt.src.code()})")
        elif isinstance(stmt, TensorTensor):
            self.emit(depth, f"nisa.tensor_tensor(dst={stmt.dst.code()}, data1={stmt.lhs.code()}, "
                             f"data2={stmt.rhs.code()}, op={NL_OPS[stmt.op]})")
        elif isinstance(stmt, Activation):
            extra = "" if not isinstance(stmt.scale, Ref) and stmt.scale == 1.0 else f", scale={_operand(stmt.scale)}"
            extra += "" if stmt.bias is None else f", bias={stmt.bias.code()}"
            self.emit(depth, f"nisa.activation(dst={stmt.dst.code()}, op={NL_OPS[stmt.op]}, "
                             f"data={stmt.src.code()}{extra})")
        elif isinstance(stmt, ActivationReduce):
            extra = "" if stmt.scale == 1.0 else f", scale={_operand(stmt.scale)}"
            self.emit(depth, f"nisa.activation_reduce(dst={stmt.dst.code()}, op={NL_OPS[stmt.op]}, "
                             f"data={stmt.src.code()}, reduce_op=nl.add, reduce_res={stmt.reduce_res.code()}{extra})")
        elif isinstance(stmt, BnStats):
            self.emit(depth, f"nisa.bn_stats(dst={stmt.dst.code()}, data={stmt.src.code()})")
        elif isinstance(stmt, BnAggr):
            self.emit(depth, f"nisa.bn_aggr(dst={stmt.dst.code()}, data={stmt.src.code()})")
        elif isinstance(stmt, TensorScalar):
            second = ("" if stmt.op1 is None or stmt.operand1 is None
                      else f", op1={NL_OPS[stmt.op1]}, operand1={_operand(stmt.operand1)}")
            self.emit(depth, f"nisa.tensor_scalar(dst={stmt.dst.code()}, data={stmt.src.code()}, "
                             f"op0={NL_OPS[stmt.op0]}, operand0={_operand(stmt.operand0)}{second})")
        elif isinstance(stmt, TensorScalarReduce):  # a per-token absolute maximum (lowerings/row_scales.py)
            self.emit(depth, f"nisa.tensor_scalar_reduce(dst={stmt.dst.code()}, data={stmt.src.code()}, op0=nl.abs, "
                             f"operand0=0.0, reduce_op=nl.maximum, reduce_res={stmt.reduce_res.code()})")
        elif isinstance(stmt, TensorReduce):
            self.emit(depth, f"nisa.tensor_reduce(dst={stmt.dst.code()}, op=nl.maximum, data={stmt.src.code()}, "
                             "axis=1)")
        elif isinstance(stmt, Memset):
            self.emit(depth, f"nisa.memset(dst={stmt.dst.code()}, value={_operand(stmt.value)})")
        elif isinstance(stmt, SendRecv):
            peer = f"1 - {PROGRAM_ID}"
            args = f"src={stmt.src.code()}, dst={stmt.dst.code()}, send_to_rank={peer}, recv_from_rank={peer}"
            if uses_nki_lnc(self.sdk):  # NKI 0.8.0: nki.lnc.sendrecv(src, dst, send_to_rank, recv_from_rank, ...)
                self.emit(depth, f"nki.lnc.sendrecv({args})")
            else:  # NKI 0.3 to 0.7: nki.isa.sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, ...)
                self.emit(depth, f"nisa.sendrecv({args}, pipe_id=0)")
        else:  # pragma: no cover - every statement kind is handled above
            raise TypeError(f"cannot print {type(stmt).__name__}")


class NeuronxccPrinter(_Printer):
    """NKI 0.1 (neuronxcc.nki)."""

    dialect = Dialect.NEURONXCC
    imports = _imports(dialect)

    def range_call(self, loop: Loop) -> str:
        if _unrolled_at_trace(loop):
            fn = "nl.static_range"
        elif loop.sequential:
            fn = "nl.sequential_range"
        else:
            fn = "nl.affine_range"
        return f"{fn}({code(loop.trip)})"

    def static_range(self, trip: int) -> str:
        return f"nl.static_range({trip})"

    def allocation(self, stmt: Alloc) -> tuple[str, bool]:
        return "nl.zeros" if stmt.zero or stmt.accumulator else "nl.ndarray", False

    def instruction(self, stmt: Stmt, depth: int) -> None:
        if isinstance(stmt, DmaCopy) and stmt.slabs:
            raise ScheduleError("weight_dma=block (a weight block in one DMA through an access pattern) is emitted "
                                "in the nki dialect (NKI 0.2+) only; use --dialect nki or weight_dma=row")
        pattern = isinstance(stmt, DmaCopy) and (stmt.broadcast or stmt.fold)
        if pattern or (isinstance(stmt, Matmul) and stmt.perf_mode != "none"):
            raise ScheduleError("FP8 kernels (scale loads by access pattern, double_row matmuls) are emitted in the "
                                "nki dialect (NKI 0.3+) only; use --dialect nki (on trn2 or trn3; "
                                "docs/quantization.md)")
        if isinstance(stmt, DmaCopy):
            if stmt.is_load:
                fn = "nl.load_transpose2d" if stmt.transpose else "nl.load"
                self.emit(depth, f"{stmt.dst.code()} = {fn}({stmt.src.code()})")
            else:
                self.emit(depth, f"nl.store({stmt.dst.code()}, value={stmt.src.code()})")
        elif isinstance(stmt, Matmul):
            assign = "=" if stmt.overwrite else "+="
            self.emit(depth, f"{stmt.dst.code()} {assign} nisa.nc_matmul({stmt.stationary.code()}, "
                             f"{stmt.moving.code()}{_pe_tile(stmt)})")
        elif isinstance(stmt, PeTranspose):
            self.emit(depth, f"{stmt.dst.code()} = nisa.nc_transpose({stmt.src.code()})")
        elif isinstance(stmt, Copy):
            self.emit(depth, f"{stmt.dst.code()} = nl.copy({stmt.src.code()}, "
                             f"dtype={NL_DTYPES[stmt.dst.buffer.dtype]})")
        elif isinstance(stmt, TensorTensor):
            self.emit(depth, f"{stmt.dst.code()} = {NL_OPS[stmt.op]}({stmt.lhs.code()}, {stmt.rhs.code()}, "
                             f"dtype={NL_DTYPES[stmt.dst.buffer.dtype]})")
        elif isinstance(stmt, PROLOGUE_STATEMENTS) or (
                isinstance(stmt, Activation) and (stmt.bias is not None or isinstance(stmt.scale, Ref)
                                                  or stmt.scale != 1.0)):
            raise ScheduleError("the norm prologue (--fuse-norm, a graph's rmsnorm/layernorm) is emitted in the nki "
                                "nki dialect (NKI 0.3+) only; use --dialect nki (on trn2 or trn3)")
        elif isinstance(stmt, Activation):
            self.emit(depth, f"{stmt.dst.code()} = {NL_OPS[stmt.op]}({stmt.src.code()}, "
                             f"dtype={NL_DTYPES[stmt.dst.buffer.dtype]})")
        elif isinstance(stmt, SendRecv):
            raise ScheduleError("nisa.sendrecv (lnc_split=gather, hidden, intermediate) is documented for the nki "
                                "dialect (NKI 0.3+) only; use --dialect nki, or lnc_split=tokens/features")
        else:  # pragma: no cover
            raise TypeError(f"cannot print {type(stmt).__name__}")


def _pe_tile(stmt: Matmul) -> str:
    """The PE tile arguments of a matmul that runs in part of the array (``tile_position`` and ``tile_size``, the
    same keywords in both dialects: NKI API reference, nki.isa.nc_matmul, "Tiling mode"; the NKI 0.1 page, "PE
    tiling"), or nothing."""
    if stmt.tile is None:
        return ""
    position, size = stmt.tile.code()
    return f", tile_position={position}, tile_size={size}"


def _pattern_source(stmt: DmaCopy) -> str:
    """The source of a broadcast or folded load as an access pattern (NKI access patterns, "NKI Access Patterns":
    ``[step, num]`` pairs, the first for partitions). Broadcast: the F contiguous elements of the HBM region, read
    once per partition of the destination (partition step 0): ``t.ap(pattern=[[0, P], [1, F]], offset=o)`` (rule
    NKI-DMA-BROADCAST). Folded: the region's P * F contiguous elements, F per partition:
    ``t.ap(pattern=[[F, P], [1, F]], offset=o)``. Slabs: KT slabs of P rows of an array of C columns, row
    ``kt * P + p`` to partition p, slot kt: ``t.ap(pattern=[[C, P], [P * C, KT], [1, F]], offset=o)`` (rule
    NKI-DMA-SLABS)."""
    src, dst = stmt.src, stmt.dst
    starts = [ix.start if isinstance(ix, Span) else ix.index for ix in src.index]
    extents = [ix.size for ix in src.index if isinstance(ix, Span)]
    row_elems = src.buffer.shape[1] if len(src.buffer.shape) == 2 else 1
    offset = add(scale(starts[0], row_elems), starts[1]) if len(starts) == 2 else starts[0]
    if stmt.slabs:
        part, slots, cols = dst.shape
        return (f"{src.buffer.name}.ap(pattern=[[{row_elems}, {code(part)}], [{code(scale(part, row_elems))}, "
                f"{code(slots)}], [1, {code(cols)}]], offset={code(offset)})")
    if stmt.fold:
        rows, cols = dst.shape
        return f"{src.buffer.name}.ap(pattern=[[{code(cols)}, {code(rows)}], [1, {code(cols)}]], offset={code(offset)})"
    count = extents[0] if len(extents) == 1 or src.buffer.shape[1] == 1 else extents[1]
    return (f"{src.buffer.name}.ap(pattern=[[0, {code(dst.shape[0])}], [1, {code(count)}]], "
            f"offset={code(offset)})")


def _unrolled_at_trace(loop: Loop) -> bool:
    """True when the loop variable appears inside a min() (its iterations differ in shape), selects a rotating
    copy (``i % B``) or indexes a list buffer (``acc_psum[ft]``), which NKI 0.1's symbolic affine/sequential loop
    variables cannot express (rule NKI-LIST-INDEX-STATIC)."""
    for stmt, _ in walk(loop.body):
        exprs = []
        if isinstance(stmt, Loop):
            exprs.append(stmt.trip)
        for ref in refs_of(stmt):
            if ref.entry is not None and loop.var in ref.entry.variables():
                return True
            for ix in ref.index:
                exprs.extend(getattr(ix, a) for a in ("start", "stop", "index") if hasattr(ix, a))
        if any(isinstance(e, Min | Mod | CeilDiv) and loop.var in e.variables() for e in exprs):
            return True
    return False


#: The printer of each dialect.
PRINTERS: Mapping[Dialect, type[_Printer]] = MappingProxyType({p.dialect: p for p in (NkiPrinter, NeuronxccPrinter)})

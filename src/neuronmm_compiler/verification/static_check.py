"""Check an NKI kernel's source against the statically checkable rules of the rule book.

:func:`check_kernel_source` parses the file (nothing is imported or run) and walks it in program order, keeping what
each name was last bound to: an on-chip or HBM allocation (``nl.ndarray`` / ``nl.zeros`` with a literal shape, dtype
and buffer) or a kernel argument (dtype from the file's ``nmmc-metadata`` line when there is one). A rule is reported
only where the source shows the violation: an operand whose buffer or dtype cannot be resolved is not guessed about.
Which rules are checked is :data:`~neuronmm_compiler.verification.rules.RULES` with ``checkable=True``, filtered by
:meth:`Rule.applies` for the dialect, target and SDK.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from ..targets import TARGETS
from ..vocab import Dialect
from . import lnc_api_check, mx_check
from .dma_transpose_check import check_dma_transpose_shape
from .kernel_ast import (
    DTYPE_BYTES,
    access_widths,
    attr_name,
    base_name,
    const_int,
    fold_int_constants,
    is_scalar_index,
    kwarg,
    metadata_dtypes,
    names,
    slice_width,
    subscript_elements,
)
from .pe_tile_check import check_pe_tile
from .rules import (
    ACTIVATION_FUNCTIONS,
    ACTIVATION_FUNCTIONS_LEGACY,
    LANG_WRAPPERS,
    MATMUL_DST_DTYPES,
    MATMUL_INPUT_DTYPES,
    RULES_BY_ID,
)


@dataclass(frozen=True)
class Violation:
    rule_id: str
    line: int
    message: str
    citation: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule_id}: {self.message} [{self.citation}]"

    def as_dict(self) -> dict[str, object]:
        """The JSON form ``nmmc verify --json`` prints: ``{rule, line, message, citation}``."""
        return {"rule": self.rule_id, "line": self.line, "message": self.message, "citation": self.citation}


@dataclass
class _Buffer:
    """What a name is bound to: an allocation (line, shape) or a kernel argument (buffer 'hbm', no shape)."""

    buffer: str  # sbuf, psum, hbm
    dtype: str | None
    line: int
    shape: tuple[int | None, ...] | None = None
    par_index: int = 0  # position of the partition dimension (> 0: block dimensions before nl.par_dim)
    init_by_other: bool = False  # written by a non-matmul instruction (memset, tensor_copy, ...)


class _Checker(ast.NodeVisitor):
    def __init__(self, source: str, dialect: Dialect, target: str, sdk: str | None):
        self.dialect, self.target = dialect, target
        self.hw = TARGETS[target]
        self.active = {rid for rid, rule in RULES_BY_ID.items()
                       if rule.checkable and rule.applies(dialect, target, sdk)}
        self.violations: list[Violation] = []
        self.arg_dtypes = metadata_dtypes(source)
        self.env: dict[str, _Buffer] = {}
        self.import_reported = False
        self.e4m3: dict[str, int] = {}  # the FP8 E4M3 types (legacy, OCP) the kernel declares: first line of each
        self.loop_vars: set[str] = set()  # names bound by a for loop: one integer each, when used as an index
        self.traced_vars: set[str] = set()  # names bound by a loop NKI 0.1 does not unroll at trace time
        self.lists: set[str] = set()  # names bound to a Python list (of tiles: name = [], name.append(tile))
        # enclosing nl.affine_range loops: (loop variable, names the loop allocates, names derived from its variable)
        self.loops: list[tuple[str, set[str], set[str]]] = []

    def report(self, rule_id: str, node: ast.AST, message: str) -> None:
        if rule_id in self.active:
            self.violations.append(Violation(rule_id, getattr(node, "lineno", 1), message,
                                             RULES_BY_ID[rule_id].citation))

    # --- structure ---
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._check_module(node, node.module or "")

    def _check_module(self, node: ast.AST, module: str) -> None:
        top = module.partition(".")[0]
        if top == "neuronxcc" and module.startswith("neuronxcc.nki"):
            self.report("NKI-NEURONXCC-IMPORT", node, f"'{module}' inside a kernel is a compilation error on this SDK")
        lnc_api_check.check_import(self, node, module)
        if top == "nki" and not self.import_reported:
            self.import_reported = True
            self.report("NKI-DIALECT-TRN1", node, "an NKI 0.3+ kernel ('import nki') targets trn1, where NKI 0.3 "
                        "kernels are documented as unsupported")
            self.report("NKI-DIALECT-SDK", node, "an NKI 0.3+ kernel ('import nki') on a Neuron SDK before 2.29, "
                        "which has no NKI 0.3")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for arg in node.args.args:
            self.env[arg.arg] = _Buffer("hbm", self.arg_dtypes.get(arg.arg), node.lineno)
            self._note_e4m3(self.arg_dtypes.get(arg.arg), node)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "identity" and attr_name(node.value) == "nl":
            self.report("NKI-ACTIVATION-OP", node, "nl.identity is not an NKI function; the identity is nl.copy")
        if node.attr in ("benchmark", "profile", "baremetal") and attr_name(node.value) == "nki":
            self.report("NKI-BENCHMARK", node, f"nki.{node.attr} is not available in NKI 0.2+")
        lnc_api_check.check_attribute(self, node)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        if isinstance(node.target, ast.Name):
            self.loop_vars.add(node.target.id)
        affine = (isinstance(node.iter, ast.Call) and attr_name(node.iter.func) == "affine_range"
                  and isinstance(node.target, ast.Name))
        if isinstance(node.target, ast.Name):
            static = isinstance(node.iter, ast.Call) and attr_name(node.iter.func) == "static_range"
            (self.traced_vars.discard if static else self.traced_vars.add)(node.target.id)
        self.visit(node.iter)
        if affine:
            self.loops.append((node.target.id, set(), {node.target.id}))
        for child in node.body + node.orelse:
            self.visit(child)
        if affine:
            self.loops.pop()

    # --- bindings and writes ---
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                self._bind(target.id, node.value)
            else:
                self.visit(target)
                self._write(target, node, augmented=False)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        self.visit(node.target)
        self._write(node.target, node, augmented=isinstance(node.op, ast.Add))
        if isinstance(node.value, ast.Call) and attr_name(node.value.func) == "nc_matmul":
            self._check_matmul(node.value, base_name(node.target))

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id in self.lists:
            symbolic = names(node.slice) & self.traced_vars
            if symbolic and self.dialect is Dialect.NEURONXCC:
                self.report("NKI-LIST-INDEX-STATIC", node, f"the list '{node.value.id}' is indexed by "
                            f"{', '.join(sorted(symbolic))}, a loop variable NKI 0.1 does not unroll at trace time "
                            "(use nl.static_range)")

    def _bind(self, name: str, value: ast.AST) -> None:
        for _var, allocated, derived in self.loops:
            allocated.add(name)
            if names(value) & derived:
                derived.add(name)
        if isinstance(value, ast.List):
            self.lists.add(name)
        else:
            self.lists.discard(name)
        alloc = self._allocation(value)
        if alloc is not None:
            self.env[name] = alloc
        elif isinstance(value, ast.Call) and attr_name(value.func) == "nc_matmul":
            self.env[name] = _Buffer("psum", "float32", value.lineno)
            self._check_matmul(value, None)
        elif name in self.env:
            del self.env[name]

    def _write(self, target: ast.AST, node: ast.AST, *, augmented: bool) -> None:
        name = base_name(target)
        if name is None or name not in self.env or not self.loops:
            return
        buf = self.env[name]
        if augmented and buf.buffer == "psum":
            return
        index = names(target.slice) if isinstance(target, ast.Subscript) else set()
        for var, allocated, derived in self.loops:
            if name not in allocated and not index & derived:
                self.report("NKI-AFFINE-WRITE-RACE", node,
                            f"'{name}' (allocated outside the affine_range loop over '{var}') is written "
                            f"without '{var}' in its index: iterations race")
                return

    def _allocation(self, value: ast.AST) -> _Buffer | None:
        if not (isinstance(value, ast.Call) and attr_name(value.func) in ("ndarray", "zeros")):
            return None
        shape_node, buffer_node = kwarg(value, "shape", 0), kwarg(value, "buffer")
        dtype_node = kwarg(value, "dtype", 1)
        buffer = attr_name(buffer_node) if buffer_node is not None else None  # no default is guessed
        buffer = "hbm" if buffer in ("shared_hbm", "hbm", "private_hbm") else buffer
        dtype = attr_name(dtype_node) if dtype_node is not None else None
        dtype = dtype if dtype in DTYPE_BYTES else None  # e.g. dtype=a.dtype: not known statically
        if not isinstance(shape_node, (ast.Tuple, ast.List)) or buffer not in ("sbuf", "psum", "hbm"):
            return None
        dims: list[int | None] = []
        par_index = 0
        for i, elt in enumerate(shape_node.elts):
            if isinstance(elt, ast.Call) and attr_name(elt.func) == "par_dim" and elt.args:
                par_index, elt = i, elt.args[0]
            dims.append(const_int(elt))
        buf = _Buffer(buffer, dtype, value.lineno, tuple(dims), par_index)
        self._note_e4m3(dtype, value)
        if buffer in ("sbuf", "psum"):
            self._check_tile(buf, value)
        address = kwarg(value, "address")
        if buffer == "psum" and isinstance(address, ast.Tuple) and len(address.elts) == 2:
            offset = const_int(address.elts[1])
            if offset is not None and offset % self.hw.psum_bank_bytes:
                self.report("NKI-PSUM-ALIGN", value, f"PSUM allocation at byte offset {offset}, not the start of "
                            f"a {self.hw.psum_bank_bytes}-byte bank")
        return buf

    def _note_e4m3(self, dtype: str | None, node: ast.AST) -> None:
        if (mode := mx_check.E4M3_MODES.get(dtype or "")) and mode not in self.e4m3:  # an MX _x4: OCP E4M3
            self.e4m3[mode] = node.lineno
            if len(self.e4m3) == 2:  # the second type: reported once
                self.report("NKI-FP8-E4M3-MODE", node, f"float8_e4m3 and float8_e4m3fn in one kernel {self.e4m3}")

    def _check_tile(self, buf: _Buffer, node: ast.AST) -> None:
        assert buf.shape is not None
        partitions = buf.shape[buf.par_index] if buf.shape else None
        if partitions is not None and partitions > self.hw.pmax:
            self.report("NKI-PARTITION-MAX", node, f"partition dimension {partitions} > pmax {self.hw.pmax}")
        if buf.par_index > 0:
            self.report("NKI-BLOCK-DIM", node, f"{buf.par_index} block dimension(s) before nl.par_dim")
        free = buf.shape[buf.par_index + 1:]
        size = DTYPE_BYTES.get(buf.dtype or "")
        if buf.buffer == "psum" and size and all(d is not None for d in free):
            nbytes = math.prod(free) * size  # type: ignore[arg-type]
            if nbytes > self.hw.psum_bank_bytes:
                self.report("NKI-PSUM-TILE-FMAX", node,
                            f"PSUM tile of {nbytes} bytes per partition exceeds one bank "
                            f"({self.hw.psum_bank_bytes} bytes)" + (
                                "; split it into one-bank tiles" if buf.par_index == 0 else ""))

    # --- ISA calls ---
    def _resolve(self, node: ast.AST | None) -> _Buffer | None:
        name = base_name(node) if node is not None else None
        return self.env.get(name) if name else None

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        name = attr_name(node.func)
        if name == "append" and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in self.lists and len(node.args) == 1:
            tile = self._allocation(node.args[0])  # name.append(nl.ndarray(...)): every entry is such a tile
            if tile is not None:
                self.env[node.func.value.id] = tile
        nki = self.dialect is Dialect.NKI
        for extra in (lnc_api_check, mx_check):  # the nki dialect's NKI 0.8.0 API moves and MX calls
            extra.check_call(self, node, name)
        if name == "nc_matmul" and nki:
            self._check_matmul(node, base_name(kwarg(node, "dst", 0)))
        elif name == "dma_transpose":
            self.report("NKI-DMA-TRANSPOSE-TARGET", node, f"nisa.dma_transpose is not documented on {self.target}")
            src = self._resolve(kwarg(node, "src", 1 if nki else 0))
            if src is not None and src.dtype in DTYPE_BYTES and DTYPE_BYTES[src.dtype] != 2:
                self.report("NKI-DMA-TRANSPOSE-DTYPE", node, f"dma_transpose of a {src.dtype} source (2-byte only)")
            if nki:
                check_dma_transpose_shape(self, node)
        elif name == "load_transpose2d":
            widths = self._operand_widths(kwarg(node, "src", 0))
            if widths and widths[-1] is not None and widths[-1] > self.hw.pmax:
                self.report("NKI-LOAD-TRANSPOSE2D", node, f"load_transpose2d of a source whose last dimension "
                            f"{widths[-1]} (the result's partition dimension) exceeds pmax {self.hw.pmax}")
        elif name == "dynamic_range" and attr_name(getattr(node.func, "value", None)) == "nl":
            self.report("NKI-DYNAMIC-LOOP", node, "nl.dynamic_range is removed in NKI 0.7 (use nl.fori_loop)")
        elif name in LANG_WRAPPERS and nki and attr_name(getattr(node.func, "value", None)) == "nl":
            self.report("NKI-LANG-WRAPPERS", node, f"nl.{name} is not in NKI 0.2 (use nisa.{LANG_WRAPPERS[name]})")
        elif name == "activation":
            op = kwarg(node, "op", 1 if nki else 0)
            allowed = ACTIVATION_FUNCTIONS if nki else ACTIVATION_FUNCTIONS_LEGACY
            if isinstance(op, ast.Attribute) and op.attr not in allowed:
                self.report("NKI-ACTIVATION-OP", node, f"activation op nl.{op.attr} is not a documented function")
            for role, pos in (("dst", 0), ("data", 2)) if nki else ():
                buf = self._resolve(kwarg(node, role, pos))
                if buf is not None and buf.buffer == "hbm":
                    self.report("NKI-ACTIVATION-DTYPE", node, f"activation {role} is in HBM (SBUF or PSUM only)")
        elif name == "nc_transpose" and nki:
            dst, data = self._resolve(kwarg(node, "dst", 0)), self._resolve(kwarg(node, "data", 1))
            if dst and data and dst.dtype and data.dtype and dst.dtype != data.dtype:
                self.report("NKI-TRANSPOSE-DTYPE", node, f"nc_transpose {data.dtype} -> {dst.dtype}: dtypes differ")
        elif name == "tensor_tensor" and nki:
            one, two = self._resolve(kwarg(node, "data1", 1)), self._resolve(kwarg(node, "data2", 2))
            if one and two and one.buffer == two.buffer == "psum":
                self.report("NKI-TENSOR-TENSOR-PSUM", node, "tensor_tensor with both operands in PSUM")
        elif name == "tensor_copy" and nki:
            src = self._resolve(kwarg(node, "src", 1))
            if src is not None and src.buffer == "hbm":
                self.report("NKI-TENSOR-COPY", node, "tensor_copy src is in HBM (use dma_copy)")
        elif name == "dma_copy" and nki:
            for role, pos in (("dst", 0), ("src", 1)):
                buf = self._resolve(kwarg(node, role, pos))
                if buf is not None and buf.buffer == "psum":
                    self.report("NKI-DMA-COPY-PSUM", node, f"dma_copy {role} is in PSUM")
        if nki and name in ("memset", "tensor_copy", "activation", "tensor_tensor", "tensor_scalar"):
            dst = self._resolve(kwarg(node, "dst", 0))
            if dst is not None and dst.buffer == "psum":
                dst.init_by_other = True
        if not nki and name == "store" and self.loops and node.args:
            self._write(node.args[0], node, augmented=False)

    def _operand_widths(self, node: ast.AST | None) -> tuple[int | None, ...] | None:
        """The shape of an operand as the source shows it: a subscript's sliced widths, or a whole allocation's
        shape (without block dimensions); None when unknown."""
        buf = self._resolve(node)
        if isinstance(node, ast.Subscript):
            return access_widths(node, self.loop_vars, buf.par_index if buf is not None else 0)
        if isinstance(node, ast.Name) and buf is not None and buf.shape and buf.par_index == 0:
            return buf.shape
        return None

    def _tile_shape(self, node: ast.AST | None) -> tuple[int | None, int | None] | None:
        """(partition size, free size) of an operand: a subscript's selected widths (block indices, before the
        partition dimension, left out; an index of one integer selects 1), or a whole allocation."""
        buf = self._resolve(node)
        if isinstance(node, ast.Subscript):
            elts = subscript_elements(node)[buf.par_index if buf is not None else 0:]
            widths = [slice_width(e) if isinstance(e, ast.Slice) else 1 if is_scalar_index(e, self.loop_vars)
                      else None for e in elts]
            if not widths:
                return None
            free = None if any(w is None for w in widths[1:]) else math.prod(widths[1:])  # type: ignore[arg-type]
            return widths[0], free
        if isinstance(node, ast.Name) and buf is not None and buf.shape and buf.par_index == 0:
            rest = buf.shape[1:]
            return buf.shape[0], None if any(d is None for d in rest) else math.prod(rest)  # type: ignore[arg-type]
        return None

    def _check_matmul_sizes(self, stationary: ast.AST | None, moving: ast.AST | None, call: ast.Call) -> None:
        for role, node, rule_id, fmax in (
                ("stationary", stationary, "NKI-MATMUL-STATIONARY-FMAX", self.hw.gemm_stationary_fmax),
                ("moving", moving, "NKI-MATMUL-MOVING-FMAX", self.hw.gemm_moving_fmax)):
            shape = self._tile_shape(node)
            if shape is None:
                continue
            partitions, free = shape
            if partitions is not None and partitions > self.hw.pmax:
                self.report("NKI-PARTITION-MAX", call, f"nc_matmul {role} has {partitions} partitions > "
                            f"{self.hw.pmax}")
            if free is not None and free > fmax:
                self.report(rule_id, call, f"nc_matmul {role} free size {free} > {fmax}")

    def _check_matmul(self, call: ast.Call, dst_name: str | None) -> None:
        nki = self.dialect is Dialect.NKI
        stationary_node = kwarg(call, "stationary", 1 if nki else 0)
        moving_node = kwarg(call, "moving", 2 if nki else 1)
        self._check_matmul_sizes(stationary_node, moving_node, call)
        check_pe_tile(self, call, stationary_node, kwarg(call, "dst", 0) if nki else None)
        stationary, moving = self._resolve(stationary_node), self._resolve(moving_node)
        dst = self.env.get(dst_name) if dst_name else None
        for role, buf, want in (("stationary", stationary, "sbuf"), ("moving", moving, "sbuf"), ("dst", dst, "psum")):
            if buf is not None and buf.buffer != want:
                self.report("NKI-MATMUL-MEMORY", call, f"nc_matmul {role} is in {buf.buffer.upper()}, not "
                            f"{want.upper()}")
        for role, buf in (("stationary", stationary), ("moving", moving)):
            if buf is not None and buf.dtype and buf.dtype not in MATMUL_INPUT_DTYPES:
                self.report("NKI-MATMUL-DTYPE", call, f"nc_matmul {role} dtype {buf.dtype} is not supported")
            elif buf is not None and buf.dtype and buf.dtype[:6] == "float8" and buf.dtype not in self.hw.fp8_formats:
                self.report("NKI-MATMUL-E4M3FN", call, f"nc_matmul {role} dtype {buf.dtype} on {self.target}")
        wide = {"float32", "tfloat32"}
        if stationary and moving and stationary.dtype and moving.dtype and (
                (stationary.dtype in wide) != (moving.dtype in wide)):
            self.report("NKI-MATMUL-DTYPE", call, "a float32 nc_matmul operand needs a float32 partner")
        if dst is not None and dst.dtype and dst.dtype not in MATMUL_DST_DTYPES[self.target]:
            self.report("NKI-MATMUL-DTYPE", call, f"nc_matmul dst dtype {dst.dtype} on {self.target}")
        if dst is not None and dst.init_by_other:
            self.report("NKI-MATMUL-ACC-INIT", call, f"nc_matmul accumulates into '{dst_name}', initialised by a "
                        "non-matmul instruction")


def check_kernel_source(source: str, *, dialect: Dialect | str, target: str, sdk: str | None = None
                        ) -> list[Violation]:
    """Violations of the checkable NKI rules in a kernel file's source, by line. ``sdk`` (``"2.30"``) enables the
    rules bounded by SDK release; without it only the rules that hold on every SDK are checked."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (one of {', '.join(TARGETS)})")
    checker = _Checker(source, Dialect(dialect), target, sdk)
    checker.visit(fold_int_constants(ast.parse(source)))
    return sorted(checker.violations, key=lambda v: (v.line, v.rule_id))

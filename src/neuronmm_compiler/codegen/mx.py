"""Printing the MX instructions (kernel_ir/mx.py; docs/mx.md): ``nisa.nc_matmul_mx`` and ``nisa.quantize_mx`` in the
nki dialect, the ``_x4`` and ``uint8`` dtypes of their tiles, and a refusal in the NKI 0.1 (``neuronxcc``) dialect.

The printers of :mod:`.printer` are extended, not edited: :data:`MX_PRINTERS` holds a subclass of each that prints (or
refuses) the MX statements and hands every other statement to its own, and the MX dtypes are registered in the
printers' dtype table when this module is imported (by :mod:`.emit`, which prints every kernel through
:data:`MX_PRINTERS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..errors import ScheduleError
from ..ir import Node
from ..ir.mx import MX_SCALE_DTYPE, X4_DTYPES, is_mx
from ..ir.mx_graph import scale_name
from ..kernel_ir.expr import add, code, scale
from ..kernel_ir.mx import Interleave, InterleavedLoad, MatmulMx, QuantizeMx
from ..kernel_ir.program import Stmt
from ..vocab import Dialect
from .metadata import TensorSpec
from .printer import NL_DTYPES, NeuronxccPrinter, NkiPrinter, _Printer

__all__ = ["MX_PRINTERS", "mx_call", "mx_input_specs"]

#: The MX dtypes as NKI spells them (NKI ISA reference, nki.isa.nc_matmul_mx, "Data types": "float8_e5m2_x4,
#: float8_e4m3fn_x4, or float4_e2m1fn_x4"; scales uint8, ir/mx.py MX_SCALE_DTYPE)
NL_DTYPES.update({dtype: f"nl.{dtype}" for dtype in (*X4_DTYPES, MX_SCALE_DTYPE)})


def mx_input_specs(node: Node) -> tuple[TensorSpec, ...]:
    """The HBM tensors of a graph input: itself, and after an MX input its scales (ir/mx.py, "Storage")."""
    spec = TensorSpec(node.attrs["name"], node.storage_shape, node.dtype)
    if not is_mx(node.dtype):
        return (spec,)
    rows, cols = node.shape
    return spec, TensorSpec(scale_name(node.attrs["name"]), (16, rows // 128, cols), MX_SCALE_DTYPE)


def mx_call(stmt: MatmulMx | QuantizeMx | Interleave | InterleavedLoad) -> str:
    """The nki dialect's call of an MX statement."""
    if isinstance(stmt, InterleavedLoad):  # src [T, 512] of a row-major [rows, K] argument, read as [P, T, 4]
        rows, cols = stmt.src.index
        pattern = (f"[[1, {code(stmt.dst.index[0].size)}], [{stmt.src.buffer.shape[1]}, {code(rows.size)}], "
                   f"[{code(stmt.dst.index[0].size)}, 4]]")
        start = add(scale(rows.start, stmt.src.buffer.shape[1]), cols.start)
        return (f"nisa.dma_copy(dst={stmt.dst.code()}, src={stmt.src.buffer.name}.ap(pattern={pattern}, "
                f"offset={code(start)}))")
    if isinstance(stmt, Interleave):  # src [P, 4, T] of a [P, tiles, T_block] strip, read as [P, T, 4]
        buf = stmt.src.buffer
        _, tiles, block = buf.shape
        first, tokens = stmt.src.index[1].start, stmt.src.index[2].size
        start = add(scale(first, block), stmt.src.index[2].start)
        pattern = f"[[{tiles * block}, {code(stmt.src.index[0].size)}], [1, {code(tokens)}], [{block}, 4]]"
        return (f"nisa.tensor_copy(dst={stmt.dst.code()}, src={buf.name}.ap(pattern={pattern}, "
                f"offset={code(start)}))")
    if isinstance(stmt, QuantizeMx):
        return f"nisa.quantize_mx(dst={stmt.dst.code()}, src={stmt.src.code()}, dst_scale={stmt.dst_scale.code()})"
    start = ", accumulate=False" if stmt.overwrite else ""
    assert stmt.stationary_scale is not None and stmt.moving_scale is not None
    return (f"nisa.nc_matmul_mx(dst={stmt.dst.code()}, stationary={stmt.stationary.code()}, "
            f"moving={stmt.moving.code()}, stationary_scale={stmt.stationary_scale.code()}, "
            f"moving_scale={stmt.moving_scale.code()}{start})")


class MxNkiPrinter(NkiPrinter):
    """The nki printer, with the MX statements."""

    def instruction(self, stmt: Stmt, depth: int) -> None:
        if isinstance(stmt, MatmulMx | QuantizeMx | Interleave | InterleavedLoad):
            self.emit(depth, mx_call(stmt))
        else:
            super().instruction(stmt, depth)


class MxNeuronxccPrinter(NeuronxccPrinter):
    """The NKI 0.1 printer, refusing the MX statements (never printed as the nc_matmul they subclass)."""

    def instruction(self, stmt: Stmt, depth: int) -> None:
        if isinstance(stmt, MatmulMx | QuantizeMx | Interleave | InterleavedLoad):
            raise ScheduleError("MX kernels (nisa.nc_matmul_mx, nisa.quantize_mx) are emitted in the nki dialect "
                                "(NKI 0.3+) only; use --dialect nki (on trn3; docs/mx.md)")
        super().instruction(stmt, depth)


#: The printer of each dialect (:data:`.printer.PRINTERS`, with the MX statements).
MX_PRINTERS: Mapping[Dialect, type[_Printer]] = MappingProxyType({p.dialect: p for p in (MxNkiPrinter,
                                                                                          MxNeuronxccPrinter)})


def _weight_lines(bits: int) -> str:
    """``reference()`` lines making ``{v}``, the real matrix [K, N] of an MX weight ``{data}`` [K/4, N] of ``bits``-bit
    elements (element j of a packed element in bits ``bits * j ..``) with E8M0 scales ``{scales}`` [16, K/512, N]
    (group g of tile t in row g; row 128t + p of the data holds positions 512t + 128j + p); ``{signs}``,
    ``{mantissas}``, ``{exponents}``: 2^(E + M), 2^M, 2^E of its E exponent and M mantissa bits."""
    codes = ("np.reshape(np.stack(({v}_raw % 16, {v}_raw // 16), axis=-1), ({data}.shape[0], {data}.shape[1], 4))"
             if bits == 4 else "np.reshape({v}_raw, ({data}.shape[0], {data}.shape[1], 4))")
    return f'''{{v}}_raw = np.asarray(np.frombuffer(np.ascontiguousarray({{data}}), dtype=np.uint8), dtype=np.int64)
{{v}}_codes = {codes}
{{v}}_exp = {{v}}_codes // {{mantissas}} % {{exponents}}
{{v}}_frac = {{v}}_codes % {{mantissas}} / {{mantissas}}
{{v}}_elements = (1 - 2 * ({{v}}_codes // {{signs}})) * np.where({{v}}_exp == 0, {{v}}_frac * np.exp2(1 - {{bias}}), \\
    (1 + {{v}}_frac) * np.exp2({{v}}_exp - {{bias}}))
{{v}}_groups = np.exp2(np.asarray({{scales}}, dtype=np.float64) - 127)
{{v}}_rows = np.repeat(np.reshape(np.transpose({{v}}_groups, (1, 0, 2)), \\
    ({{v}}_groups.shape[1] * 16, {{data}}.shape[1])), 8, axis=0)
{{v}}_real = {{v}}_elements * np.reshape({{v}}_rows, ({{data}}.shape[0], {{data}}.shape[1], 1))
{{v}} = np.reshape(np.transpose(np.reshape({{v}}_real, ({{v}}_groups.shape[1], 128, {{data}}.shape[1], 4)), \\
    (0, 3, 1, 2)), ({{data}}.shape[0] * 4, {{data}}.shape[1]))'''


#: ``reference()`` lines making ``{v}``, quantize_mx of ``{x}`` [T, K] (ir/mx.py's rule, spelled with the NumPy a kernel
#: file may use): per 32 positions 512t + 128j + 8g + i (j < 4, i < 8) the scale 2^(floor(log2 max|v|) - (emax - 1))
#: (2^-127 for zeros), the elements rounded to nearest even.
QUANTIZE_LINES = '''{v}_packed = np.transpose(np.reshape({x}, ({x}.shape[0], {x}.shape[1] // 512, 4, 128)), \\
    (0, 1, 3, 2))
{v}_amax = np.max(np.abs(np.reshape({v}_packed, ({x}.shape[0], {x}.shape[1] // 512, 16, 32))), axis=3)
{v}_exps = np.clip(np.frexp(np.where({v}_amax == 0, 1.0, {v}_amax))[1] - {emax}, -127, 127)
{v}_scale = np.reshape(np.exp2(np.repeat(np.where({v}_amax == 0, -127, {v}_exps), 8, axis=2)), \\
    ({x}.shape[0], {x}.shape[1] // 512, 128, 1))
{v}_clipped = np.clip({v}_packed / {v}_scale, -{largest}, {largest})
{v}_quantum = np.exp2(np.maximum(np.frexp({v}_clipped)[1], {min_exp}) - {mbits} - 1)
{v}_values = np.round({v}_clipped / {v}_quantum) * {v}_quantum * {v}_scale
{v} = np.reshape(np.transpose({v}_values, (0, 1, 3, 2)), {x}.shape)'''


def reference_numpy_names() -> str:
    """The source of the MX lines of ``reference()``, for the sandbox's list of NumPy names a kernel file may use."""
    return _weight_lines(4) + _weight_lines(8) + QUANTIZE_LINES


def _format(dtype: str) -> tuple[int, int, int]:
    """(exponent bits, mantissa bits, bias) of an ``_x4`` dtype's element."""
    element = X4_DTYPES[dtype]
    ebits = {"float8_e4m3fn": 4, "float8_e5m2": 5, "float4_e2m1fn": 2}[element.name]
    return ebits, element.mantissa_bits, 2 ** (ebits - 1) - 1


def mx_reference_value(node: Node, arg: str, value: str) -> list[str]:
    """The ``reference()`` lines making ``value``, an MX input's real matrix, from its arguments ``arg`` and its scales
    (indented by the caller)."""
    ebits, mbits, bias = _format(node.dtype)
    bits = 8 * X4_DTYPES[node.dtype].packed_bytes // 4
    text = _weight_lines(bits).format(v=value, data=arg, scales=scale_name(arg), signs=2 ** (ebits + mbits),
                                      mantissas=2 ** mbits, exponents=2 ** ebits, bias=bias)
    return text.splitlines()


def mx_reference_quantize(operand: str, dtype: str, value: str) -> list[str]:
    """The ``reference()`` lines making ``value``, quantize_mx of ``operand`` (indented by the caller)."""
    _, mbits, bias = _format(dtype)
    element = X4_DTYPES[dtype]
    return QUANTIZE_LINES.format(v=value, x=operand, emax=element.emax, largest=element.max, min_exp=2 - bias,
                                 mbits=mbits).splitlines()

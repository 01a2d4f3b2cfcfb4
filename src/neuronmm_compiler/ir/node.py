"""Node-level vocabulary of the graph IR: kinds, dtypes, layouts, annotations, :class:`Node` and shape rules.

:mod:`.graph` builds on this (and re-exports every public name here), :mod:`.verify` and
:mod:`.text` use it. Nothing here touches a graph.

Annotations are string key/value pairs that passes put on *compute* nodes (matmul, transpose,
elementwise); they describe how a node is to be lowered, never what it computes:

- ``orient`` (:class:`~neuronmm_compiler.vocab.Orient`): ``normal`` (the value is held with its
  first logical dim on the partition axis, row-major) or ``transposed`` (its last logical dim on
  partitions: the value's transpose, feature-major). Set by ``implicit-transpose``.
- ``kernel``: an identifier naming the fused kernel the node belongs to (``k0``, ``k1``, ...).
  Set by ``fuse``.
- ``place``: ``sbuf`` (the value stays on chip inside its kernel) or ``hbm`` (it is written to
  HBM: a graph output, or handed to a later kernel). Set by ``place``.
"""

from __future__ import annotations

import keyword
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import InputError, IRError, UnknownNameError
from ..vocab import ElementwiseOp, Layout, NodeKind, NormOp, Orient
from .fp8 import FP8_FORMATS, MX_DTYPES, is_fp8, mx_refusal
from .mx import X4_DTYPES
from .mx_graph import applies as mx_applies
from .mx_graph import mx_result

#: Canonical dtype names; the packed MX dtypes (``float8_e4m3fn_x4``, ...; ir/mx.py) only as nmmc's MX frontends and
#: passes spell them (not in :data:`DTYPE_ALIASES`, which graph files read).
DTYPES: tuple[str, ...] = ("bfloat16", "float32", "float8_e4m3", "float8_e5m2", "float8_e4m3fn", *X4_DTYPES)
#: Accepted spellings (lower case) and the canonical dtype each one means.
DTYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32",
     "fp8": "float8_e4m3", "fp8_e4m3": "float8_e4m3", "float8_e4m3": "float8_e4m3",
     "fp8_e5m2": "float8_e5m2", "float8_e5m2": "float8_e5m2",
     "fp8_e4m3fn": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn"}
)
#: The bf16 and fp32 spellings: what a graph file may declare (FP8 graphs come from ``--mlp --dtype fp8``,
#: docs/quantization.md).
PLAIN_DTYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {k: v for k, v in DTYPE_ALIASES.items() if v in ("bfloat16", "float32")})
#: How an input or output is stored in HBM (:class:`~neuronmm_compiler.vocab.Layout`): as its
#: logical shape, or as its transpose (2-D only).
LAYOUTS: tuple[Layout, ...] = tuple(Layout)
#: Node kinds (:class:`~neuronmm_compiler.vocab.NodeKind`).
KINDS: tuple[NodeKind, ...] = tuple(NodeKind)
#: The kinds that compute a value on chip; only these carry annotations.
COMPUTE_KINDS: tuple[NodeKind, ...] = tuple(kind for kind in NodeKind if kind.is_compute)
#: Elementwise ops (:class:`~neuronmm_compiler.vocab.ElementwiseOp`) and their operand counts.
ELEMENTWISE_ARITY: Mapping[ElementwiseOp, int] = MappingProxyType({op: op.arity for op in ElementwiseOp})
#: Edge attribute holding the operand positions of the source in the target.
OPERAND_INDICES = "operand_indices"
#: Values of the ``orient`` annotation (:class:`~neuronmm_compiler.vocab.Orient`): first logical
#: dim on partitions, or last (the transpose).
ORIENTS: tuple[Orient, ...] = tuple(Orient)
#: Values of the ``place`` annotation: where a computed value lives.
PLACES: tuple[str, ...] = ("sbuf", "hbm")
#: Known annotation keys and their accepted values (None: any identifier). ``group`` (the id of the
#: node whose group evaluates the value, see passes/group_epilogues.py) and ``acc`` (the id of the
#: PSUM accumulator it is summed into) name nodes.
ANNOTATION_VALUES: Mapping[str, tuple[str, ...] | None] = MappingProxyType(
    {"kernel": None, "orient": ORIENTS, "place": PLACES, "group": None, "acc": None}
)

_ID_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def canonical_dtype(dtype: Any) -> str:
    """Return the canonical dtype string (one of :data:`DTYPES`) for an alias or NumPy dtype.

    Accepts "bf16", "bfloat16", "fp32", "float32", "fp8" (= "float8_e4m3"), "fp8_e4m3", "float8_e4m3", "fp8_e5m2",
    "float8_e5m2", "fp8_e4m3fn", "float8_e4m3fn" (any case) and NumPy / ml_dtypes dtypes of those (docs/quantization.md
    for
    the FP8 formats).
    Anything else raises :class:`InputError` listing what is accepted.
    """
    if isinstance(dtype, str):
        key = dtype.strip().lower()
    else:
        import numpy as np  # a dtype object: its caller has NumPy loaded already

        try:
            key = np.dtype(dtype).names[0] if np.dtype(dtype).names else np.dtype(dtype).name  # an _x4: its field
        except TypeError:
            key = repr(dtype)
    if key in DTYPE_ALIASES:
        return DTYPE_ALIASES[key]
    if key in X4_DTYPES:
        return key
    if key in MX_DTYPES:
        raise InputError(mx_refusal(key))
    accepted = ", ".join(DTYPE_ALIASES)
    raise InputError(f"unknown dtype {dtype!r}; accepted: {accepted}")


def format_shape(shape: Iterable[Any]) -> str:
    """Format a shape as in the text form: ``[1024, 512]``."""
    return "[" + ", ".join(str(dim) for dim in shape) + "]"


def is_identifier(text: Any) -> bool:
    """True when ``text`` is a Python identifier (ASCII) that is not a keyword."""
    return isinstance(text, str) and bool(_ID_PATTERN.match(text)) and not keyword.iskeyword(text)


def check_identifier(text: Any, what: str) -> str:
    """Return ``text`` if it is an identifier (see :func:`is_identifier`), else raise InputError."""
    if not is_identifier(text):
        raise InputError(
            f"{what} must be a Python identifier that is not a keyword "
            f"(letters, digits, underscores; not starting with a digit); got {text!r}"
        )
    return text


def check_shape(shape: Any, what: str) -> tuple[int, ...]:
    """Return ``shape`` as a tuple of positive ints, or raise InputError."""
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    ok = bool(dims) and all(
        isinstance(dim, numbers.Integral) and not isinstance(dim, bool) and dim > 0 for dim in dims
    )
    if not ok:
        raise InputError(f"{what}: shape must be a non-empty list of positive integers; got {shape!r}")
    return tuple(int(dim) for dim in dims)


def check_layout(layout: Any, shape: tuple[int, ...], what: str) -> Layout:
    """Return ``layout`` as a :class:`Layout` if it is one and fits ``shape``, else raise InputError."""
    checked = Layout.lookup(layout)
    if checked is None:
        raise InputError(f"{what}: unknown layout {layout!r}; accepted: {', '.join(LAYOUTS)}")
    if checked == Layout.TRANSPOSED and len(shape) != 2:
        raise InputError(f"{what}: layout 'transposed' needs a 2-D shape; got {format_shape(shape)}")
    return checked


def check_annotation(key: Any, value: Any) -> None:
    """Check one annotation: UnknownNameError for an unknown key, InputError for a bad value."""
    if key not in ANNOTATION_VALUES:
        raise UnknownNameError(f"unknown annotation key {key!r}; known: {', '.join(ANNOTATION_VALUES)}")
    accepted = ANNOTATION_VALUES[key]
    if accepted is None:
        if not is_identifier(value):
            raise InputError(f"annotation {key}={value!r}: the value must be an identifier (e.g. k0)")
    elif value not in accepted:
        raise InputError(f"annotation {key}={value!r} is not valid; accepted: {', '.join(accepted)}")


def format_annotations(annotations: Mapping[str, Any]) -> str:
    """Annotations as in the text form, keys sorted: ``{kernel=k0, orient=normal}``."""
    return "{" + ", ".join(f"{key}={value}" for key, value in sorted(annotations.items())) + "}"


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Node:
    """A read-only view of one node.

    ``attrs`` are what the node *is* (an input's name and layout, an elementwise op, an output's
    name and layout); ``annotations`` are how passes decided to lower it (``orient``, ``kernel``,
    ``place``; compute nodes only, empty elsewhere).
    """

    id: str
    kind: NodeKind
    operands: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    attrs: Mapping[str, str] = field(default_factory=_empty)
    annotations: Mapping[str, str] = field(default_factory=_empty)

    @property
    def name(self) -> str | None:
        """The user-visible name of an input or output (its kernel argument name), else None."""
        return self.attrs.get("name")

    @property
    def layout(self) -> Layout | None:
        """The HBM layout of an input or output (``row_major`` or ``transposed``), else None."""
        if self.kind not in (NodeKind.INPUT, NodeKind.OUTPUT):
            return None
        layout = self.attrs.get("layout", Layout.ROW_MAJOR)
        return Layout.lookup(layout) or layout  # type: ignore[return-value]  # unverified: as stored

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """The shape as stored in HBM: reversed for a ``transposed`` input or output, else ``shape``."""
        if self.layout == Layout.TRANSPOSED:
            return tuple(reversed(self.shape))
        return self.shape


def norm_eps(node_id: str, attrs: Mapping[str, str]) -> float:
    """The ``eps`` of a norm node: a finite positive float, stored as its ``repr`` (IRError otherwise)."""
    text = attrs.get("eps")
    try:
        eps = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        eps = float("nan")
    if not (0.0 < eps < 1.0) or repr(eps) != text:
        raise IRError(f"norm %{node_id}: eps must be a float in (0, 1) written as Python's repr of it "
                      f"(e.g. 1e-06); got {text!r}")
    return eps


def norm_op(node_id: str, attrs: Mapping[str, str]) -> NormOp:
    """The :class:`NormOp` of a norm node (IRError if unknown)."""
    op = NormOp.lookup(attrs.get("norm"))
    if op is None:
        raise IRError(f"norm %{node_id}: unknown normalization {attrs.get('norm')!r}; known: {', '.join(NormOp)}")
    return op


def operand_arity(node_id: str, kind: str, attrs: Mapping[str, str], given: int | None = None) -> int:
    """The number of operands a node of ``kind`` with ``attrs`` takes (IRError if unknown). A norm takes 1 to
    :attr:`NormOp.max_operands`: ``given`` (the count it has) when in that range, else the most it takes."""
    checked = NodeKind.lookup(kind)
    if checked is None:
        raise IRError(f"%{node_id}: unknown node kind {kind!r}; known: {', '.join(KINDS)}")
    if checked == NodeKind.NORM:
        most = norm_op(node_id, attrs).max_operands
        return given if given is not None and 1 <= given <= most else most
    if checked.arity is not None:
        return checked.arity
    op = ElementwiseOp.lookup(attrs.get("op"))
    if op is None:
        raise IRError(f"elementwise %{node_id}: unknown op {attrs.get('op')!r}; known: {', '.join(ElementwiseOp)}")
    return op.arity


def infer_result(
    node_id: str, kind: str, attrs: Mapping[str, str], operands: Sequence[Node]
) -> tuple[tuple[int, ...], str]:
    """Compute the (shape, dtype) a non-input node produces from its operands; IRError on mismatch."""
    where = f"{kind} %{node_id}" if kind != NodeKind.ELEMENTWISE else f"elementwise {attrs.get('op')} %{node_id}"
    expected = operand_arity(node_id, kind, attrs, len(operands))
    if kind == NodeKind.INPUT:
        raise IRError(f"{where}: inputs are declared, their shape is not inferred")
    if len(operands) != expected:
        raise IRError(f"{where} takes {expected} operand(s), got {len(operands)}")
    for operand in operands:
        if operand.kind == NodeKind.OUTPUT:
            raise IRError(f"{where} uses output %{operand.id} as an operand; outputs have no users")
    described = [f"%{op.id} {format_shape(op.shape)} {op.dtype}" for op in operands]
    if kind in (NodeKind.MATMUL, NodeKind.TRANSPOSE):
        for operand in operands:
            if len(operand.shape) != 2:
                raise IRError(f"{where} needs 2-D operands; got {', '.join(described)}")
    if mx_applies(kind, attrs, operands):  # MX values and their quantization (ir/mx_graph.py)
        return mx_result(where, kind, attrs, operands, described)
    scaled = ElementwiseOp.lookup(attrs.get("op")) if kind == NodeKind.ELEMENTWISE else None
    if scaled is not None and scaled.fp8:
        return _scaled_result(where, scaled, attrs, operands, described)
    if kind == NodeKind.MATMUL and (FP8_MATMUL_ATTRS & set(attrs) or (
            not is_fp8(operands[0].dtype) and is_fp8(operands[1].dtype))):
        return _fp8_weight_result(where, attrs, operands, described)
    if len({op.dtype for op in operands}) > 1:
        raise IRError(f"{where}: operand dtypes differ: {', '.join(described)}")
    first = operands[0]
    if kind == NodeKind.NORM:
        norm_eps(node_id, attrs)
        if len(first.shape) != 2:
            raise IRError(f"{where} normalizes the rows of a 2-D value; got {', '.join(described)}")
        for param in operands[1:]:
            if param.shape != (first.shape[1],):
                raise IRError(f"{where}: gamma and beta are 1-D [{first.shape[1]}] (one per column of "
                              f"%{first.id}); got {', '.join(described[1:])}")
        return first.shape, first.dtype
    if kind == NodeKind.MATMUL:
        lhs, rhs = operands
        if lhs.shape[1] != rhs.shape[0]:
            raise IRError(
                f"{where}: contraction sizes differ: lhs %{lhs.id} [M, K] = {format_shape(lhs.shape)}, "
                f"rhs %{rhs.id} [K, N] = {format_shape(rhs.shape)}"
            )
        # an FP8 matmul's result is its fp32 accumulator (PSUM), which a dequantize scales (docs/quantization.md)
        return (lhs.shape[0], rhs.shape[1]), "float32" if is_fp8(lhs.dtype) else lhs.dtype
    if kind == NodeKind.TRANSPOSE:
        return (first.shape[1], first.shape[0]), first.dtype
    if kind == NodeKind.ELEMENTWISE and len({op.shape for op in operands}) > 1:
        raise IRError(f"{where}: operand shapes differ: {', '.join(described)}")
    return first.shape, first.dtype


#: The attrs of an FP8-weight matmul (``lhs @ W`` with ``W`` an FP8 input, before the ``quantize-fp8`` pass):
#: how its activation is quantized and how its weight is scaled (docs/quantization.md), with their accepted values.
FP8_MATMUL_VALUES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "act_scale": ("static", "row"), "w_scale": ("row", "tensor")})
FP8_MATMUL_ATTRS = frozenset(FP8_MATMUL_VALUES)


def _fp8_weight_result(where: str, attrs: Mapping[str, str], operands: Sequence[Node],
                       described: list[str]) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of an FP8-weight matmul: a bf16/fp32 ``lhs`` [M, K] times an FP8 input ``W`` [K, N], with
    ``act_scale`` and ``w_scale`` attrs saying how the ``quantize-fp8`` pass quantizes it; result ``lhs``'s dtype
    (the value the quantized product approximates)."""
    lhs, rhs = operands
    for key, accepted in FP8_MATMUL_VALUES.items():
        if attrs.get(key) not in accepted:
            raise IRError(f"{where}: an FP8-weight matmul needs {key}= one of {', '.join(accepted)} (how the "
                          f"quantize-fp8 pass quantizes it, docs/quantization.md); got {attrs.get(key)!r}")
    if lhs.dtype not in ("bfloat16", "float32") or not is_fp8(rhs.dtype) or rhs.kind != NodeKind.INPUT:
        raise IRError(f"{where}: an FP8-weight matmul reads a bf16/fp32 value and an FP8 weight input; got "
                      f"{', '.join(described)}")
    if lhs.shape[1] != rhs.shape[0]:
        raise IRError(f"{where}: contraction sizes differ: {', '.join(described)}")
    return (lhs.shape[0], rhs.shape[1]), lhs.dtype


def _scaled_result(where: str, op: ElementwiseOp, attrs: Mapping[str, str], operands: Sequence[Node],
                   described: list[str]) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of ``quantize(x, scale)`` (``x`` 2-D bf16/fp32, ``scale`` float32 [1, 1]; result the FP8
    ``dtype`` attr) or ``dequantize(acc, x_scale, w_scale)`` (``acc`` float32 [M, N] of an FP8 matmul, ``x_scale``
    [1, 1], ``w_scale`` [N, 1] per output channel or [1, 1] per tensor; result the bf16/fp32 ``dtype`` attr)."""
    value, *scales = operands
    dtype = attrs.get("dtype")
    if len(value.shape) != 2:
        raise IRError(f"{where} needs a 2-D value; got {', '.join(described)}")
    for scale in scales:
        if scale.dtype != "float32":
            raise IRError(f"{where}: scales are float32; got {', '.join(described)}")
    m = value.shape[0]
    if op in (ElementwiseOp.QUANTIZE, ElementwiseOp.ROW_SCALE):
        if not is_fp8(dtype or ""):
            raise IRError(f"{where}: dtype must be an FP8 format ({', '.join(FP8_FORMATS)}); got {dtype!r}")
        if op == ElementwiseOp.ROW_SCALE:
            if value.dtype not in ("bfloat16", "float32"):
                raise IRError(f"{where} scales the rows of a bf16/fp32 value; got {', '.join(described)}")
            return (m, 1), "float32"
        if value.dtype not in ("bfloat16", "float32") or scales[0].shape not in ((1, 1), (m, 1)):
            raise IRError(f"{where} quantizes a bf16/fp32 value [M, K] with a [1, 1] (per tensor) or [M, 1] (per row) "
                          f"float32 scale; got {', '.join(described)}")
    else:
        if dtype not in ("bfloat16", "float32"):
            raise IRError(f"{where}: dtype must be bfloat16 or float32; got {dtype!r}")
        n = value.shape[1]
        if value.dtype != "float32" or scales[0].shape not in ((1, 1), (m, 1)) or scales[1].shape not in (
                (1, 1), (n, 1)):
            raise IRError(f"{where} scales a float32 accumulator [M, N] by a [1, 1] or [M, 1] (per row) activation "
                          f"scale and a [N, 1] (per output channel) or [1, 1] weight scale; got {', '.join(described)}")
    return value.shape, str(dtype)

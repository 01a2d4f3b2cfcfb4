"""nmmc's closed vocabularies, each defined once as a typed enum.

Every vocabulary here is a :class:`StrEnum`: its members *are* their string values (``str``
subclasses that compare and hash equal to them, and print, format and serialize to JSON as them),
so a member can stand wherever the plain string stood before: in graph attributes, the IR's text
form, JSON metadata and emitted code, byte for byte. Code compares against members
(``node.layout == Layout.TRANSPOSED``) rather than spelling the string again, and converts user
input with :meth:`StrEnum.lookup`, raising its own message when that gives None.

- :class:`Layout`: how an IR input or output is stored in HBM (``row_major``, ``transposed``);
- :class:`ALayout`: how the user holds a GEMM's A (or a chain's X), ``mk`` or ``km``: the
  ``--a-layout`` spelling of a :class:`Layout` (:attr:`ALayout.layout`, :meth:`ALayout.of`);
- :class:`Orient`: the ``orient`` annotation of the fusion passes, how a computed value is held on
  chip (``normal``, ``transposed``), and the HBM layout that holds it the same way;
- :class:`Dialect`: the NKI dialect a kernel file is printed in (``nki``, ``neuronxcc``), with its
  NKI version, the module it imports and the package that provides it; the codegen's printers and
  descriptions, the interpreter's import hook and the AWS toolchain backend all derive from it;
- :class:`NodeKind`: the kinds of graph IR nodes (``input``, ``matmul``, ``transpose``,
  ``elementwise``, ``output``), with their operand counts;
- :class:`NormOp`: the normalizations of a ``norm`` node (``rmsnorm``, ``layernorm``): a per-row
  reduction over the last dim, the prologue of an MLP (docs/fusion.md, "The norm prologue");
- :class:`ElementwiseOp`: the elementwise ops (``silu``, ``multiply``, ``add``), the one table of
  each op's arity, node id prefix, NumPy spelling (the reference ``reference()`` prints and the
  evaluation of the graph) and NKI spelling (the ``nl.*`` op kernels pass).

This module imports nothing of nmmc's (only NumPy, for :meth:`ElementwiseOp.apply`), so every
layer can use it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ALayout",
    "Dialect",
    "DialectInfo",
    "ElementwiseOp",
    "ElementwiseOpInfo",
    "Layout",
    "NodeKind",
    "NormOp",
    "Orient",
    "StrEnum",
]

_E = TypeVar("_E", bound="StrEnum")


class StrEnum(str, enum.Enum):
    """An enum whose members are their string values (``enum.StrEnum`` is Python 3.11+ only).

    ``str(member)``, ``f"{member}"`` and ``json.dumps(member)`` give the value; ``member == value``
    and ``hash(member) == hash(value)``, so members and plain strings mix as dict keys and in
    tuples. ``repr`` stays the enum's (``<Layout.ROW_MAJOR: 'row_major'>``), which is what debugging
    wants; messages that quote a value should quote the user's input, not a member.
    """

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(str.__str__(self), format_spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """Every member's value, in definition order (for ``accepted: ...`` messages)."""
        return tuple(member.value for member in cls)

    @classmethod
    def lookup(cls: type[_E], value: object) -> _E | None:
        """The member equal to ``value`` (a member or its string), or None for anything else."""
        if isinstance(value, str):
            for member in cls:
                if member == value:
                    return member
        return None


class Layout(StrEnum):
    """How an input or output of the graph IR is stored in HBM: as its logical shape, or as its
    transpose (2-D only; the storage shape is the logical shape reversed)."""

    ROW_MAJOR = "row_major"
    TRANSPOSED = "transposed"

    @property
    def flipped(self) -> Layout:
        """The other layout: the same HBM array read as the transpose of the value."""
        return Layout.TRANSPOSED if self is Layout.ROW_MAJOR else Layout.ROW_MAJOR


class ALayout(StrEnum):
    """How the user holds the left operand A of a GEMM (X of a chain): ``mk`` is A[M, K] as is,
    ``km`` is A transposed, stored [K, M] (``--a-layout``)."""

    MK = "mk"
    KM = "km"

    @property
    def layout(self) -> Layout:
        """The IR layout of an A held this way (``mk``: row_major, ``km``: transposed)."""
        return _A_LAYOUT_TO_LAYOUT[self]

    @classmethod
    def of(cls, layout: str) -> ALayout:
        """The A layout of an operand stored in the IR ``layout`` (ValueError if it is none)."""
        return _LAYOUT_TO_A_LAYOUT[Layout(layout)]


class Orient(StrEnum):
    """The ``orient`` annotation: how a computed value is held on chip. ``normal``: its first
    logical dim on the partition axis (row-major); ``transposed``: its last dim on partitions (the
    value's transpose, feature-major)."""

    NORMAL = "normal"
    TRANSPOSED = "transposed"

    @property
    def layout(self) -> Layout:
        """The HBM layout that stores the value the way it is held (normal: row_major)."""
        return _ORIENT_TO_LAYOUT[self]

    @classmethod
    def of(cls, layout: str) -> Orient:
        """The orientation that holds a value the way HBM ``layout`` stores it (ValueError if none)."""
        return _LAYOUT_TO_ORIENT[Layout(layout)]


#: The one definition of ``--a-layout`` in IR terms; the inverse is derived.
_A_LAYOUT_TO_LAYOUT: Mapping[ALayout, Layout] = MappingProxyType(
    {ALayout.MK: Layout.ROW_MAJOR, ALayout.KM: Layout.TRANSPOSED})
_LAYOUT_TO_A_LAYOUT: Mapping[Layout, ALayout] = MappingProxyType({v: k for k, v in _A_LAYOUT_TO_LAYOUT.items()})
#: Orientation on chip vs layout in HBM; the inverse is derived.
_ORIENT_TO_LAYOUT: Mapping[Orient, Layout] = MappingProxyType(
    {Orient.NORMAL: Layout.ROW_MAJOR, Orient.TRANSPOSED: Layout.TRANSPOSED})
_LAYOUT_TO_ORIENT: Mapping[Layout, Orient] = MappingProxyType({v: k for k, v in _ORIENT_TO_LAYOUT.items()})


@dataclass(frozen=True)
class DialectInfo:
    """What a :class:`Dialect` is: the NKI release(s) it targets and where its API comes from."""

    #: The NKI version, as the interpreter and messages name it (``0.3``, ``0.1``).
    nki_version: str
    #: True when later NKI versions keep the dialect (``NKI 0.3+``).
    and_later: bool
    #: The module holding ``language`` and ``isa`` that kernel files import (``neuronxcc.nki``).
    module: str
    #: How messages name the pip package that provides :attr:`module`.
    package: str
    #: Said after the description in kernel file headers.
    note: str = ""


class Dialect(StrEnum):
    """The NKI dialect of an emitted kernel file (``--dialect``). ``nki`` is NKI 0.3+ (``import
    nki``, ``dst=`` everywhere); ``neuronxcc`` is NKI 0.1 (``import neuronxcc.nki``, value-returning
    calls), the API the NeuronMM paper used."""

    NKI = "nki"
    NEURONXCC = "neuronxcc"

    @property
    def info(self) -> DialectInfo:
        """Everything the dialect stands for (see :class:`DialectInfo`)."""
        return _DIALECT_INFO[self]

    @property
    def nki_version(self) -> str:
        """The NKI version of the dialect (``0.3``, ``0.1``)."""
        return self.info.nki_version

    @property
    def module(self) -> str:
        """The NKI module a kernel file of this dialect imports (``nki``, ``neuronxcc.nki``)."""
        return self.info.module

    @property
    def top_module(self) -> str:
        """The top-level package of :attr:`module` (``nki``, ``neuronxcc``)."""
        return self.module.partition(".")[0]

    @property
    def versions(self) -> str:
        """``NKI 0.3+`` or ``NKI 0.1``: the NKI releases the dialect runs on."""
        return f"NKI {self.nki_version}" + ("+" if self.info.and_later else "")

    @property
    def description(self) -> str:
        """One line for kernel file headers and ``--help``: version and import (the SDK releases and targets it
        runs on are :mod:`neuronmm_compiler.support`'s)."""
        return f"{self.versions} (import {self.module}){self.info.note}"

    @classmethod
    def of_module(cls, name: str) -> Dialect | None:
        """The dialect whose NKI package ``name`` (a dotted module name) belongs to, if any."""
        top = name.partition(".")[0]
        return next((dialect for dialect in cls if dialect.top_module == top), None)


_DIALECT_INFO: Mapping[Dialect, DialectInfo] = MappingProxyType({
    Dialect.NKI: DialectInfo(nki_version="0.3", and_later=True, module="nki",
                             package="'nki' (NKI 0.3+, Neuron SDK 2.29 and later)"),
    Dialect.NEURONXCC: DialectInfo(nki_version="0.1", and_later=False, module="neuronxcc.nki",
                                   package="'neuronx-cc' (neuronxcc.nki, NKI 0.1; Neuron SDK 2.29 and earlier)",
                                   note=", as the NeuronMM paper used"),
})


class NodeKind(StrEnum):
    """The kind of a graph IR node. Compute kinds (matmul, transpose, elementwise) produce a value
    on chip and carry the passes' annotations; inputs and outputs are the kernel's HBM tensors."""

    INPUT = "input"
    MATMUL = "matmul"
    TRANSPOSE = "transpose"
    ELEMENTWISE = "elementwise"
    NORM = "norm"
    OUTPUT = "output"

    @property
    def is_compute(self) -> bool:
        """True for the kinds that compute a value on chip (and so carry annotations)."""
        return self not in (NodeKind.INPUT, NodeKind.OUTPUT)

    @property
    def arity(self) -> int | None:
        """The operands a node of this kind takes; None for ``elementwise`` (its op's arity) and ``norm`` (the
        value, then its optional scale and shift: :attr:`NormOp.max_operands`)."""
        return _KIND_ARITY[self]


_KIND_ARITY: Mapping[NodeKind, int | None] = MappingProxyType({
    NodeKind.INPUT: 0, NodeKind.MATMUL: 2, NodeKind.TRANSPOSE: 1, NodeKind.ELEMENTWISE: None, NodeKind.NORM: None,
    NodeKind.OUTPUT: 1})


class NormOp(StrEnum):
    """The normalization of a ``norm`` node (its ``norm`` attr), over the last dim of each row ``x`` [H]:

    - ``rmsnorm``: ``x / sqrt(mean(x^2) + eps) * gamma``;
    - ``layernorm``: ``(x - mean(x)) / sqrt(var(x) + eps) * gamma + beta`` (population variance).

    Operands: the value, then optionally ``gamma`` [H] and (layernorm only) ``beta`` [H], as AWS nki-library's
    ``mlp`` takes ``normalization_weights_tensor`` and ``normalization_bias_tensor`` (aws-neuron/nki-library
    @d2ad3a579498d1888aa8740af97fd325dd5f2740, src/nkilib_src/nkilib/core/mlp/mlp.py; references in
    core/subkernels/rmsnorm_torch.py and layernorm_torch.py)."""

    RMSNORM = "rmsnorm"
    LAYERNORM = "layernorm"

    @property
    def max_operands(self) -> int:
        """The value, gamma and (layernorm) beta."""
        return 2 if self is NormOp.RMSNORM else 3

    def apply(self, x: np.ndarray, eps: float, gamma: np.ndarray | None = None,
              beta: np.ndarray | None = None) -> np.ndarray:
        """The normalization of the rows of ``x`` (in its dtype)."""
        if self is NormOp.RMSNORM:
            out = x / (x * x).mean(axis=-1, keepdims=True).__add__(eps) ** 0.5
        else:
            centered = x - x.mean(axis=-1, keepdims=True)
            out = centered / (centered * centered).mean(axis=-1, keepdims=True).__add__(eps) ** 0.5
        if gamma is not None:
            out = out * gamma
        if beta is not None:
            out = out + beta
        return out

    def numpy_source(self, x: str, eps: str, gamma: str | None = None, beta: str | None = None) -> str:
        """The normalization as a NumPy expression over the operand expressions (the file's ``reference()``)."""
        if self is NormOp.RMSNORM:
            text = f"{x} / np.sqrt(np.mean({x} * {x}, axis=-1, keepdims=True) + {eps})"
        else:
            c = f"({x} - np.mean({x}, axis=-1, keepdims=True))"
            text = f"{c} / np.sqrt(np.mean({c} * {c}, axis=-1, keepdims=True) + {eps})"
        if gamma is not None:
            text = f"({text}) * {gamma}"
        if beta is not None:
            text = f"{text} + {beta}"
        return text


def _silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x / (1 + exp(-x)); exp overflows to inf for very negative x, giving -0."""
    import numpy as np  # here, not at import: the vocabulary is read by every command, NumPy is not

    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


def _multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a * b


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


def _dequantize(acc: np.ndarray, x_scale: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """An FP8 matmul's accumulator times the scales of its operands: ``acc * x_scale * w_scale^T`` (``w_scale`` [N, 1]
    per output channel or [1, 1] per tensor, ``x_scale`` [1, 1])."""
    return acc * x_scale * w_scale.T


def _needs_format(*_: np.ndarray) -> np.ndarray:
    raise TypeError("quantize, row_scale and quantize_mx depend on the format of their node's dtype attr: use ir.fp8's "
                    "quantize and row_scale, ir.mx's quantize_activation")


@dataclass(frozen=True)
class ElementwiseOpInfo:
    """One row of the elementwise op table (see :class:`ElementwiseOp`)."""

    #: Operand count.
    arity: int
    #: Prefix of the ids the graph numbers such nodes with (``mul0``, ``mul1``, ...).
    id_prefix: str
    #: The NumPy expression of the op, ``{0}``/``{1}`` standing for its operands (float64 reference).
    numpy: str
    #: The NKI op (``nl.*``) a kernel passes to ``nisa.activation`` (unary) or ``nisa.tensor_tensor``.
    nki: str
    #: The op on NumPy arrays (what :attr:`numpy` spells, for the evaluator).
    function: Callable[..., np.ndarray]


class ElementwiseOp(StrEnum):
    """An elementwise op of the graph IR (the ``op`` attr of an ``elementwise`` node)."""

    SILU = "silu"
    MULTIPLY = "multiply"
    ADD = "add"
    QUANTIZE = "quantize"
    DEQUANTIZE = "dequantize"
    ROW_SCALE = "row_scale"
    QUANTIZE_MX = "quantize_mx"  # [M, K] bf16 -> [M, K/4] of the packed MX dtype in its dtype attr (docs/mx.md)

    @property
    def scaled(self) -> bool:
        """True for the FP8 ops (``quantize``, ``dequantize``): their operands after the first are scales (2-D, one
        value per tensor, per row or per output channel), their result dtype is the node's ``dtype`` attr
        (docs/quantization.md)."""
        return self in (ElementwiseOp.QUANTIZE, ElementwiseOp.DEQUANTIZE)

    @property
    def fp8(self) -> bool:
        """True for every op of FP8 quantization: quantize, dequantize and ``row_scale`` (a value's dynamic per-row
        scale, ``max|v[i, :]| / max`` of the FP8 format in its ``dtype`` attr; result float32 [M, 1]), quantize_mx."""
        return self.scaled or self in (ElementwiseOp.ROW_SCALE, ElementwiseOp.QUANTIZE_MX)

    @property
    def info(self) -> ElementwiseOpInfo:
        """The op's row of the table (arity, id prefix, NumPy and NKI spellings)."""
        return _ELEMENTWISE_OPS[self]

    @property
    def arity(self) -> int:
        """How many operands the op takes."""
        return self.info.arity

    @property
    def unary(self) -> bool:
        """True for an activation (one operand, ``nisa.activation``); False for a tensor-tensor op (and row_scale,
        a reduction, and quantize_mx, a Vector Engine quantization)."""
        return self.info.arity == 1 and self not in (ElementwiseOp.ROW_SCALE, ElementwiseOp.QUANTIZE_MX)

    @property
    def nki(self) -> str:
        """The ``nl.*`` op that computes it in a kernel."""
        return self.info.nki

    def numpy_source(self, *operands: str) -> str:
        """The op as a NumPy expression over the operand expressions ``operands``."""
        return self.info.numpy.format(*operands)

    def apply(self, *operands: np.ndarray) -> np.ndarray:
        """The op on NumPy arrays (in their dtype)."""
        return self.info.function(*operands)


_ELEMENTWISE_OPS: Mapping[ElementwiseOp, ElementwiseOpInfo] = MappingProxyType({
    ElementwiseOp.SILU: ElementwiseOpInfo(1, "silu", "{0} / (1.0 + np.exp(-{0}))", "nl.silu", _silu),
    ElementwiseOp.MULTIPLY: ElementwiseOpInfo(2, "mul", "{0} * {1}", "nl.multiply", _multiply),
    ElementwiseOp.ADD: ElementwiseOpInfo(2, "add", "{0} + {1}", "nl.add", _add),
    # lowered to nisa.tensor_scalar (docs/quantization.md), not to one nl.* op; quantize's NumPy spelling is ir/fp8.py's
    ElementwiseOp.QUANTIZE: ElementwiseOpInfo(2, "q", "", "nl.divide", _needs_format),
    ElementwiseOp.DEQUANTIZE: ElementwiseOpInfo(3, "dq", "{0} * {1} * {2}.T", "nl.multiply", _dequantize),
    # a max-reduction of |v| along each row (ir/fp8.py's row_scale; its NumPy spelling needs the format too)
    ElementwiseOp.ROW_SCALE: ElementwiseOpInfo(1, "rs", "", "nl.maximum", _needs_format),
    ElementwiseOp.QUANTIZE_MX: ElementwiseOpInfo(1, "qmx", "", "nl.divide", _needs_format),  # nisa.quantize_mx
})

"""MX values in the graph IR: their shape rules and how an MX input is read (docs/mx.md; the graph an MX graph
quantizes and its inputs: ir/mx_quantized.py).

An MX graph (``mlp_graph(..., mx=...)`` / ``gemm_graph(..., mx=...)`` after the ``quantize-mx`` pass) holds MX weight
inputs (``[K/4, N]`` of a packed ``_x4`` dtype, stored with their scales ``<name>_scale``; ir/mx.py), ``quantize_mx``
nodes on the bf16 values its matmuls read (``[T, K] -> [T, K/4]``) and matmuls of two MX values, whose results are the
dequantized products (``nc_matmul_mx`` dequantizes inside the instruction), in bf16. Before the pass a matmul of a
bf16 value by an MX weight is *marked* ``act_scale=mx w_scale=block`` (its activation is quantized on chip by the
pass). The rules (:func:`mx_result`):

- ``quantize_mx v``: ``v`` a 2-D bf16 value [M, K], K a multiple of 512 (one nc_matmul_mx tile: ir/mx.py), its node's
  ``dtype`` attr a format quantize_mx writes (``float8_e4m3fn_x4``, ``float8_e5m2_x4``); result [M, K/4] of it;
- a matmul ``a @ W``, ``a`` MX [M, R] (a quantize_mx value), ``W`` an MX *input* [R, N]: result [M, N] bfloat16;
- a marked matmul ``v @ W``: ``v`` bf16 [M, 4R], ``W`` an MX input [R, N]: result [M, N] bfloat16;
- nothing else reads an MX value (no output, no elementwise op, no transpose).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import IRError
from ..vocab import ElementwiseOp, NodeKind
from .mx import MX_ELEMENTS, MX_PACK, MX_TILE, X4_DTYPES, is_mx

if TYPE_CHECKING:
    import numpy as np


__all__ = ["MX_MARKS", "is_mx_marked", "load_weight", "mx_result", "scale_name", "value_shape"]

#: The attrs of a matmul the ``quantize-mx`` pass quantizes (an MX weight read by a bf16 value).
MX_MARKS: Mapping[str, str] = {"act_scale": "mx", "w_scale": "block"}


def scale_name(name: str) -> str:
    """The kernel argument holding the scales of the MX input ``name`` (ir/mx.py, "Storage")."""
    return f"{name}_scale"


def is_mx_marked(attrs: Mapping[str, Any]) -> bool:
    """True for the attrs of a matmul the frontend marked for ``quantize-mx``."""
    return attrs.get("act_scale") == MX_MARKS["act_scale"]


def applies(kind: str, attrs: Mapping[str, Any], operands: Sequence[Any]) -> bool:
    """Whether :func:`mx_result` decides a node's (shape, dtype): a quantize_mx, a marked matmul, or any node reading
    an MX value."""
    return ((kind == NodeKind.ELEMENTWISE and attrs.get("op") == ElementwiseOp.QUANTIZE_MX)
            or (kind == NodeKind.MATMUL and is_mx_marked(attrs)) or any(is_mx(op.dtype) for op in operands))


def mx_result(where: str, kind: str, attrs: Mapping[str, Any], operands: Sequence[Any],
              described: list[str]) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of a node :func:`applies` to (module docstring); IRError naming ``where`` otherwise."""
    got = ", ".join(described)
    if kind == NodeKind.ELEMENTWISE and attrs.get("op") == ElementwiseOp.QUANTIZE_MX:
        (value,) = operands
        dtype = attrs.get("dtype")
        if dtype not in X4_DTYPES or not X4_DTYPES[dtype].on_chip:
            writes = ", ".join(e.packed for e in MX_ELEMENTS.values() if e.on_chip)
            raise IRError(f"{where}: dtype must be a format nisa.quantize_mx writes ({writes}); got {dtype!r}")
        if len(value.shape) != 2 or value.dtype != "bfloat16" or value.shape[1] % MX_TILE:
            raise IRError(f"{where} quantizes a bf16 value [M, K] (the instruction reads bf16/fp16), K a multiple of "
                          f"{MX_TILE}; got {got}")
        return (value.shape[0], value.shape[1] // MX_PACK), str(dtype)
    if kind == NodeKind.MATMUL:
        lhs, rhs = operands
        if not is_mx(rhs.dtype) or rhs.kind != NodeKind.INPUT:
            raise IRError(f"{where}: an MX matmul's right operand is an MX weight input; got {got}")
        if is_mx_marked(attrs):
            if attrs.get("w_scale") != MX_MARKS["w_scale"] or lhs.dtype != "bfloat16":
                raise IRError(f"{where}: a matmul marked act_scale=mx reads a bf16 value and an MX weight with "
                              f"w_scale=block (docs/mx.md); got {got} {dict(attrs)}")
            if lhs.shape[1] != MX_PACK * rhs.shape[0]:
                raise IRError(f"{where}: contraction sizes differ: the MX weight's {rhs.shape[0]} packed rows hold "
                              f"{MX_PACK * rhs.shape[0]} positions; got {got}")
            return (lhs.shape[0], rhs.shape[1]), "bfloat16"
        if not is_mx(lhs.dtype) or lhs.shape[1] != rhs.shape[0]:
            raise IRError(f"{where}: nc_matmul_mx multiplies two MX values [M, R] @ [R, N] (packed rows); got {got}")
        return (lhs.shape[0], rhs.shape[1]), "bfloat16"
    raise IRError(f"{where}: an MX value is read by matmuls only (nc_matmul_mx dequantizes it); got {got}")


def logical_shape(node: Any) -> tuple[int, ...]:
    """The shape of the real matrix an MX input stands for: [4R, N]."""
    rows, cols = node.shape
    return MX_PACK * rows, cols


def value_shape(node: Any) -> tuple[int, ...]:
    """The shape of a node's value as evaluation holds it: an MX value's real matrix (its packed axis times 4: axis 0
    of an MX input, axis 1 of a quantize_mx), any other node's shape."""
    if not is_mx(node.dtype):
        return node.shape
    rows, cols = node.shape
    return (MX_PACK * rows, cols) if node.kind == NodeKind.INPUT else (rows, MX_PACK * cols)


def load_weight(node: Any, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """An MX input's real matrix [K, N] (float64) from its two stored arrays in ``inputs`` (IRError when one is
    missing or of another shape or dtype)."""
    import numpy as np

    from .mx import numpy_dtype, unpack

    name = node.name
    data, scales = inputs.get(name), inputs.get(scale_name(name))
    k, n = logical_shape(node)
    want = ((node.shape, numpy_dtype(node.dtype)), ((16, k // MX_TILE, n), np.dtype(np.uint8)))
    for array, arg, (shape, dtype) in zip((data, scales), (name, scale_name(name)), want, strict=True):
        if array is None or np.asarray(array).shape != shape or np.asarray(array).dtype != dtype:
            raise IRError(f"MX input {name!r} is stored as {name} {list(want[0][0])} {node.dtype} and "
                          f"{scale_name(name)} {list(want[1][0])} uint8; {arg} is missing or differs")
    return unpack(np.asarray(data), np.asarray(scales))

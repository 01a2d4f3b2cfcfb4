"""The Vector Engine reductions of the subset: ``nisa.tensor_scalar_reduce`` and ``nisa.tensor_reduce`` as nmmc emits
them, for per-token FP8 scales (lowerings/row_scales.py; rules NKI-TENSOR-SCALAR-REDUCE, NKI-TENSOR-REDUCE).

``tensor_scalar_reduce`` takes a unary arithmetic operator of the ALU as its op0 (the table "Supported Math Operators
for NKI ISA", "Arithmetic Unary"; ``operand0`` "Must be None or 0 when op0 is a unary operator (e.g., nl.abs)",
nki.isa.tensor_scalar): nmmc emits only ``nl.abs`` with ``reduce_op=nl.maximum``, a token's absolute maximum, and the
interpreter refuses anything else. Both compute in fp32 and count one Vector Engine instruction (``vector_ops``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KernelError, KernelLimitError, UnsupportedAPIError
from .ops import Op, on_chip, op_arg
from .tensor import as_f32, require_written

if TYPE_CHECKING:
    from .machine import Machine

#: The unary ALU operators (``nl.abs``), taken as tensor_scalar_reduce's op0 only: ``nki.language`` of the nki dialect.
UNARY_ALU_FUNCS = {"abs": np.abs}


def unary_ops() -> dict[str, Op]:
    """Fresh ``Op`` objects of :data:`UNARY_ALU_FUNCS` (kind ``unary``: not an activation, not a tensor_tensor op)."""
    return {name: Op(name, "unary", fn) for name, fn in UNARY_ALU_FUNCS.items()}


def _unary(op: Any, what: str) -> Op:
    if not isinstance(op, Op) or op.kind != "unary":
        raise UnsupportedAPIError(f"{what}: op0={op!r} is not in the subset nmmc emits (nl.abs)")
    return op


def tensor_scalar_reduce(m: Machine, data: Any, op0: Any, operand0: Any, reduce_op: Any,
                         what: str) -> tuple[np.ndarray, np.ndarray]:
    """``nisa.tensor_scalar_reduce`` as nmmc emits it: ``|data|`` (op0 ``nl.abs``, operand0 0) in fp32 and its maximum
    along the free axis per partition ([P, 1]), on the Vector Engine (rule NKI-TENSOR-SCALAR-REDUCE)."""
    first = _unary(op0, f"{what} op0")
    if operand0 not in (None, 0, 0.0):
        raise KernelError(f"{what}: operand0 must be None or 0 with the unary op0 nl.{first.name}, got {operand0!r}")
    r = op_arg(reduce_op, "binary", f"{what} reduce_op")
    if r.name != "maximum":
        raise UnsupportedAPIError(f"{what}: reduce_op=nl.{r.name} is not in the subset nmmc emits (nl.maximum)")
    d = on_chip(data, f"{what} data")
    require_written(d, f"{what} data")
    result = first.fn(as_f32(d))
    m.counters.vector_ops += 1
    return result, result.reshape(result.shape[0], -1).max(axis=1)[:, None]


def tensor_reduce(m: Machine, op: Any, data: Any, axis: Any, what: str) -> np.ndarray:
    """``nisa.tensor_reduce`` as nmmc emits it: the maximum of a 2-D tile [P, F] along its free axis (``axis=1``) in
    fp32, [P, 1] (rule NKI-TENSOR-REDUCE: axis 0, the partitions, is never reduced)."""
    o = op_arg(op, "binary", f"{what} op")
    if o.name != "maximum":
        raise UnsupportedAPIError(f"{what}: op=nl.{o.name} is not in the subset nmmc emits (nl.maximum)")
    d = on_chip(data, f"{what} data")
    if d.ndim != 2 or axis not in (1, (1,), [1]):
        raise KernelLimitError(f"{what}: reduces the free axis of a 2-D tile (axis=1); got axis={axis!r} over "
                               f"{list(d.shape)} (the partition axis cannot be reduced, rule NKI-TENSOR-REDUCE)")
    require_written(d, f"{what} data")
    m.counters.vector_ops += 1
    return as_f32(d).max(axis=1)[:, None]

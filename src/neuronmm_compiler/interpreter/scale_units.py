"""Scale units: the interpreter's check that every FP8 product is scaled exactly once by each of its scales (rule
NMMC-FP8-SCALE-ONCE, verification/rules.py; docs/quantization.md, "Verification").

Dimensional analysis with each scale input of the quantized graph as a unit: a value carries, per scale, the power
of it that it holds beyond the value the quantized graph means (``ir/quantized.py``, ``scale_exponents``). A scale
tensor carries its own scale (+1); an FP8 weight ``w / s_w`` carries ``s_w^-1``; a quantization divides by a scale,
a matmul and a multiply add their operands' units, a dequantization multiplies them away. Whatever the kernel does,
its values must keep the graph's units: an FP8 matmul operand carries exactly ``s^-1`` of one scale, the products
accumulated in one PSUM tile carry one unit, a nonlinear function (silu, exp, rsqrt, ...) and an add read values
without (or, for the add, with equal) units, and every output carries the units the graph gives it (none for a
dequantized output). A scale applied twice leaves ``s^+1`` behind, a scale forgotten ``s^-1``; both fail here, at
the instruction that first combines the wrong value, with the scale named.

Units are tracked per tensor of the graph (a per-channel scale is one unit), per element of every allocation: an
allocation holds one Python int when all its written elements carry the same units (the common case: no array is
made), else a ``uint64`` array. A unit combination is a sum of exponents times random 64-bit weights (one per scale,
from its name's hash), modulo 2^64: a wrong combination reads as the right one with probability about 2^-64.
Immediates (``240.0`` in a clamp, an activation's ``scale=1.0``) take the units of what they combine with; a tile
filled by ``nisa.memset(0)`` matches any units (zero is zero in every unit). Only runs of FP8 kernels (``nmmc
verify`` of a quantized graph) track units; other runs pay nothing.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KernelError, KernelLimitError
from .tensor import HBM, Tensor

if TYPE_CHECKING:
    Units = int | np.ndarray

#: The rule id (verification/rules.py).
SCALE_ONCE_RULE = "NMMC-FP8-SCALE-ONCE"
MASK = (1 << 64) - 1
#: The units of a tile ``nisa.memset`` set to 0: they match any units.
ANY = MASK
#: Activation functions that keep their operand's units (times a factor).
_HOMOGENEOUS = {"copy": 1, "square": 2}
_ADDITIVE = frozenset({"add", "subtract", "maximum", "minimum"})


def _weight(name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"nmmc-scale-unit:{name}".encode()).digest()[:8], "little") | 1


def _uniform(u: Any) -> Any:
    """``u`` as an int when all its elements are equal."""
    if isinstance(u, np.ndarray):
        flat = u.reshape(-1)
        if not flat.size or bool((flat == flat[0]).all()):
            return int(flat[0]) if flat.size else 0
    return u


def units_of(t: Tensor) -> Any:
    """The units of view ``t``: an int (uniform) or a uint64 array of ``t.shape``."""
    u = t.alloc.units
    if u is None:
        return 0
    if not isinstance(u, np.ndarray):
        return u
    v = u[t.key]
    if v.shape != t.shape:
        raise KernelError(f"{SCALE_ONCE_RULE}: cannot follow the scale units of an access pattern over "
                          f"{t.describe()}, whose elements carry different units")
    return _uniform(v)


def set_units(t: Tensor, u: Any) -> None:
    """Record that view ``t`` now holds values of units ``u`` (int, or an array broadcastable to ``t.shape``)."""
    a = t.alloc
    u = _uniform(u)
    cur = a.units
    if not isinstance(u, np.ndarray):
        if t.is_full or cur is None or (not isinstance(cur, np.ndarray) and cur == u):
            a.units = u
            return
        if not isinstance(cur, np.ndarray):
            cur = a.units = np.full(a.data.shape, cur, np.uint64)
        cur[t.key] = np.uint64(u)
        return
    if t.is_full:
        a.units = np.array(np.broadcast_to(u, a.data.shape), np.uint64)
        return
    if not isinstance(cur, np.ndarray):
        cur = a.units = np.full(a.data.shape, 0 if cur is None else cur, np.uint64)
    cur[t.key] = u


def _add(a: Any, b: Any, k: int = 1) -> Any:
    """``a + k * b`` in units (ANY absorbs)."""
    if not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
        return ANY if ANY in (a, b) else (a + k * b) & MASK
    x, y = np.asarray(a, np.uint64), np.asarray(b, np.uint64)
    out = x + np.uint64(k & MASK) * y
    return np.where((x == np.uint64(ANY)) | (y == np.uint64(ANY)), np.uint64(ANY), out)


def _times(a: Any, k: int) -> Any:
    if not isinstance(a, np.ndarray):
        return ANY if a == ANY else (a * k) & MASK
    return np.where(a == np.uint64(ANY), a, a * np.uint64(k))


def _per_partition(u: Any, data: Tensor) -> Any:
    """A [P, 1] operand's units broadcast over ``data``'s free dims."""
    if isinstance(u, np.ndarray):
        return u.reshape((data.shape[0],) + (1,) * (len(data.shape) - 1))
    return u


class ScaleUnits:
    """The units of one FP8 kernel run: each scale's weight, the kernel arguments' units and the outputs'."""

    def __init__(self, scales: list[str], inputs: Mapping[str, Mapping[str, int]],
                 outputs: Mapping[str, Mapping[str, int]]):
        self.weights = {name: _weight(name) for name in scales}
        self.inputs = {name: self.encode(exps) for name, exps in inputs.items()}
        self.outputs = {name: self.encode(exps) for name, exps in outputs.items()}
        #: the units an FP8 matmul operand may carry: one scale to the power -1
        self.quantized = {(-w) & MASK for w in self.weights.values()}
        expected = set(self.outputs.values())
        #: when every output has the same units, a store into HBM is checked as it happens
        self.store_units = expected.pop() if len(expected) == 1 else None

    def encode(self, exps: Mapping[str, int]) -> int:
        return sum(e * self.weights[s] for s, e in exps.items()) & MASK

    def describe(self, u: Any) -> str:
        """``x_scale^+1`` (a scale applied once too often), ``w_scale^-1`` (one missing), or a combination."""
        if isinstance(u, np.ndarray):
            u = int(u.reshape(-1)[0])
        if u == 0:
            return "no scale"
        if u == ANY:
            return "any units (zeros)"
        names = sorted(self.weights)
        for count in (1, 2, 3):
            for chosen in itertools.combinations(names, count):
                for exps in itertools.product((1, -1, 2, -2), repeat=count):
                    if self.encode(dict(zip(chosen, exps, strict=True))) == u:
                        return " * ".join(f"{n}^{e:+d}" for n, e in zip(chosen, exps, strict=True))
        return "a combination of more than three scales"

    def fail(self, message: str, u: Any) -> KernelLimitError:
        """The rule's error: ``message`` with ``{}`` standing for the units ``u`` described."""
        text = message.replace("{}", self.describe(u), 1)
        return KernelLimitError(f"{SCALE_ONCE_RULE}: {text} (every FP8 product reaches the output scaled exactly once "
                                "by each of its scales)")

    def _match(self, a: Any, b: Any, what: str) -> Any:
        """The units of a sum of values of units ``a`` and ``b``, which must agree (ANY matches anything)."""
        if not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
            if a == b or b == ANY:
                return a
            if a == ANY:
                return b
            return self._mismatch(a, b, what)
        x, y = np.broadcast_arrays(np.asarray(a, np.uint64), np.asarray(b, np.uint64))
        bad = (x != y) & (x != np.uint64(ANY)) & (y != np.uint64(ANY))
        if bad.any():
            i = tuple(int(v[0]) for v in np.nonzero(bad))
            return self._mismatch(int(x[i]), int(y[i]), what)
        return np.where(x == np.uint64(ANY), y, x)

    def _mismatch(self, a: int, b: int, what: str) -> Any:
        raise self.fail(f"{what} combines values whose scales differ by {{}}", (a - b) & MASK)

    def _scalar_free(self, u: Any, message: str) -> None:
        bad = u if not isinstance(u, np.ndarray) else next(
            (int(v) for v in np.unique(u) if int(v) not in (0, ANY)), 0)
        if bad not in (0, ANY):
            raise self.fail(message, bad)

    # --- instructions -------------------------------------------------------------------------------
    def load_argument(self, t: Tensor, name: str) -> None:
        set_units(t, self.inputs.get(name, 0))

    def dma(self, dst: Tensor, src: Tensor, *, transpose: bool, what: str) -> None:
        u = units_of(src)
        if transpose and isinstance(u, np.ndarray):
            u = u.T
        if dst.alloc.buffer == HBM and dst.alloc.line is not None and self.store_units is not None:
            self._check_store(u, self.store_units, f"{what} into {dst.describe()}")
        set_units(dst, u)

    def _check_store(self, u: Any, want: int, what: str) -> None:
        self._scalar_free(_add(u, want, -1), f"{what} stores values scaled by {{}} relative to the quantized graph's "
                                             "(^+1: a scale applied twice; ^-1: a scale not applied)")

    def copy(self, dst: Tensor, src: Tensor, *, transpose: bool = False) -> None:
        u = units_of(src)
        set_units(dst, u.T if transpose and isinstance(u, np.ndarray) else u)

    def constant(self, dst: Tensor, value: float) -> None:
        set_units(dst, ANY if value == 0 else 0)

    def matmul(self, dst: Tensor, stationary: Tensor, moving: Tensor, *, accumulates: bool, what: str) -> None:
        """``dst (+)= stationary.T @ moving``: each operand uniform along the contraction (partitions)."""
        parts = []
        for role, t in (("stationary", stationary), ("moving", moving)):
            u = units_of(t)
            if isinstance(u, np.ndarray):
                if not bool((u == u[0:1]).all()):
                    row = int(np.nonzero((u != u[0:1]).any(axis=1))[0][0])
                    col = int(np.nonzero(u[row] != u[0])[0][0])
                    raise self.fail(f"{what} contracts partitions of {role} {t.describe()} whose scales differ by {{}} "
                                    f"(partition {row} against 0)", (int(u[row, col]) - int(u[0, col])) & MASK)
                u = u[0]
            if t.dtype.itemsize == 1:
                self._quantized_operand(u, f"{what} {role} {t.describe()}")
            parts.append(u)
        st, mv = parts
        if isinstance(st, np.ndarray) or isinstance(mv, np.ndarray):
            result = _add(np.asarray(st, np.uint64).reshape(-1, 1), np.asarray(mv, np.uint64).reshape(1, -1))
        else:
            result = _add(st, mv)
        if accumulates:
            result = self._match(units_of(dst), result, f"{what} accumulating into {dst.describe()}")
        set_units(dst, result)

    def _quantized_operand(self, u: Any, what: str) -> None:
        values = [u] if not isinstance(u, np.ndarray) else [int(v) for v in np.unique(u)]
        for v in values:
            if v not in self.quantized and v != ANY:
                raise self.fail(f"{what} is an FP8 matmul operand scaled by {{}}; the quantized graph's FP8 operands "
                                "are quantized by exactly one scale s (s^-1)", v)

    def binary(self, dst: Tensor, op: str, a: Any, b: Any, what: str) -> None:
        ua, ub = units_of(a), units_of(b)
        set_units(dst, self._combine(op, ua, ub, f"{what} ({a.describe()} with {b.describe()})"))

    def _combine(self, op: str, ua: Any, ub: Any, what: str) -> Any:
        if op == "multiply":
            return _add(ua, ub)
        if op == "divide":
            return _add(ua, ub, -1)
        if op in _ADDITIVE:
            return self._match(ua, ub, what)
        raise KernelError(f"{SCALE_ONCE_RULE}: {what}: no scale-unit rule for nl.{op}")

    def tensor_scalar(self, dst: Tensor, data: Tensor, ops: list[tuple[str, Any]], what: str) -> None:
        u = units_of(data)
        for op, operand in ops:
            if isinstance(operand, Tensor):
                u = self._combine(op, u, _per_partition(units_of(operand), data), f"{what} with {operand.describe()}")
        set_units(dst, u)

    def activation(self, dsts: list[Tensor], op: str, data: Tensor, bias: Any, scale: Any, what: str) -> None:
        u = units_of(data)
        if isinstance(scale, Tensor):
            u = _add(u, _per_partition(units_of(scale), data))
        if isinstance(bias, Tensor):
            u = self._match(u, _per_partition(units_of(bias), data), f"{what} bias {bias.describe()}")
        factor = _HOMOGENEOUS.get(op)
        if factor is None:
            self._scalar_free(u, f"{what} op=nl.{op} reads {data.describe()}, scaled by {{}}; a nonlinear function "
                                 "reads values in the quantized graph's own units")
            u = 0
        else:
            u = _times(u, factor)
        for dst in dsts:
            set_units(dst, u)

    def absmax(self, dst: Tensor, reduce_res: Tensor, data: Tensor, what: str) -> None:
        """A per-token absolute maximum (tensor_scalar_reduce abs, maximum): ``dst = |data|`` keeps the units; the
        maximum is the start of a row scale computed on chip, which the quantized graph gives a unit of its own
        (``row_scale``, ir/quantized.py): here the unit of the tile it is reduced into, by that tile's name, so the
        programs of a logical core and every token block agree on it. ``data`` must be in the graph's own units."""
        u = units_of(data)
        self._scalar_free(u, f"{what} reads {data.describe()}, scaled by {{}}; a row scale is the maximum of values "
                             "in the quantized graph's own units")
        set_units(dst, u)
        name = f"row scale {reduce_res.alloc.name}"
        weight = self.weights.setdefault(name, _weight(name))
        self.quantized.add((-weight) & MASK)
        set_units(reduce_res, weight)

    def reduce(self, dst: Tensor, data: Tensor, what: str) -> None:
        """A maximum along the free axis: every element reduced carries the same units, the result's."""
        u = units_of(data)
        if isinstance(u, np.ndarray):
            flat = u.reshape(u.shape[0], -1)
            for col in range(1, flat.shape[1]):
                self._match(flat[:, 0], flat[:, col], f"{what} over {data.describe()}")
            u = flat[:, :1]
        set_units(dst, u)

    def statistics(self, dst: Tensor, data: Tensor, what: str) -> None:
        self._scalar_free(units_of(data), f"{what} reads {data.describe()}, scaled by {{}}; statistics read values "
                                          "in the quantized graph's own units")
        set_units(dst, 0)

    def check_output(self, t: Tensor, name: str) -> None:
        want = self.outputs.get(name, 0)
        self._check_store(units_of(t), want, f"kernel output {name!r} ({t.describe()})")

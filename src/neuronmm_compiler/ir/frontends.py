"""Frontends that build graphs from user descriptions: ``--shape MxNxK`` and the plain GEMM."""

from __future__ import annotations

import re

from ..errors import InputError
from .graph import Graph

__all__ = ["A_LAYOUTS", "gemm_graph", "parse_shape"]

#: How the user holds A: "mk" is A[M, K] as is, "km" is A transposed, stored [K, M].
A_LAYOUTS: tuple[str, ...] = ("mk", "km")
_SHAPE = re.compile(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*\Z")
_SHAPE_HELP = "expected MxNxK with positive integers, e.g. 1024x2048x512"


def parse_shape(text: str) -> tuple[int, int, int]:
    """Parse ``"MxNxK"`` (``x`` in either case) into ``(M, N, K)``.

    Malformed text, zero or negative dimensions raise InputError saying what is accepted.
    """
    match = _SHAPE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InputError(f"{_SHAPE_HELP}; got {text!r}")
    m, n, k = (int(group) for group in match.groups())
    if min(m, n, k) <= 0:
        raise InputError(f"{_SHAPE_HELP}; got {text!r} (every dimension must be at least 1)")
    return m, n, k


def _check_dim(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"gemm: {what} must be a positive integer; got {value!r}")
    return value


def gemm_graph(m: int, n: int, k: int, dtype: str = "bfloat16", a_layout: str = "mk") -> Graph:
    """C[M, N] = A[M, K] @ B[K, N] with inputs ``a``, ``b`` and output ``c``, graph name ``gemm``.

    With ``a_layout="km"`` the user holds A transposed: the graph is the literal one, an input
    ``a_t`` of shape [K, M] (row_major) feeding a ``transpose`` and then the matmul; the
    ``fold-transposes`` pass turns that into a ``transposed`` input.
    """
    m, n, k = _check_dim(m, "M"), _check_dim(n, "N"), _check_dim(k, "K")
    if a_layout not in A_LAYOUTS:
        raise InputError(f"gemm: unknown A layout {a_layout!r}; accepted: {', '.join(A_LAYOUTS)}")
    graph = Graph("gemm")
    if a_layout == "mk":
        lhs = graph.add_input("a", (m, k), dtype)
        rhs = graph.add_input("b", (k, n), dtype)
    else:
        a_t = graph.add_input("a_t", (k, m), dtype)
        rhs = graph.add_input("b", (k, n), dtype)
        lhs = graph.add_transpose(a_t)
    graph.add_output("c", graph.add_matmul(lhs, rhs))
    return graph

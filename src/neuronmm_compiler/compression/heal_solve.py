"""The closed form's one solve: a rank-constrained, regularised least-squares fit from accumulated Grams.

:mod:`.heal` explains what it is fitted to; this module holds the solve, the residual it reports and the
accumulation of its normal equations, shared by the unsharded refit and the tensor-parallel blocks
(:mod:`.heal_shards`).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular

from ..errors import InputError
from .calibration import batch_gram
from .svd import _gram, _lapack, choose_method
from .whitening import whiten

__all__ = ["DEFAULT_HEAL_DAMPING", "METRIC_DAMPING", "Accumulator", "project", "rank_constrained_lstsq",
           "relative_residual"]

#: Ridge of the closed-form refit, relative to the mean diagonal of ``A^T A``.
DEFAULT_HEAL_DAMPING = 1e-4
#: Ridge of the output metric, relative to its mean diagonal (measured on SmolLM2-135M,
#: benchmarks/results/compression-runs.md, "The healing study").
METRIC_DAMPING = 1e-2


def rank_constrained_lstsq(gram: np.ndarray, cross: np.ndarray, rank: int, damping: float = DEFAULT_HEAL_DAMPING,
                           metric: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(u [in, rank], v [rank, out])`` minimising ``||A u v - B||_F^2 + lambda ||u v||^2_(ridge)`` from
    ``gram = A^T A`` and ``cross = A^T B`` (float64); ``lambda = damping * mean(diag(gram))``.

    ``metric`` (``Q`` [out, out], positive semi-definite) weighs the output's errors: the objective becomes
    ``||(A u v - B) R||_F^2`` with ``Q + mu I = R R^T`` (``mu``: :data:`METRIC_DAMPING` of Q's mean diagonal),
    solved the same way with ``L^-1 A^T B R`` in place of ``L^-1 A^T B`` and ``v R^-1`` in place of ``v``."""
    gram = np.asarray(gram, dtype=np.float64)
    cross = np.asarray(cross, dtype=np.float64)
    k, n = cross.shape
    if gram.shape != (k, k):
        raise InputError(f"Gram matrix {list(gram.shape)} does not match the cross product {list(cross.shape)}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(k, n):
        raise InputError(f"rank must be an integer in [1, {min(k, n)}]; got {rank!r}")
    if not np.isfinite(cross).all():
        raise InputError("the refit's targets hold NaN or Inf values")
    lower, _ = whiten(gram, damping)
    m = solve_triangular(lower, cross, lower=True, check_finite=False)  # L^-1 A^T B
    right = None if metric is None else whiten(metric, METRIC_DAMPING)[0]
    if right is not None:
        m = m @ right
    u_white, v, _ = (_lapack if choose_method(k, n) == "lapack" else _gram)(m, rank)
    u = solve_triangular(lower.T, u_white, lower=False, check_finite=False)
    if right is not None:
        v = solve_triangular(right.T, v.T, lower=False, check_finite=False).T  # v R^-1
    return u, v


def relative_residual(gram: np.ndarray, cross: np.ndarray, target: float, u: np.ndarray, v: np.ndarray) -> float:
    """``||A u v - B||_F / ||B||_F`` from ``A^T A``, ``A^T B`` and ``||B||^2``, through the rank-r factors
    (``<u^T G u, v v^T> - 2 <u^T C, v> + t``: no [in, out] product)."""
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    value = float(np.einsum("ij,ij->", u.T @ (gram @ u), v @ v.T)) - 2.0 * float(np.einsum("ij,ij->", u.T @ cross, v)) \
        + target
    return float(np.sqrt(max(value, 0.0) / target)) if target > 0 else 0.0


def project(x: np.ndarray, factor) -> np.ndarray:
    """``x`` through one projection: ``(x u) v`` for ``(u, v)`` factors, ``x W`` for a dense ``W``."""
    if isinstance(factor, tuple):
        return (x @ factor[0]) @ factor[1]
    return x @ factor


class Accumulator:
    """``A^T A``, ``A^T B`` and ``||B||^2``, summed in float64 over batches whose products are summed in
    float32 (:func:`~.calibration.batch_gram` says why that is exact enough)."""

    def __init__(self, k: int, n: int):
        self.gram, self.cross, self.target = np.zeros((k, k)), np.zeros((k, n)), 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        a32, b32 = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
        self.gram += batch_gram(a32)
        self.cross += (a32.T @ b32).astype(np.float64)
        self.target += float(np.einsum("ij,ij->", b32, b32, dtype=np.float64))

    @classmethod
    def of_linear(cls, gram: np.ndarray, w: np.ndarray) -> Accumulator:
        """The sums for targets ``B = A W`` from ``A^T A`` alone: ``A^T B = (A^T A) W`` and ``||B||^2 =
        <W, (A^T A) W>`` (one product per layer instead of one per batch)."""
        acc = cls(0, 0)
        acc.gram = gram
        acc.cross = gram @ np.asarray(w, dtype=np.float64)
        acc.target = float(np.einsum("ij,ij->", np.asarray(w, dtype=np.float64), acc.cross))
        return acc

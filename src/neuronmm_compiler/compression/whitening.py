"""Activation-aware (whitened) truncated SVD, as SVD-LLM does it: truncate where the activations look.

Plain SVD minimizes ``||W - W'||_F``, which treats every input direction alike. What the model
feels is the error of the layer's *output* on its real inputs, ``||X W - X W'||_F`` for calibration
activations ``X`` [tokens, in]. With ``A = X^T X + lambda I = L L^T`` (Cholesky, L lower):

    ||X (W - W')||_F^2 = tr((W - W')^T X^T X (W - W'))  ~=  ||L^T (W - W')||_F^2

so the best rank-r ``W'`` for the output is ``L^-T`` times the best rank-r approximation of the
*whitened* matrix ``M = L^T W`` (Eckart-Young applied to M): with ``M = P S Q^T``,

    u = L^-T P_r sqrt(S_r)   [in, r]        v = sqrt(S_r) Q_r^T   [r, out]        x @ u @ v ~= x @ W

and the relative output error at rank r is exactly ``sqrt(sum_{i>r} s_i^2 / sum_i s_i^2)`` (up to the
damping ``lambda``), known for every r from M's spectrum. That is the accuracy proxy the joint rank
choice uses (:mod:`.rank_choice`).

Numerics: everything in float64. ``lambda = damping * mean(diag(X^T X))`` (default 1e-4 relative):
X^T X of a real model is singular or nearly so (massive activation outliers, dead features); the
damping makes it positive definite and is raised tenfold, up to five times, if Cholesky still
fails. The SVD of M takes :mod:`.svd`'s routes (LAPACK up to 512 on the small side, the
eigendecomposition of the small-side Gram matrix beyond), signs fixed for determinism. NaN or Inf in
W or in the activations is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import LinAlgError, cholesky, solve_triangular

from ..errors import InputError
from .svd import _gram, _lapack, choose_method

__all__ = ["DEFAULT_DAMPING", "WhitenedFactors", "spectrum", "truncation_loss", "whiten", "whitened_svd"]

DEFAULT_DAMPING = 1e-4
_RETRIES = 5


def whiten(gram: np.ndarray, damping: float = DEFAULT_DAMPING) -> tuple[np.ndarray, float]:
    """``(L, lambda)``: lower Cholesky factor of ``gram + lambda I`` (float64) and the damping used."""
    gram = np.asarray(gram, dtype=np.float64)
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1]:
        raise InputError(f"activation Gram matrix must be square; got shape {list(gram.shape)}")
    if not np.isfinite(gram).all():
        raise InputError("calibration activations hold NaN or Inf values")
    if not damping > 0:
        raise InputError(f"damping must be positive; got {damping!r}")
    scale = float(np.mean(np.diag(gram)))
    if not scale > 0:
        raise InputError("calibration activations are all zero; whitening needs real inputs")
    lam = damping * scale
    for _ in range(_RETRIES + 1):
        try:
            damped = gram + lam * np.eye(gram.shape[0])
            return cholesky(damped, lower=True, check_finite=False), lam
        except LinAlgError:
            lam *= 10.0
    raise InputError(f"activation Gram matrix is not positive definite even with damping {lam:.3g}")


def _whitened(w: np.ndarray, lower: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if not np.isfinite(w).all():
        raise InputError("weight holds NaN or Inf values")
    if lower.shape[0] != w.shape[0]:
        raise InputError(f"activations have {lower.shape[0]} features; the weight takes {w.shape[0]} inputs")
    return lower.T @ w.astype(np.float64)


def spectrum(w: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Squared singular values of the whitened ``L^T W``, descending (float64, all ``min(in, out)`` of them)."""
    m = _whitened(w, lower)
    return np.clip(np.linalg.eigvalsh(m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m)[::-1], 0.0, None)


def truncation_loss(squared: np.ndarray, rank: int) -> float:
    """Relative output error ``sqrt(sum_{i>=rank} s_i^2 / sum s_i^2)`` of keeping ``rank`` components."""
    total = float(squared.sum())
    return float(np.sqrt(max(float(squared[rank:].sum()), 0.0) / total)) if total > 0 else 0.0


@dataclass(frozen=True)
class WhitenedFactors:
    """``u`` [in, r] and ``v`` [r, out] (float64), M's squared spectrum, the damping used."""

    u: np.ndarray
    v: np.ndarray
    squared_spectrum: np.ndarray
    damping: float

    @property
    def output_error(self) -> float:
        """Relative error of the layer's output on the calibration activations (the whitened loss)."""
        return truncation_loss(self.squared_spectrum, self.u.shape[1])


def whitened_svd(w: np.ndarray, gram: np.ndarray, rank: int, damping: float = DEFAULT_DAMPING, *,
                 whitening: tuple[np.ndarray, float] | None = None) -> WhitenedFactors:
    """Rank-``rank`` factors of ``W`` [in, out] minimizing the output error on activations with ``X^T X = gram``.

    ``whitening``: ``whiten(gram, damping)`` computed already (gate and up share one)."""
    k, n = np.shape(w)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(k, n):
        raise InputError(f"rank must be an integer in [1, {min(k, n)}]; got {rank!r}")
    lower, lam = whiten(gram, damping) if whitening is None else whitening
    m = _whitened(w, lower)
    method = choose_method(k, n)
    u_white, v, _ = (_lapack if method == "lapack" else _gram)(m, rank)
    gram_m = m @ m.T if k <= n else m.T @ m
    squared = np.clip(np.linalg.eigvalsh(gram_m)[::-1], 0.0, None)
    u = solve_triangular(lower.T, u_white, lower=False, check_finite=False)
    damping_used = lam / float(np.mean(np.diag(gram)))
    return WhitenedFactors(u=u, v=v, squared_spectrum=squared, damping=damping_used)

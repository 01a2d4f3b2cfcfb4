"""Truncated SVD of one weight matrix into the two NeuronMM factors, and its reconstruction error.

``W [k, n] ~= u @ v`` with ``u = U_r * sqrt(S_r)`` [k, r] and ``v = sqrt(S_r) * V_r^T`` [r, n]: the
singular values are split evenly between the factors, as NeuronMM does (section 1 of the method).

Two exact methods, both in float64, both deterministic (no random numbers):

- ``"lapack"``: ``np.linalg.svd`` of the float64 matrix. Used when ``min(k, n) <= LAPACK_MAX_DIM``.
- ``"gram"``: eigendecomposition of the float64 Gram matrix of the smaller side, ``G = W W^T``
  ([k, k], when k <= n) with ``np.linalg.eigh``; ``U_r`` are its top r eigenvectors, ``S_r`` the
  square roots of its eigenvalues, and ``v = U_r^T W / sqrt(S_r)`` (symmetrically when k > n). Forming
  G is one BLAS-3 product and a symmetric eigensolver of the small side is far cheaper than an SVD of
  the rectangle: on the 2048 x 8192 gate of Llama-3.2-1B it took ~2 s where ``np.linalg.svd`` took
  ~30 s, with the same reconstruction error to 7 digits (``benchmarks/results/compression-runs.md``, "The SVD
  route", has the measured table). Squaring W squares its condition number, so singular values below ~1e-8 of the
  largest are not resolved in float64; the factors are float32, where anything below 2^-24 (fp32's unit
  roundoff) of the largest singular value is rounding noise, so such components are set to zero in
  both factors (they change ``||W - u v||_F / ||W||_F`` by less than ``sqrt(r) * 2^-24``).

Signs are fixed so that the entry of largest magnitude of every column of ``U_r`` is positive, so
the factors do not depend on the sign conventions of the LAPACK build.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError

__all__ = ["LAPACK_MAX_DIM", "METHODS", "SvdFactors", "choose_method", "relative_error", "truncated_svd"]

#: ``min(k, n)`` at or below which the "auto" method uses LAPACK's SVD rather than the Gram route.
LAPACK_MAX_DIM = 512
METHODS: tuple[str, ...] = ("auto", "lapack", "gram")
#: Components with a singular value at or below this fraction of the largest are zeroed by "gram".
GRAM_CUTOFF = 2.0**-24


@dataclass(frozen=True)
class SvdFactors:
    """``u`` [k, r] and ``v`` [r, n] (float32), the r singular values (float64), the method used."""

    u: np.ndarray
    v: np.ndarray
    singular_values: np.ndarray
    method: str


def choose_method(k: int, n: int, method: str = "auto") -> str:
    if method not in METHODS:
        raise InputError(f"unknown SVD method {method!r}; accepted: {', '.join(METHODS)}")
    if method != "auto":
        return method
    return "lapack" if min(k, n) <= LAPACK_MAX_DIM else "gram"


def _fix_signs(u_cols: np.ndarray) -> np.ndarray:
    """+1/-1 per column making each column's entry of largest magnitude positive (first one on ties)."""
    rows = np.argmax(np.abs(u_cols), axis=0)
    signs = np.sign(u_cols[rows, np.arange(u_cols.shape[1])])
    signs[signs == 0] = 1.0
    return signs


def _lapack(w: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    u, s, vt = u[:, :rank], s[:rank], vt[:rank]
    signs = _fix_signs(u)
    root = np.sqrt(s)
    return (u * (signs * root)), ((signs * root)[:, None] * vt), s


def _gram(w: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k, n = w.shape
    if k > n:  # W^T ~= a @ b with a [n, r], b [r, k], so W ~= b^T @ a^T (signs are fixed on W's own u below)
        a, b, s = _gram_wide(w.T, rank)
        u, v = b.T, a.T
    else:
        u, v, s = _gram_wide(w, rank)
    signs = _fix_signs(u)
    return u * signs, signs[:, None] * v, s


def _gram_wide(w: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Factors of a [k, n] float64 matrix with k <= n through the eigendecomposition of W W^T."""
    gram = w @ w.T
    eigenvalues, vectors = np.linalg.eigh(gram)
    eigenvalues, vectors = eigenvalues[::-1][:rank], vectors[:, ::-1][:, :rank]
    s = np.sqrt(np.maximum(eigenvalues, 0.0))
    keep = s > (s[0] * GRAM_CUTOFF if s.size else 0.0)
    root = np.where(keep, np.sqrt(s), 0.0)
    inverse_root = np.divide(1.0, root, out=np.zeros_like(root), where=keep)
    u = vectors * root
    v = (vectors.T @ w) * inverse_root[:, None]
    return u, v, np.where(keep, s, 0.0)


def truncated_svd(w: np.ndarray, rank: int, method: str = "auto") -> SvdFactors:
    """The rank-``rank`` NeuronMM factors of ``w`` [k, n] (any float dtype), computed in float64.

    ``method`` is "auto" (LAPACK up to ``LAPACK_MAX_DIM`` on the small side, Gram beyond), "lapack"
    or "gram"; see the module docstring. The result is the same on every run.
    """
    if w.ndim != 2:
        raise InputError(f"truncated_svd: expected a matrix, got shape {list(w.shape)}")
    k, n = w.shape
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(k, n):
        raise InputError(f"truncated_svd: rank must be an integer in [1, {min(k, n)}] for a {k}x{n} matrix; "
                         f"got {rank!r}")
    chosen = choose_method(k, n, method)
    w64 = np.asarray(w, dtype=np.float64)
    bad = int(np.count_nonzero(~np.isfinite(w64)))
    if bad:
        raise InputError(f"the {k}x{n} weight holds {bad} NaN or infinite value{'s' if bad > 1 else ''}; "
                         "an SVD of it is meaningless (check the checkpoint)")
    u, v, s = (_lapack if chosen == "lapack" else _gram)(w64, rank)
    return SvdFactors(
        u=np.ascontiguousarray(u, dtype=np.float32),
        v=np.ascontiguousarray(v, dtype=np.float32),
        singular_values=s,
        method=chosen,
    )


def relative_error(w: np.ndarray, u: np.ndarray, v: np.ndarray, block_rows: int = 512) -> float:
    """``||w - u @ v||_F / ||w||_F`` in float64, a block of rows at a time (0 for a zero ``w``)."""
    v64 = np.asarray(v, dtype=np.float64)
    residual = total = 0.0
    for start in range(0, w.shape[0], block_rows):
        rows = np.asarray(w[start:start + block_rows], dtype=np.float64)
        diff = rows - np.asarray(u[start:start + block_rows], dtype=np.float64) @ v64
        residual += float(np.einsum("ij,ij->", diff, diff))
        total += float(np.einsum("ij,ij->", rows, rows))
    return float(np.sqrt(residual / total)) if total > 0 else 0.0

"""Measure the truncated SVD nmmc uses against a full LAPACK SVD (and a randomized SVD) at real shapes.

``python -m neuronmm_compiler.models.svd_accuracy [--models llama-3.2-1b,...] [--keep-ratio 0.8]
[--threads 1] [--randomized]`` prints one row per model's gate shape [hidden, intermediate] (the down
projection is its transpose: same singular values, same errors): the time and relative
reconstruction error ``||W - u v||_F / ||W||_F`` of the full ``np.linalg.svd`` (float32, the
reference), of nmmc's "gram" route, and optionally of a seeded randomized SVD (oversampling 128, two
power iterations). Real weights are not downloaded: W is synthetic, Gaussian noise (a
Marchenko-Pastur bulk, like a trained weight's) plus a rank-256 power-law part, seeded.
``docs/compression.md`` records a run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from ..frontends.shapes import block_aligned_rank
from .config import KNOWN_MODELS, known_config, read_config
from .svd import relative_error, truncated_svd

__all__ = ["AccuracyRow", "measure", "randomized_svd", "synthetic_weight"]


def synthetic_weight(k: int, n: int, seed: int = 0) -> np.ndarray:
    """A float32 [k, n] matrix: noise with std 1/sqrt(k) plus a power-law rank-256 component."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n), dtype=np.float32) / np.float32(np.sqrt(k))
    r = min(256, k, n)
    a = rng.standard_normal((k, r), dtype=np.float32)
    b = rng.standard_normal((r, n), dtype=np.float32)
    decay = (np.arange(1, r + 1, dtype=np.float32) ** -1.0) * np.float32(30.0 / np.sqrt(k * n))
    w += (a * decay) @ b
    return w


def randomized_svd(w: np.ndarray, rank: int, oversample: int = 128, power: int = 2, seed: int = 0):
    """Halko-Martinsson-Tropp randomized SVD in float32 with QR re-orthonormalized power iterations."""
    k, n = w.shape
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(w @ rng.standard_normal((n, min(rank + oversample, k, n)), dtype=np.float32))
    for _ in range(power):
        z, _ = np.linalg.qr(w.T @ q)
        q, _ = np.linalg.qr(w @ z)
    ub, s, vt = np.linalg.svd(q.T @ w, full_matrices=False)
    root = np.sqrt(s[:rank])
    return (q @ ub[:, :rank]) * root, root[:, None] * vt[:rank]


@dataclass(frozen=True)
class AccuracyRow:
    model: str
    shape: tuple[int, int]
    rank: int
    results: dict[str, tuple[float, float]]  # method -> (seconds, relative error)

    def format(self) -> str:
        full = self.results["full"][1]
        cells = [f"{self.model:14s} {self.shape[0]}x{self.shape[1]:<6d} r={self.rank:<5d}"]
        for method, (seconds, error) in self.results.items():
            delta = "" if method == "full" else f" ({(error - full) / full:+.1e})"
            cells.append(f"{method} {seconds:7.1f}s {error:.7f}{delta}")
        return " | ".join(cells)


def _timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def measure(models=KNOWN_MODELS, keep_ratio: float = 0.8, threads: int | None = 1, randomized: bool = False,
            shapes: dict[str, tuple[int, int]] | None = None) -> Iterator[AccuracyRow]:
    """Yield one :class:`AccuracyRow` per model (or per entry of ``shapes``: name -> (k, n))."""
    if shapes is None:
        shapes = {}
        for name in models:
            config = read_config(known_config(name))
            shapes[name] = (config.hidden_size, config.intermediate_size)
    with threadpool_limits(limits=threads, user_api="blas"):
        for name, (k, n) in shapes.items():
            w = synthetic_weight(k, n)
            rank = block_aligned_rank(k, n, keep_ratio)
            results = {}
            seconds, (u, s, vt) = _timed(np.linalg.svd, w, False)
            results["full"] = (seconds, relative_error(w, u[:, :rank] * s[:rank], vt[:rank]))
            del u, s, vt
            seconds, factors = _timed(truncated_svd, w, rank, "gram")
            results["gram"] = (seconds, relative_error(w, factors.u, factors.v))
            if randomized:
                seconds, (u, v) = _timed(randomized_svd, w, rank)
                results["randomized"] = (seconds, relative_error(w, u, v))
            yield AccuracyRow(name, (k, n), rank, results)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(KNOWN_MODELS))
    parser.add_argument("--keep-ratio", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (0: the library's default)")
    parser.add_argument("--randomized", action="store_true", help="also time a randomized SVD")
    args = parser.parse_args(argv)
    for row in measure(args.models.split(","), args.keep_ratio, args.threads or None, args.randomized):
        print(row.format(), flush=True)


if __name__ == "__main__":
    main()

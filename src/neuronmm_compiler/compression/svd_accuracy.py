"""Measure the truncated SVD nmmc uses against a full LAPACK SVD (and a randomized SVD) at real shapes.

``python -m neuronmm_compiler.compression.svd_accuracy [--models llama-3.2-1b,...] [--keep-ratio 0.8]
[--threads 1] [--randomized]`` prints one row per model's gate shape [hidden, intermediate] (the down
projection is its transpose: same singular values, same errors): the time and relative
reconstruction error ``||W - u v||_F / ||W||_F`` of the full ``np.linalg.svd`` (float32, the
reference), of nmmc's "gram" route, and optionally of a seeded randomized SVD (oversampling 128, two
power iterations). ``--models`` takes known model names and model directories: for a name, W is
synthetic (Gaussian noise -- a Marchenko-Pastur bulk -- plus a rank-256 power-law part, seeded; its
errors are optimistic: at 576 x 1536, rank 384, the synthetic W loses 0.256 of its norm and layer 15's
real gate weight of SmolLM2-135M (Q4_1) 0.279, 9% more), for a
directory (config.json + safetensors) W is the real gate weight of layer ``--layer`` (default: the
middle layer). Each row says which. ``docs/compression.md`` records a run. A bad name or path is a
one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ..checkpoints.config import KNOWN_MODELS, known_config, mlp_weight_names, read_config
from ..checkpoints.weights import WeightReader
from ..errors import InputError
from ..frontends.shapes import block_aligned_rank
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
    weights: str = "synthetic"  # or "real, layer N"

    def format(self) -> str:
        full = self.results["full"][1]
        cells = [f"{self.model:14s} {self.shape[0]}x{self.shape[1]:<6d} r={self.rank:<5d} ({self.weights} W)"]
        for method, (seconds, error) in self.results.items():
            delta = "" if method == "full" else f" ({(error - full) / full:+.1e})"
            cells.append(f"{method} {seconds:7.1f}s {error:.7f}{delta}")
        return " | ".join(cells)


def _timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def _weights(models, layer: int | None) -> dict[str, tuple[tuple[int, int], str, object]]:
    """name -> ((k, n), label, loader of W) for known names (synthetic W) and model directories (real W)."""
    out: dict[str, tuple[tuple[int, int], str, object]] = {}
    for name in models:
        path = Path(name)
        if path.is_dir():
            config = read_config(path)
            index = config.num_hidden_layers // 2 if layer is None else layer
            weight = mlp_weight_names(config, index)["gate"]
            k, n = config.hidden_size, config.intermediate_size
            out[config.name or path.name] = ((k, n), f"real, layer {index}",
                                             lambda path=path, weight=weight, k=k, n=n:
                                             WeightReader(path).read(weight, shape=(n, k)).T.copy())
        else:
            config = read_config(known_config(name))
            k, n = config.hidden_size, config.intermediate_size
            out[name] = ((k, n), "synthetic", lambda k=k, n=n: synthetic_weight(k, n))
    return out


def measure(models=KNOWN_MODELS, keep_ratio: float = 0.8, threads: int | None = 1, randomized: bool = False,
            shapes: dict[str, tuple[int, int]] | None = None, layer: int | None = None) -> Iterator[AccuracyRow]:
    """Yield one :class:`AccuracyRow` per model name or directory (or per entry of ``shapes``: name -> (k, n),
    synthetic W)."""
    if shapes is None:
        sources = _weights(models, layer)
    else:
        sources = {name: ((k, n), "synthetic", lambda k=k, n=n: synthetic_weight(k, n))
                   for name, (k, n) in shapes.items()}
    with threadpool_limits(limits=threads, user_api="blas"):
        for name, ((k, n), label, load) in sources.items():
            w = load()  # type: ignore[operator]
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
            yield AccuracyRow(name, (k, n), rank, results, label)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(KNOWN_MODELS),
                        help="comma-separated known model names (synthetic W) or model directories (real W)")
    parser.add_argument("--layer", type=int, default=None, help="layer of a model directory (default: the middle)")
    parser.add_argument("--keep-ratio", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (0: the library's default)")
    parser.add_argument("--randomized", action="store_true", help="also time a randomized SVD")
    args = parser.parse_args(argv)
    try:
        for row in measure(args.models.split(","), args.keep_ratio, args.threads or None, args.randomized,
                           layer=args.layer):
            print(row.format(), flush=True)
    except InputError as exc:
        print(f"svd_accuracy: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

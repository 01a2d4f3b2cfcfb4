"""Accuracy of FP8 activation scales, static per tensor vs dynamic per row (docs/fp8.md, "Per-row activation scales").

    python benchmarks/fp8_act_scales.py [--tokens 128] [--hidden 1024] [--intermediate 2816] [--seeds 3]

For a random gated MLP (dense, and SVD at keep 0.8) with FP8 e4m3 weights (per-channel scales), evaluates in float64
the quantized graph nmmc verifies kernels against (``quantize-fp8`` with ``act_scale=static`` or ``row``) and the
unquantized graph on the same inputs, and prints the relative error (Frobenius) of the output and its worst token.
Static scales are calibrated on the very inputs evaluated (``ir/quantized.calibrate``: the best a static scale can
do); row scales need no calibration. Two input distributions: x standard normal (every token alike) and x whose
tokens have log-normal magnitudes (sigma 1.5: a few tokens far larger than the rest, as outlier tokens in real
hidden states; the MLP's weights are scaled so h stays of order one). Graph-level only: the kernels of row scales are
not emitted yet.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

from neuronmm_compiler.frontends.shapes import Fp8Weights, block_aligned_rank, mlp_graph
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.quantized import calibrate, unquantized
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    whole = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    per_token = np.linalg.norm(got - want, axis=1) / np.maximum(np.linalg.norm(want, axis=1), 1e-300)
    return whole, float(np.max(per_token))


def run(tokens: int, hidden: int, intermediate: int, seeds: int) -> list[str]:
    lines = [f"MLP tokens={tokens} hidden={hidden} intermediate={intermediate}, float8_e4m3 weights (row scales); "
             f"relative error vs the unquantized graph: whole output / worst token, mean over {seeds} seeds"]
    rank = block_aligned_rank(hidden, intermediate, 0.8)
    for structure, ranks in (("dense", None), (f"SVD keep 0.8 (rank {rank})", (rank, rank, rank))):
        for spread in (0.0, 1.5):
            row: dict[str, list[tuple[float, float]]] = {"static": [], "row": []}
            for seed in range(seeds):
                rng = np.random.default_rng(seed)
                plain = mlp_graph(tokens, hidden, intermediate, ranks)
                raw = {}
                for node in plain.inputs():
                    fan_in = node.shape[0]
                    value = rng.standard_normal(node.storage_shape) / (1.0 if node.name == "x" else np.sqrt(fan_in))
                    if node.name == "x":
                        value *= np.exp(spread * rng.standard_normal((tokens, 1)))
                    raw[node.name] = value.astype(ml_dtypes.bfloat16)
                want = evaluate(plain, raw)["out"]
                for kind in row:
                    graph = quantize_fp8(mlp_graph(tokens, hidden, intermediate, ranks, fp8=Fp8Weights(act_scale=kind)))
                    assert unquantized(graph) == plain
                    row[kind].append(_errors(evaluate(graph, calibrate(graph, raw))["out"], want))
            label = "x ~ N(0, 1)" if spread == 0 else f"x tokens log-normal (sigma {spread})"
            for kind, errs in row.items():
                whole, worst = np.mean(errs, axis=0)
                lines.append(f"  {structure:28s} {label:34s} {kind:6s} {whole:.4f} / {worst:.4f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(run(args.tokens, args.hidden, args.intermediate, args.seeds)))


if __name__ == "__main__":
    main()

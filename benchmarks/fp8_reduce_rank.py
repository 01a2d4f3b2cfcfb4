"""Accuracy of FP8 ``reduce-rank`` against the single-core FP8 SVD MLP (docs/tensor-parallel.md, "FP8 reduce-rank").

    python benchmarks/fp8_reduce_rank.py [--tokens 128] [--hidden 1024] [--intermediate 2816] [--tp 2,4,8] [--seeds 3]

For a random SVD MLP at keep 0.8 with FP8 e4m3 weights (per-channel scales), calibrates the static scales on the
inputs evaluated (``ir/quantized.calibrate`` on the unsharded graph: the scales ``nmmc compress --dtype fp8`` would
store), then evaluates in float64, on the same quantized tensors:

- the single-core FP8 graph (``quantize-fp8`` of ``mlp_graph``: ``h U_down`` quantized from its dequantization);
- ``replicate-u/reduce-rank`` at each ``--tp``: every rank's FP8 partial graph on its slices (``tensor_parallel/
  sharding.py``), its ``z_i`` rounded to bf16 as the kernel stores it, the sum rounded to bf16 as a bf16 all-reduce
  delivers it, then the FP8 ``down_v`` graph (``z`` quantized with the unsharded ``h_ud_scale``);
- the unquantized graph.

Prints each one's relative error (Frobenius) against the unquantized output, and the distance between the two FP8
computations. x is standard normal; the factors are Gaussian scaled by 1/sqrt(K) so h is of order one.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

from neuronmm_compiler.frontends.shapes import Fp8Weights
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.quantized import calibrate, unquantized
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8
from neuronmm_compiler.tensor_parallel.sharding import CollectiveStep, Operand, Strategy, shard_mlp, unsharded_graph


def _bf16(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float64).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _operand(arrays: dict[str, np.ndarray], op: Operand) -> np.ndarray:
    value = arrays[op.tensor]
    if op.rows is not None:
        value = value[op.rows[0]:op.rows[1], :]
    if op.cols is not None:
        value = value[:, op.cols[0]:op.cols[1]]
    return value


def reduce_rank(workload, tp: int, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The output of replicate-u/reduce-rank (module docstring), rank 0's."""
    sharded = shard_mlp(workload, tp, Strategy("replicate-u", "reduce-rank"))
    held = [dict(arrays) for _ in sharded.ranks]
    for index in range(len(sharded.ranks[0].steps)):
        first = sharded.ranks[0].steps[index]
        if isinstance(first, CollectiveStep):
            total = _bf16(sum(held[p.rank][p.steps[index].tensor] for p in sharded.ranks))
            for rank_arrays in held:
                rank_arrays[first.result] = total
            continue
        for program in sharded.ranks:
            step = program.steps[index]
            values = evaluate(quantize_fp8(step.workload.graph()),
                              {name: _operand(held[program.rank], op) for name, op in step.args.items()})
            for name, tensor in step.outputs.items():
                held[program.rank][tensor] = _bf16(values[name])
    return held[0]["out"]


def _error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def run(tokens: int, hidden: int, intermediate: int, tps: list[int], seeds: int) -> list[str]:
    workload = mlp_workload(tokens, hidden, intermediate, keep_ratio=0.8, fp8=Fp8Weights())
    graph = unsharded_graph(workload)
    plain = unquantized(graph)
    lines = [f"SVD MLP tokens={tokens} hidden={hidden} intermediate={intermediate} ranks {workload.ranks}, "
             f"float8_e4m3 weights (row scales), static activation scales; relative error vs the unquantized "
             f"output, mean over {seeds} seeds (min..max)"]
    rows: dict[str, list[float]] = {}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        raw = {n.name: rng.standard_normal(n.shape) / (np.sqrt(n.shape[0]) if n.name != "x" else 1.0)
               for n in plain.inputs()}
        reference = evaluate(plain, raw)["out"]
        arrays = {k: np.asarray(v, np.float64) for k, v in calibrate(graph, raw).items()}
        single = _bf16(evaluate(graph, arrays)["out"])
        rows.setdefault("single-core FP8", []).append(_error(single, reference))
        for tp in tps:
            split = reduce_rank(workload, tp, arrays)
            rows.setdefault(f"reduce-rank FP8, tp {tp}", []).append(_error(split, reference))
            rows.setdefault(f"  reduce-rank tp {tp} vs single-core FP8", []).append(_error(split, single))
    for name, values in rows.items():
        lines.append(f"  {name:<42} {np.mean(values):.5f} ({min(values):.5f}..{max(values):.5f})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--tp", default="2,4,8")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(run(args.tokens, args.hidden, args.intermediate, [int(t) for t in args.tp.split(",")],
                        args.seeds)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The example graph files against running every op as its own kernel, side by side in one run.

For examples/graphs/{lora,three_factor_chain,svd_mlp}.yaml at several token counts on trn1 and
trn2, this tunes the fused kernels (``nmmc tune --graph``) and prints the predicted latency of

  per-op     every op its own kernel: AWS's fully optimized GEMM per matmul (left operands
             row-major, transposed on load), elementwise ops HBM to HBM
  per-op^T   the same with every left operand given pre-transposed (favours the baseline)
  fused      nmmc's tuned schedule

with both speedups, the number of kernels, and whether the tuned file verified in the
interpreter (run where it is cheap). Medians at the bottom. These are the cost model's
predictions, not hardware measurements. Usage:
  python benchmarks/user_graphs.py [--tokens 1,32,128,512] [--targets trn1,trn2] [--jobs 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from neuronmm_compiler.driver import tune as tune_graph
from neuronmm_compiler.frontends.graph_file import load_graph_spec
from neuronmm_compiler.frontends.workloads import graph_workload
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "graphs"
GRAPHS = ("lora", "three_factor_chain", "svd_mlp")
INTERPRET_MAX_MATMULS = 4000


def run_case(args: tuple[str, int, str]) -> dict:
    name, tokens, target_name = args
    spec = load_graph_spec(EXAMPLES / f"{name}.yaml")
    workload = graph_workload(spec.graph({"tokens": tokens}), spec.source)
    tuned = tune_graph(workload, target=get_target(target_name))
    fused = tuned.compiled.cost
    verified: object = "-"
    if fused.matmul_instructions <= INTERPRET_MAX_MATMULS:
        verified = verify_source(tuned.compiled.kernel.source, filename=name).ok
    per_op, per_op_t = tuned.baselines["unfused"].cost, tuned.baselines["dense"].cost
    speedups = tuned.speedups()
    return {"graph": name, "tokens": tokens, "target": target_name, "fused": fused.latency_us,
            "per_op": per_op.latency_us if per_op else None, "per_op_t": per_op_t.latency_us if per_op_t else None,
            "vs_per_op": speedups["unfused"], "vs_per_op_t": speedups["dense"],
            "kernels": len(tuned.compiled.programs), "verified": verified}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,32,128,512")
    parser.add_argument("--targets", default="trn1,trn2")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    cases = [(g, int(t), tgt) for tgt in args.targets.split(",") for g in GRAPHS for t in args.tokens.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_case, cases))
    print(f"{'graph':<20}{'tokens':>7}{'target':>7}{'per-op us':>11}{'per-op^T us':>13}{'fused us':>10}"
          f"{'vs per-op':>11}{'vs per-op^T':>13}{'kernels':>9}{'verified':>10}")
    for r in rows:
        print(f"{r['graph']:<20}{r['tokens']:>7}{r['target']:>7}{r['per_op']:>11.1f}{r['per_op_t']:>13.1f}"
              f"{r['fused']:>10.1f}{r['vs_per_op']:>10.2f}x{r['vs_per_op_t']:>12.2f}x{r['kernels']:>9}"
              f"{r['verified']!s:>10}")
    for tgt in args.targets.split(","):
        sub = [r for r in rows if r["target"] == tgt]
        print(f"median on {tgt}: {statistics.median(r['vs_per_op'] for r in sub):.2f}x vs per-op, "
              f"{statistics.median(r['vs_per_op_t'] for r in sub):.2f}x vs per-op^T "
              f"({sum(r['vs_per_op_t'] > 1 for r in sub)}/{len(sub)} faster than per-op^T)")
    failed = [r for r in rows if r["verified"] is False]
    print(f"verified in the interpreter: {sum(r['verified'] is True for r in rows)}, failed: {len(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

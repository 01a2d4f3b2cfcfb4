#!/usr/bin/env python3
"""Fused SVD MLPs against their baselines, as the NeuronMM paper measures them.

For the MLPs of Llama-3.2-1B, Llama-3.2-3B, Qwen3-1.7B, Qwen3-4B and Llama-3.1-8B, compressed at
keep ratio 0.8 (block-aligned ranks), at 1, 32, 128, 512 and 2048 tokens, on trn1 and trn2, this
tunes nmmc's fused kernels (``nmmc tune --mlp``) and prints, side by side in one run, the predicted
latency of

  dense     the uncompressed MLP, AWS's fully optimized NKI kernel per projection (x given
            transposed, as that kernel takes it), SiLU and multiply as their own kernels
  nmmc-d    the uncompressed MLP as nmmc's own tuned fused kernel (``nmmc tune --mlp --dense``): the
            best alternative a user has without compression
  unfused   the SVD factors as separate AWS-kernel GEMMs, every intermediate through HBM
  fused     nmmc's tuned schedule (one kernel, or two with h^T through HBM)

with the speedups and the HBM bytes each moves: counted by the interpreter on the emitted fused
kernel where it runs in reasonable time (column 'src' = interp), else the model's count (= model;
tests hold the two equal). Geometric means at the bottom. Usage:
  python benchmarks/fusion.py [--targets trn1,trn2] [--tokens 1,32,128,512,2048] [--jobs 2] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor

from neuronmm_compiler.cost_model.trust import trust_note
from neuronmm_compiler.driver import tune as tune_graph
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source

MODELS = {  # hidden, intermediate
    "llama3.2-1b": (2048, 8192),
    "llama3.2-3b": (3072, 8192),
    "qwen3-1.7b": (2048, 6144),
    "qwen3-4b": (2560, 9728),
    "llama3.1-8b": (4096, 14336),
}
INTERPRET_MAX_MATMULS = 6000


def run_case(args: tuple[str, int, str]) -> dict:
    model, tokens, target_name = args
    hidden, intermediate = MODELS[model]
    workload = mlp_workload(tokens, hidden, intermediate, keep_ratio=0.8)
    tuned = tune_graph(workload, target=get_target(target_name))
    fused = tuned.compiled.cost
    source = "model"
    fused_bytes = fused.hbm_bytes_read + fused.hbm_bytes_written
    verified: object = "-"
    if fused.matmul_instructions <= INTERPRET_MAX_MATMULS:
        report = verify_source(tuned.compiled.kernel.source, filename=model)
        verified = report.ok
        counted = report.counters.get("total_hbm_bytes_read", 0) + report.counters.get("total_hbm_bytes_written", 0)
        if report.ok:
            source, fused_bytes = "interp", counted
    dense, unfused = tuned.baselines["dense"].cost, tuned.baselines["unfused"].cost
    speedups = tuned.speedups()
    nmmc_dense = tune_graph(mlp_workload(tokens, hidden, intermediate, dense=True),
                            target=get_target(target_name)).compiled.cost.latency_us
    return {
        "nmmc_dense": nmmc_dense, "vs_nmmc_dense": nmmc_dense / fused.latency_us,
        "model": model, "tokens": tokens, "target": target_name, "ranks": workload.ranks,
        "dense": dense.latency_us, "unfused": unfused.latency_us,
        "fused": fused.latency_us, "vs_dense": speedups["dense"], "vs_unfused": speedups["unfused"],
        "dense_mib": (dense.hbm_bytes_read + dense.hbm_bytes_written) / 2**20,
        "unfused_mib": (unfused.hbm_bytes_read + unfused.hbm_bytes_written) / 2**20,
        "fused_mib": fused_bytes / 2**20, "src": source, "kernels": len(tuned.compiled.programs),
        "verified": verified,
    }


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="trn1,trn2")
    parser.add_argument("--tokens", default="1,32,128,512,2048")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one model, two token counts, trn1")
    args = parser.parse_args()
    models = list(MODELS)
    tokens = [int(t) for t in args.tokens.split(",")]
    targets = args.targets.split(",")
    if args.quick:
        models, tokens, targets = ["llama3.2-1b"], [1, 128], ["trn1"]
    cases = [(m, t, tg) for m in models for t in tokens for tg in targets]
    header = (f"{'model':<13}{'tokens':>7} {'target':<7}{'ranks':>16}{'dense us':>10}{'unfused us':>11}"
              f"{'nmmc-d us':>10}{'fused us':>10}{'vs dense':>9}{'vs unf.':>8}{'vs nmmc-d':>10}"
              f"{'dense MiB':>10}{'unf. MiB':>9}{'fused MiB':>10}"
              f"{'src':>7}{'kern':>5}  verified")
    print(header)
    print("-" * len(header))
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for r in pool.map(run_case, cases):
            rows.append(r)
            ranks = "/".join(map(str, r["ranks"]))
            print(f"{r['model']:<13}{r['tokens']:>7} {r['target']:<7}{ranks:>16}{r['dense']:>10.1f}"
                  f"{r['unfused']:>11.1f}{r['nmmc_dense']:>10.1f}{r['fused']:>10.1f}{r['vs_dense']:>8.2f}x"
                  f"{r['vs_unfused']:>7.2f}x{r['vs_nmmc_dense']:>9.2f}x"
                  f"{r['dense_mib']:>10.1f}{r['unfused_mib']:>9.1f}{r['fused_mib']:>10.1f}{r['src']:>7}"
                  f"{r['kernels']:>5}  {r['verified']}", flush=True)
    print("-" * len(header))
    for target in targets:
        sel = [r for r in rows if r["target"] == target]
        print(f"{target}: geometric mean speedup vs dense {geomean([r['vs_dense'] for r in sel]):.2f}x, "
              f"vs unfused SVD {geomean([r['vs_unfused'] for r in sel]):.2f}x, vs nmmc's fused dense MLP "
              f"{geomean([r['vs_nmmc_dense'] for r in sel]):.2f}x over {len(sel)} cases; latencies are the cost "
              f"model's: {trust_note(get_target(target))}")
    slower_unfused = [r for r in rows if r["vs_unfused"] <= 1.0]
    slower_dense = [r for r in rows if r["vs_dense"] <= 1.0]
    slower_nmmc = [r for r in rows if r["vs_nmmc_dense"] <= 1.0]
    failed = [r for r in rows if r["verified"] is False]
    print(f"{len(slower_unfused)} cases not faster than unfused SVD; {len(slower_dense)} not faster than dense; "
          f"{len(slower_nmmc)} not faster than nmmc's fused dense MLP; {len(failed)} failed verification")
    return 1 if failed or slower_unfused else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How good and how fast is the schedule search?

For a suite of GEMM shapes (MLP projections of Llama-3.2-1B/3B, Llama-3.1-8B, Qwen3-1.7B/4B at 1,
32, 512 and 4096 tokens, plus ragged shapes) on trn1, trn2 and trn3, this runs the default
``nmmc tune`` pipeline (Optuna TPE + polish) and an exhaustive enumeration of the same space, side
by side in one run, and prints per case:

  opt/exh    Optuna-best latency / exhaustive-best latency (1.000 = found the optimum)
  to-1%      Optuna trials until the best was within 1% of the exhaustive best ("polish" if only the
             local polish after the trials got there)
  tune s     wall seconds of the whole default tune (frontend, passes, search, codegen)
  eval/s     cost-model evaluations per second (from the exhaustive run)
  vs AWS     predicted speedup of the tuned kernel over aws-fully-optimized ("n/a": the preset does
             not fit the shape)
  verified   the tuned kernel ran in the interpreter and matched the float64 reference

Medians at the bottom. Usage:
  python benchmarks/search_quality.py [--targets trn1,trn2,trn3] [--jobs 2] [--no-verify] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from neuronmm_compiler.driver import tune
from neuronmm_compiler.frontends.workloads import gemm_workload
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source

# (label, M tokens, N out features, K in features)
SUITE = [
    ("llama3.2-1b up, decode", 1, 8192, 2048),
    ("llama3.2-1b down, 32 tok", 32, 2048, 8192),
    ("llama3.2-3b up, 512 tok", 512, 8192, 3072),
    ("llama3.2-3b down, 4096 tok", 4096, 3072, 8192),
    ("llama3.1-8b up, decode", 1, 14336, 4096),
    ("llama3.1-8b down, 32 tok", 32, 4096, 14336),
    ("llama3.1-8b up, 512 tok", 512, 14336, 4096),
    ("llama3.1-8b down, 4096 tok", 4096, 4096, 14336),
    ("qwen3-1.7b up, decode", 1, 6144, 2048),
    ("qwen3-1.7b down, 512 tok", 512, 2048, 6144),
    ("qwen3-4b up, 32 tok", 32, 9728, 2560),
    ("qwen3-4b down, 4096 tok", 4096, 2560, 9728),
    ("ragged", 200, 700, 300),
    ("ragged", 77, 5000, 1300),
    ("ragged", 1000, 3000, 2500),
]
QUICK = [SUITE[0], SUITE[2], SUITE[12]]
VERIFY_MAX_MATMULS = 200000  # every suite kernel (the largest, ~29k matmuls, takes ~30 s to interpret)


def run_case(args: tuple[str, int, int, int, str, bool]) -> dict:
    label, m, n, k, target_name, verify = args
    start = time.perf_counter()
    workload = gemm_workload(m, n, k)
    tuned = tune(workload, target=get_target(target_name))
    tune_seconds = time.perf_counter() - start
    exhaustive = tune(workload, target=get_target(target_name), method="exhaustive").search
    exh_best = exhaustive.best.latency_us
    best = tuned.compiled.cost.latency_us
    within = next((i + 1 for i, v in enumerate(tuned.search.trial_history) if v <= 1.01 * exh_best), None)
    if within is None and best <= 1.01 * exh_best:
        within = "polish"
    verified: object = "skipped"
    if verify and tuned.compiled.cost.matmul_instructions <= VERIFY_MAX_MATMULS:
        verified = verify_source(tuned.compiled.kernel.source, filename=label).ok
    return {
        "label": label, "shape": f"{m}x{n}x{k}", "target": target_name, "ratio": best / exh_best,
        "to_1pct": within, "tune_s": tune_seconds, "evals_per_s": exhaustive.evaluated / exhaustive.seconds,
        "speedup": tuned.speedups()["aws-fully-optimized"], "verified": verified, "best_us": best,
        "space": exhaustive.space_size,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="trn1,trn2,trn3")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (one case each)")
    parser.add_argument("--no-verify", action="store_true", help="skip running tuned kernels in the interpreter")
    parser.add_argument("--quick", action="store_true", help="three shapes only")
    args = parser.parse_args()
    suite = QUICK if args.quick else SUITE
    cases = [(label, m, n, k, t, not args.no_verify) for label, m, n, k in suite for t in args.targets.split(",")]
    header = (f"{'case':<28}{'shape':>18} {'target':<7}{'space':>7}{'opt/exh':>9}{'to-1%':>8}{'tune s':>8}"
              f"{'eval/s':>8}{'vs AWS':>8}{'best us':>10}  verified")
    print(header)
    print("-" * len(header))
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(run_case, cases):
            rows.append(row)
            speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "n/a"
            print(f"{row['label']:<28}{row['shape']:>18} {row['target']:<7}{row['space']:>7}{row['ratio']:>9.4f}"
                  f"{row['to_1pct']!s:>8}{row['tune_s']:>8.2f}{row['evals_per_s']:>8.0f}{speedup:>8}"
                  f"{row['best_us']:>10.1f}  {row['verified']}", flush=True)
    print("-" * len(header))
    trials = [r["to_1pct"] for r in rows if isinstance(r["to_1pct"], int)]
    speedups = [r["speedup"] for r in rows if r["speedup"]]
    print(f"median opt/exh {statistics.median(r['ratio'] for r in rows):.4f}   "
          f"median trials to 1% {statistics.median(trials) if trials else 'n/a'}   "
          f"median tune s {statistics.median(r['tune_s'] for r in rows):.2f}   "
          f"median eval/s {statistics.median(r['evals_per_s'] for r in rows):.0f}   "
          f"median speedup vs AWS {statistics.median(speedups):.2f}x")
    within = sum(r["ratio"] <= 1.01 for r in rows)
    slower = [r for r in rows if r["speedup"] is not None and r["speedup"] < 1.0]
    failed = [r for r in rows if r["verified"] is False]
    print(f"{within}/{len(rows)} cases within 1% of the exhaustive optimum; "
          f"{len(slower)} predicted slower than aws-fully-optimized; {len(failed)} failed verification")
    return 1 if failed or slower else 0


if __name__ == "__main__":
    sys.exit(main())

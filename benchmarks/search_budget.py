#!/usr/bin/env python3
"""Is the default search budget enough for the fused MLP? The default tune against a larger budget, side by side.

For the MLP shapes ``benchmarks/vs_nkilib.py`` compares with nki-library (Llama-3.2-1B/3B, Llama-3.1-8B whole and
one tp 8 rank, Qwen3-4B), dense and SVD at keep 0.9 / 0.8, at 1, 32, 128 and 512 tokens, on trn2 at LNC=2 in-graph,
this tunes each MLP with the default budget (``--trials``, 150) and with ``--factor`` times as many trials, same seed,
in one run, and prints per point

  default / larger   the two tuned latencies (cost model, us) and their ratio (> 1: the default budget missed a
                     faster schedule the larger one found; < 1: the larger search ended worse, TPE being a sampler)
  last               the trial at which the default search last improved its best (before the final polish): a
                     search still improving near its end had not settled
  s                  wall seconds of each tune

then how many points agree, which miss and by how much. Every latency is a prediction of the same model; only the
search differs. Usage:
  python benchmarks/search_budget.py [--trials 150] [--factor 4] [--seed 0] [--tokens 1,32,128,512]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from vs_nkilib import SHAPES

from neuronmm_compiler.driver import tune
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc

#: Ratios within this of 1 count as agreeing (the latencies are printed to 0.1 us).
AGREE = 1e-3


def last_improvement(history: list[float]) -> int:
    """The 0-based trial at which the running best of ``history`` (the best after each trial) last went down."""
    last = 0
    for k in range(1, len(history)):
        if history[k] < history[k - 1]:
            last = k
    return last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=150, help="the default budget (nmmc tune's --trials)")
    parser.add_argument("--factor", type=int, default=4, help="the larger budget, as a multiple of --trials")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens", default="1,32,128,512")
    args = parser.parse_args()
    target = with_launch(with_lnc(get_target("trn2"), 2), IN_GRAPH)
    larger = args.trials * args.factor
    print(f"== trn2 LNC=2 in-graph: the fused MLP tuned with {args.trials} and {larger} trials (seed {args.seed}); "
          "cost-model latencies, us")
    print(f"{'model':17s} {'tokens':>6s} {'MLP':>5s} {args.trials:>9d} {larger:>9d}  ratio  last  "
          f"{'s':>5s} {'s':>5s}")
    start = time.perf_counter()
    ratios: list[float] = []
    misses: list[str] = []
    for name, (hidden, intermediate) in SHAPES.items():
        for tokens in (int(t) for t in args.tokens.split(",")):
            for keep in (None, 0.9, 0.8):
                workload = (mlp_workload(tokens, hidden, intermediate, dense=True) if keep is None
                            else mlp_workload(tokens, hidden, intermediate, keep_ratio=keep))
                runs = []
                for trials in (args.trials, larger):
                    began = time.perf_counter()
                    tuned = tune(workload, target=target, dialect="nki", trials=trials, seed=args.seed)
                    runs.append((tuned, time.perf_counter() - began))
                small, big = (run[0].compiled.cost.latency_us for run in runs)
                ratio = small / big
                ratios.append(ratio)
                label = "dense" if keep is None else f"{keep:g}"
                last = last_improvement(runs[0][0].search.trial_history)
                print(f"{name:17s} {tokens:6d} {label:>5s} {small:9.1f} {big:9.1f}  {ratio:5.3f} {last:5d} "
                      f"{runs[0][1]:5.1f} {runs[1][1]:5.1f}", flush=True)
                if ratio > 1 + AGREE:
                    misses.append(f"{name} t={tokens} {label}: {ratio:.3f}x (last improvement at trial {last})")
    agree = sum(abs(r - 1) <= AGREE for r in ratios)
    worse = sum(r < 1 - AGREE for r in ratios)
    print(f"{agree} of {len(ratios)} points agree; the {larger}-trial search is faster at {len(misses)}, slower at "
          f"{worse}; geomean default/larger {math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f}, "
          f"worst {max(ratios):.3f}")
    for miss in misses:
        print(f"  missed: {miss}")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

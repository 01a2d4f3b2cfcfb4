#!/usr/bin/env python3
"""Tensor-parallel MLPs: every sharding strategy against the dense alternatives, per rank and in total.

For the MLPs of Llama-3.1-8B and Llama-3.2-3B at keep ratio 0.8 (block-aligned ranks), at 1, 32, 512
and 2048 tokens, over 2, 8 and 32 NeuronCores of a trn1 and a trn2 instance, this plans the sharded
MLP as ``nmmc tune --mlp ... --tp N`` does (every per-rank kernel tuned, answered from the result
cache when tuned before) and prints, per strategy, the per-rank kernel time (lockstep stages: the
slowest rank's), the communication time, the total, and the bytes each rank sends in the
collectives; then the two dense alternatives (AWS's kernel per projection + all-reduce, nmmc's
fused dense MLP + all-reduce) and the choice. The column ``rank/out`` is the byte ratio of the
all-reduce on the tokens x r intermediate (``reduce-rank``) to the all-reduce of the tokens x hidden
output (``reduce-output``): r / hidden.

Kernel latencies are the cost model's (its measured error per target is in cost_model/trust.py);
collective costs are an alpha-beta ring model of published NeuronLink bandwidths, not validated
against measurements. Usage:
  python benchmarks/tensor_parallel.py [--targets trn1,trn2] [--tokens 1,32,512,2048] [--tp 2,8,32]
                                       [--models llama3.1-8b,llama3.2-3b] [--trials 150] [--jobs 2]
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor

from neuronmm_compiler.cost_model.collectives import UNVALIDATED
from neuronmm_compiler.cost_model.trust import trust_note
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.support import resolve_dialect
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.tensor_parallel.commands import tuned_kernels
from neuronmm_compiler.tensor_parallel.planner import plan_tp

MODELS = {"llama3.1-8b": (4096, 14336), "llama3.2-3b": (3072, 8192)}  # hidden, intermediate
SHORT = {"replicate-u": "repU", "factor-shard": "own", "reduce-output": "AR-out", "reduce-rank": "AR-rank"}


def run_case(args: tuple[str, int, int, str, int]) -> tuple[list[str], dict]:
    model, tokens, tp, target_name, trials = args
    hidden, intermediate = MODELS[model]
    target = get_target(target_name)
    dialect = resolve_dialect("auto", target.name, None)
    kernels = tuned_kernels(target, dialect, trials=trials, seed=0, method=None, exhaustive_threshold=None,
                            cache_dir=None, use_cache=True)
    result = plan_tp(mlp_workload(tokens, hidden, intermediate, keep_ratio=0.8), tp, target, dialect, kernels)
    by_name = {r.strategy.name: r for r in result.applicable}
    out, rank = by_name.get("replicate-u/reduce-output"), by_name.get("replicate-u/reduce-rank")
    saving = f"{rank.comm_bytes / out.comm_bytes:.3f}" if out and rank else "-"
    head = f"{model:<12} {tokens:>5} {tp:>3} {target_name:<5}"
    lines = []
    for r in result.results:
        name = "/".join(SHORT[p] for p in (r.strategy.gate_up, r.strategy.down))
        if r.error is not None:
            lines.append(f"{head} {name:<22} does not apply (no 128-aligned shard rank compresses the shard)")
            continue
        mark = "  <- chosen" if r is result.chosen else ""
        lines.append(f"{head} {name:<22} {r.kernel_us:>10.1f} {r.comm_us:>8.1f} {r.total_us:>10.1f} "
                     f"{r.comm_bytes / 1024:>10.1f} {saving:>8}{mark}")
    for label, alt in result.alternatives.items():
        name = "dense AWS+AR" if label.startswith("dense, AWS") else "dense nmmc+AR"
        if alt is None:
            lines.append(f"{head} {name:<22} not modelled")
            continue
        speedup = alt["total_us"] / result.chosen.total_us
        lines.append(f"{head} {name:<22} {alt['kernel_us']:>10.1f} {alt['comm_us']:>8.1f} {alt['total_us']:>10.1f} "
                     f"{out.comm_bytes / 1024 if out else 0:>10.1f} {'-':>8}  choice: {speedup:.2f}x its speed")
    summary = {"chosen": result.chosen.strategy.name,
               "vs": {label: None if alt is None else alt["total_us"] / result.chosen.total_us
                      for label, alt in result.alternatives.items()},
               "rank_beats_output": [by_name[f"{g}/reduce-rank"].total_us < by_name[f"{g}/reduce-output"].total_us
                                     for g in ("replicate-u", "factor-shard")
                                     if f"{g}/reduce-rank" in by_name and f"{g}/reduce-output" in by_name]}
    return lines, summary


def summary_lines(summaries: list[dict]) -> list[str]:
    """How often each strategy is chosen, the choice against each alternative, reduce-rank against reduce-output."""
    import math
    from collections import Counter

    lines = ["summary:"]
    for name, count in Counter(s["chosen"] for s in summaries).most_common():
        lines.append(f"  chosen {count:>3} of {len(summaries)}: {name}")
    for label in summaries[0]["vs"]:
        ratios = [s["vs"][label] for s in summaries if s["vs"][label]]
        if ratios:
            mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            slower = sum(r < 1 for r in ratios)
            lines.append(f"  choice vs {label}: geometric mean {mean:.2f}x, min {min(ratios):.2f}x, max "
                         f"{max(ratios):.2f}x; the alternative is predicted faster at {slower} of {len(ratios)}")
    pairs = [b for s in summaries for b in s["rank_beats_output"]]
    lines.append(f"  reduce-rank faster than reduce-output (same gate/up strategy) at {sum(pairs)} of {len(pairs)} "
                 "pairs")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="trn1,trn2")
    parser.add_argument("--tokens", default="1,32,512,2048")
    parser.add_argument("--tp", default="2,8,32")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    cases = [(m, int(t), int(n), target, args.trials) for m in args.models.split(",")
             for t in args.tokens.split(",") for n in args.tp.split(",") for target in args.targets.split(",")]
    print(f"{'model':<12} {'tok':>5} {'tp':>3} {'tgt':<5} {'strategy (gate-up/down)':<22} {'kernel us':>10} "
          f"{'comm us':>8} {'total us':>10} {'comm KiB':>10} {'rank/out':>8}")
    print("-" * 112)
    summaries = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for lines, summary in pool.map(run_case, cases):
            print("\n".join(lines), flush=True)
            print()
            summaries.append(summary)
    print("\n".join(summary_lines(summaries)))
    print("strategies: repU = U replicated, V split by columns; own = each shard factorised on its own (rank a "
          "multiple of 128 keeping the unsharded fraction of parameters); AR-out = U_down split by rows, V_down "
          "replicated, all-reduce of the tokens x hidden output; AR-rank = all-reduce of the tokens x r "
          "intermediate h_i U_down,i before V_down. comm KiB = bytes one rank sends.")
    for target in args.targets.split(","):
        print(f"{target}: kernel latencies are the cost model's; model error: {trust_note(get_target(target))}")
    print(UNVALIDATED)
    return 0


if __name__ == "__main__":
    sys.exit(main())

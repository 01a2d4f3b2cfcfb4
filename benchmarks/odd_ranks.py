#!/usr/bin/env python3
"""SVD MLPs whose rank is an odd number of 128-row tiles, on a logical core: this code against another checkout's.

For the MLPs of ``benchmarks/vs_nkilib.py`` (Llama-3.2-1B and 3B, Llama-3.1-8B whole and one rank of tp 8, Qwen3-4B),
the first two keep ratios from 0.5 to 0.95 whose block-aligned rank is an odd tile count (the programs of a logical
core cannot halve those tiles: docs/logical-cores.md, overlapping shares), at 1, 32, 96 and 512 tokens, on trn2 LNC=2
in-graph: the tuned latency (cost model, 150 trials, seed 0) and the split chosen. With ``--baseline-src DIR`` (the
``src`` directory of another checkout, e.g. a ``git worktree`` of an earlier commit) the same MLPs are tuned by that
code in a child process, and each line prints both and their ratio (> 1: this code is faster); the search is
deterministic, so the latencies repeat, and only the code differs. Usage:
  python benchmarks/odd_ranks.py [--baseline-src ../old/src] [--tokens 1,32,96,512]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Iterator

from vs_nkilib import SHAPES

from neuronmm_compiler.driver import tune
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc

KEEPS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def points(tokens: list[int]) -> list[tuple[str, float, int, int]]:
    """(model, keep ratio, rank, tokens) of every point, two odd-rank keep ratios (distinct ranks) per model."""
    out = []
    for model, (hidden, inter) in SHAPES.items():
        ranks: dict[int, float] = {}
        for keep in KEEPS:
            rank = mlp_workload(1, hidden, inter, keep_ratio=keep).graph().node("u_gate").shape[1]
            if (rank // 128) % 2 and rank not in ranks and len(ranks) < 2:
                ranks[rank] = keep
        out += [(model, keep, rank, t) for rank, keep in ranks.items() for t in tokens]
    return out


def tuned(tokens: list[int]) -> Iterator[tuple[float, str]]:
    """(tuned latency, split) of every point, in order, as each search ends."""
    target = with_launch(with_lnc(get_target("trn2"), 2), IN_GRAPH)
    for model, keep, _, t in points(tokens):
        hidden, inter = SHAPES[model]
        found = tune(mlp_workload(t, hidden, inter, keep_ratio=keep), target=target, dialect="nki", trials=150)
        yield found.compiled.cost.latency_us, found.compiled.schedule.lnc_split


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", help="the src directory of the checkout to compare with")
    parser.add_argument("--tokens", default="1,32,96,512")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.child:
        for latency, split in tuned(tokens):
            print(f"{latency!r} {split}")
        return 0
    baseline = None
    if args.baseline_src:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(args.baseline_src))
        child = subprocess.run([sys.executable, __file__, "--child", "--tokens", args.tokens], env=env, check=True,
                               capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
        baseline = [(float(a), b) for a, b in (line.split() for line in child.stdout.splitlines())]
    print("trn2 LNC=2, in-graph; tuned latencies are the cost model's (us)")
    print(f"{'model':17} {'keep':>5} {'rank':>5} {'tiles':>5} {'tokens':>6} {'this':>9} {'split':>12}"
          + (f" {'baseline':>9} {'split':>12} {'ratio':>7}" if baseline else ""))
    ratios = []
    for i, ((model, keep, rank, t), (latency, split)) in enumerate(zip(points(tokens), tuned(tokens), strict=True)):
        line = f"{model:17} {keep:5} {rank:5} {rank // 128:5} {t:6} {latency:9.2f} {split:>12}"
        if baseline:
            ratio = baseline[i][0] / latency
            ratios.append(ratio)
            line += f" {baseline[i][0]:9.2f} {baseline[i][1]:>12} {ratio:7.4f}"
        print(line, flush=True)
    if ratios:
        faster = sum(r > 1.0005 for r in ratios)
        slower = sum(r < 0.9995 for r in ratios)
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"against the baseline: {faster} faster, {slower} slower of {len(ratios)}; geomean {geo:.4f}x, "
              f"max {max(ratios):.4f}x, min {min(ratios):.4f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

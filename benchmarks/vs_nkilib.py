#!/usr/bin/env python3
"""nmmc's MLP kernels against what NxD Inference runs: nki-library's fused MLP, side by side in one run.

For the MLPs of Llama-3.2-1B and 3B, Llama-3.1-8B (whole, and one rank of tensor parallelism 8) and Qwen3-4B, at
1 to 2048 tokens, on trn2 at LNC=2 (the platform default) and LNC=1, in-graph launch (an MLP runs inside a model
graph), this prints the predicted latency of

* ``nkilib``: nki-library's MLP as nmmc models it (lowerings/nkilib_mlp.py: its decode kernel at <= 96 tokens,
  its prefill kernel above, every constant from aws-neuron/nki-library@d2ad3a57), or why it does not run the shape;
* ``nmmc dense``: nmmc's fused dense MLP, tuned (exact, like nkilib's);
* ``svd 0.9`` / ``svd 0.8``: nmmc's fused SVD MLP at keep ratio 0.9 / 0.8, tuned (an approximation: the SVD changes
  the model's outputs, see docs/compression.md);

and the speedups of each over nkilib. All latencies are the cost model's, with trn2's error band (validated on
one-core GEMMs; fused kernels and LNC=2 not measured), so these are predictions, not measurements. A loss is
printed as a loss. Usage:
  python benchmarks/vs_nkilib.py [--trials 150] [--lnc 2,1] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from neuronmm_compiler.cost_model.trust import trust_note, typical_range
from neuronmm_compiler.driver import tune
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.speedups import speedup_text
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc

#: (hidden, intermediate) of each model's MLP (models/configs/*.json; tp8: one rank's column/row shards).
SHAPES: dict[str, tuple[int, int]] = {
    "llama-3.2-1b": (2048, 8192),
    "llama-3.2-3b": (3072, 8192),
    "llama-3.1-8b": (4096, 14336),
    "llama-3.1-8b tp8": (4096, 1792),
    "qwen3-4b": (2560, 9728),
}
TOKENS: tuple[int, ...] = (1, 8, 32, 96, 128, 512, 2048)


def _us(cost) -> str:
    return f"{cost.latency_us:9.1f}" if cost is not None and cost.feasible else f"{'n/a':>9}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--lnc", default="2,1")
    parser.add_argument("--quick", action="store_true", help="1, 32 and 512 tokens only")
    args = parser.parse_args()
    tokens_list = (1, 32, 512) if args.quick else TOKENS
    start = time.perf_counter()
    losses: list[str] = []
    ratios: dict[str, list[float]] = {"dense": [], "svd 0.9": [], "svd 0.8": []}
    for lnc in (int(v) for v in args.lnc.split(",")):
        target = with_launch(with_lnc(get_target("trn2"), lnc), IN_GRAPH)
        print(f"== trn2 LNC={lnc}, in-graph ({target.in_graph_kernel_us:g} us per kernel, assumed); "
              f"{trust_note(target, fused=True)}")
        print(f"{'model':17} {'tokens':>6} {'kernel':>7} {'nkilib us':>9} {'band':>15} {'nmmc dense':>10} "
              f"{'vs nkilib':>15} {'svd 0.9':>9} {'vs nkilib':>15} {'svd 0.8':>9} {'vs nkilib':>15}  nkilib note")
        for model, (hidden, inter) in SHAPES.items():
            for tokens in tokens_list:
                dense = tune(mlp_workload(tokens, hidden, inter, dense=True), target=target, dialect="nki",
                             trials=args.trials)
                nk = dense.baselines["nkilib-mlp"]
                svd = {keep: tune(mlp_workload(tokens, hidden, inter, keep_ratio=keep), target=target, dialect="nki",
                                  trials=args.trials).compiled.cost for keep in (0.9, 0.8)}
                ok = nk.cost is not None and nk.cost.feasible
                band = typical_range(nk.cost.latency_us, target) if ok else None
                cells = []
                for name, cost in (("dense", dense.compiled.cost), ("svd 0.9", svd[0.9]), ("svd 0.8", svd[0.8])):
                    if ok:
                        ratio = nk.cost.latency_us / cost.latency_us
                        ratios[name].append(ratio)
                        cells.append(f"{_us(cost)} {speedup_text(ratio):>15}")
                        if name == "dense" and ratio < 1:
                            losses.append(f"LNC={lnc} {model} t={tokens}: nmmc dense {speedup_text(ratio)}")
                    else:
                        cells.append(f"{_us(cost)} {'n/a':>15}")
                band_text = f"{band[0]:.1f}-{band[1]:.1f}" if band else "-"
                note = nk.reason if not ok else f"split {nk.details.get('lnc_split', 'none')}"
                variant = (nk.details or {}).get("variant", "-")
                print(f"{model:17} {tokens:6} {variant:>7} {_us(nk.cost)} {band_text:>15} {'  '.join(cells)}  {note}",
                      flush=True)
    for name, values in ratios.items():
        if values:
            geo = math.exp(sum(map(math.log, values)) / len(values))
            print(f"{name} vs nkilib over {len(values)} points: geomean {geo:.3f}x, median "
                  f"{sorted(values)[len(values) // 2]:.3f}x, min {min(values):.3f}x, max {max(values):.3f}x")
    print("points where nmmc's dense MLP is predicted slower than nkilib: " + ("; ".join(losses) or "none"))
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

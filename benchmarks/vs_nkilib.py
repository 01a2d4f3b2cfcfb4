#!/usr/bin/env python3
"""nmmc's MLP kernels against what NxD Inference runs: nki-library's fused MLP, side by side in one run.

For the MLPs of Llama-3.2-1B and 3B, Llama-3.1-8B (whole, and one rank of tensor parallelism 8) and Qwen3-4B, at
1 to 2048 tokens, on trn2 at LNC=2 (the platform default) and LNC=1, in-graph launch (an MLP runs inside a model
graph), this prints the predicted latency of

* ``nkilib``: nki-library's MLP as nmmc models it and as vLLM Neuron calls it (lowerings/nkilib_mlp.py: its decode
  kernel at <= 96 tokens, read from aws-neuron/nki-library@d2ad3a57, its prefill kernel above, read from @092a49dc;
  lowerings/nkilib_source.py says why), or why it does not run the shape; ``ref`` before a latency where the kernel
  would run but vLLM Neuron does not call it (its PyTorch fallback runs there): a reference, no ratio over it;
* ``nmmc dense``: nmmc's fused dense MLP, tuned (exact, like nkilib's);
* ``svd 0.9`` / ``svd 0.8``: nmmc's fused SVD MLP at keep ratio 0.9 / 0.8, tuned (an approximation: the SVD changes
  the model's outputs, see docs/compression.md);

and the speedups of each over nkilib. All latencies are the cost model's, with trn2's error band (validated on
one-core GEMMs; fused kernels and LNC=2 not measured), so these are predictions, not measurements. A loss is
printed as a loss. Usage:
  python benchmarks/vs_nkilib.py [--trials 150] [--lnc 2,1] [--quick] [--nmmc-from RESULTS.txt]

``--nmmc-from`` takes nmmc's three columns from an earlier run's output instead of tuning them again: for a change to
the nki-library model alone (its columns are recomputed; the search, and so nmmc's latencies, are unchanged), a run of
seconds instead of a quarter of an hour. The output says which file they came from.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from neuronmm_compiler.cost_model.trust import trust_note, typical_range
from neuronmm_compiler.driver import tune
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings import lowering_for
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc
from neuronmm_compiler.tuning.speedups import speedup_text

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


def _earlier(path: str) -> dict[tuple[int, str, int], tuple[float, float, float]]:
    """nmmc's (dense, SVD 0.9, SVD 0.8) latencies per (LNC, model, tokens) in an earlier run's output."""
    out: dict[tuple[int, str, int], tuple[float, float, float]] = {}
    lnc = 0
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("== trn2 LNC="):
            lnc = int(line.split("LNC=")[1].split(",")[0])
            continue
        model = next((m for m in sorted(SHAPES, key=len, reverse=True) if line.startswith(m + " ")), None)
        if model is None:
            continue
        cells = line[len(model):].split()
        # tokens, kernel, nkilib us ("n/a", a latency, or "ref" and a latency), its band ("-" or low-high), then nmmc's
        at = 5 if cells[2] == "ref" else 4
        values = [float(cells[at]), float(cells[at + 2]), float(cells[at + 4])]
        out[(lnc, model, int(cells[0]))] = (values[0], values[1], values[2])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--lnc", default="2,1")
    parser.add_argument("--quick", action="store_true", help="1, 32 and 512 tokens only")
    parser.add_argument("--nmmc-from", default=None, help="take nmmc's columns from this earlier run's output")
    args = parser.parse_args()
    earlier = _earlier(args.nmmc_from) if args.nmmc_from else None
    if earlier is not None:
        print(f"nmmc's columns (nmmc dense, svd 0.9, svd 0.8) from {args.nmmc_from}; nki-library's recomputed")
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
                if earlier is not None:
                    workload = mlp_workload(tokens, hidden, inter, dense=True)
                    nk = lowering_for(workload).baselines(workload, target)["nkilib-mlp"]
                    us = dict(zip(("dense", "svd 0.9", "svd 0.8"), earlier[(lnc, model, tokens)], strict=True))
                else:
                    dense = tune(mlp_workload(tokens, hidden, inter, dense=True), target=target, dialect="nki",
                                 trials=args.trials)
                    nk = dense.baselines["nkilib-mlp"]
                    us = {"dense": dense.compiled.cost.latency_us,
                          **{f"svd {keep}": tune(mlp_workload(tokens, hidden, inter, keep_ratio=keep), target=target,
                                                 dialect="nki", trials=args.trials).compiled.cost.latency_us
                             for keep in (0.9, 0.8)}}
                ok = nk.cost is not None and nk.cost.feasible and nk.runnable  # no ratio over a reference
                band = typical_range(nk.cost.latency_us, target) if ok else None
                cells = []
                for name, latency in us.items():
                    if ok:
                        ratio = nk.cost.latency_us / latency
                        ratios[name].append(ratio)
                        cells.append(f"{latency:9.1f} {speedup_text(ratio):>15}")
                        if name == "dense" and ratio < 1:
                            losses.append(f"LNC={lnc} {model} t={tokens}: nmmc dense {speedup_text(ratio)}")
                    else:
                        cells.append(f"{latency:9.1f} {'n/a':>15}")
                band_text = f"{band[0]:.1f}-{band[1]:.1f}" if band else "-"
                note = (nk.not_runnable or nk.reason) if not ok else f"split {nk.details.get('lnc_split', 'none')}"
                variant = (nk.details or {}).get("variant", "-")
                shown = _us(nk.cost) if nk.runnable or nk.cost is None else f"ref {nk.cost.latency_us:5.1f}"
                print(f"{model:17} {tokens:6} {variant:>7} {shown:>9} {band_text:>15} {'  '.join(cells)}  {note}",
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

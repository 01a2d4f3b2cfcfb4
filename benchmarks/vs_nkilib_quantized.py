#!/usr/bin/env python3
"""nmmc's quantized prefill MLP against nki-library's quantized prefill MLP, side by side in one run.

For the MLPs of Llama-3.1-8B (4096 x 14336, one whole MLP) and a Llama-3.2-3B-sized one (4096 x 3584), at 128, 512
and 2048 tokens, in-graph launch at LNC=2, this prints the predicted latency of nmmc's tuned fused dense MLP and of
nki-library's MLP as nmmc models it (lowerings/nkilib_mlp.py), and the speedup of nmmc over it:

* ``fp8 row`` on trn2 and trn3 (``--dtype fp8 --act-scale row``): nki-library's FP8 ROW prefill path as NxD
  Inference runs it, two kernels (``rmsnorm_quant`` @d2ad3a57, then ``mlp_cte`` @092a49dc;
  lowerings/nkilib_cte_fp8.py), each paying its in-graph launch;
* ``mxfp8_e4m3`` / ``mxfp8_e5m2`` / ``mxfp4`` on trn3: nki-library's MX prefill MLP (``mlp_cte_mx`` @092a49dc,
  lowerings/nkilib_cte_mx.py; its hidden arrives MX-quantized, the quantizing kernel is not charged, so it favours
  nki-library) where it runs (mxfp8_e4m3 only); else its row says why not.

All latencies are the cost model's (validated on one-core GEMMs; fused kernels, FP8/MX and LNC=2 not measured), so
these are predictions, not measurements. A loss is printed as a loss. Usage:
  python benchmarks/vs_nkilib_quantized.py [--trials 150] [--formats mxfp8_e4m3,mxfp8_e5m2,mxfp4]
"""

from __future__ import annotations

import argparse
import sys
import time

from neuronmm_compiler.cost_model.trust import trust_note
from neuronmm_compiler.driver import tune
from neuronmm_compiler.frontends.mx import MxWeights
from neuronmm_compiler.frontends.shapes import Fp8Weights
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc
from neuronmm_compiler.tuning.speedups import speedup_text

SHAPES: dict[str, tuple[int, int]] = {"llama-3.1-8b": (4096, 14336), "4096x3584": (4096, 3584)}
TOKENS: tuple[int, ...] = (128, 512, 2048)
#: (label, target, workload keyword arguments)
FORMATS = (("fp8 row", "trn2", {"fp8": Fp8Weights(act_scale="row")}),
           ("fp8 row", "trn3", {"fp8": Fp8Weights(act_scale="row")}),
           ("mxfp8_e4m3", "trn3", {"mx": MxWeights("mxfp8_e4m3")}),
           ("mxfp8_e5m2", "trn3", {"mx": MxWeights("mxfp8_e5m2")}),
           ("mxfp4", "trn3", {"mx": MxWeights("mxfp4")}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--formats", default="", help="comma-separated labels to run (default: all)")
    args = parser.parse_args()
    chosen = set(args.formats.split(",")) if args.formats else None
    start = time.perf_counter()
    losses: list[str] = []
    wins: list[str] = []
    for label, name, kwargs in FORMATS:
        if chosen is not None and label not in chosen:
            continue
        target = with_launch(with_lnc(get_target(name), 2), IN_GRAPH)
        print(f"== {label} on {name} LNC=2, in-graph ({target.in_graph_kernel_us:g} us per kernel, assumed); "
              f"{trust_note(target, fused=True)}")
        print(f"{'model':13} {'tokens':>6} {'nmmc us':>9} {'nkilib us':>10} {'kernels':>7} {'nmmc vs nkilib':>15}  "
              "nkilib note")
        for model, (hidden, inter) in SHAPES.items():
            for tokens in TOKENS:
                tuned = tune(mlp_workload(tokens, hidden, inter, dense=True, **kwargs), target=target, dialect="nki",
                             trials=args.trials)
                nmmc = tuned.compiled.cost.latency_us
                nk = tuned.baselines["nkilib-mlp"]
                ok = nk.cost is not None and nk.cost.feasible and nk.runnable
                kernels = (nk.details or {}).get("kernels", 1)
                if ok:
                    ratio = nk.cost.latency_us / nmmc
                    point = f"{label} {name} {model} t={tokens}: {speedup_text(ratio)}"
                    (losses if ratio < 1 else wins).append(point)
                    print(f"{model:13} {tokens:6} {nmmc:9.2f} {nk.cost.latency_us:10.2f} {kernels:7} "
                          f"{speedup_text(ratio):>15}  split {nk.details.get('lnc_split', 'none')}", flush=True)
                else:
                    shown = f"{nk.cost.latency_us:.2f}" if nk.cost is not None else "n/a"
                    print(f"{model:13} {tokens:6} {nmmc:9.2f} {shown:>10} {'-':>7} {'n/a':>15}  "
                          f"{nk.not_runnable or nk.reason}", flush=True)
    print("points where nmmc is predicted slower than nki-library: " + ("; ".join(losses) or "none"))
    print("points where nmmc is predicted faster: " + ("; ".join(wins) or "none"))
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Logical cores: nmmc's kernels at LNC=2 against the same workloads at LNC=1, side by side in one run.

For GEMMs and the MLPs of Llama-3.2-1B and Llama-3.1-8B (dense, and SVD at keep 0.8) at decode and prefill token
counts, and Qwen3-4B's SVD MLP at keep 0.8 (rank 1664: an odd count of 13 tiles, which the programs share with an
overlap, docs/logical-cores.md), on trn2 (and trn3 with --targets), this tunes nmmc's kernel at LNC=1 (one physical
core) and at LNC=2 (the logical core trn2/trn3 deploy by default), and prints the predicted latencies, the ratio
LNC=2 / LNC=1, the split the search chose, and how much the ratio moves under the model's one undocumented
assumption about logical cores: how much of the HBM stack the two programs draw together
(``ModelParams.lnc_hbm_share``; 1.0 shipped: each core at its own per-core rate; 0.5: the pair together at one
core's rate; docs/logical-cores.md). The 0.5 column re-tunes under that assumption.
Every LNC=2 winner small enough to interpret is verified with both programs run.

Latencies are the cost model's, standalone launch (45 us) included, with trn2's model error (validated on LNC=1
GEMMs; no LNC=2 kernel has been measured). Usage:
  python benchmarks/lnc.py [--targets trn2,trn3] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace

from neuronmm_compiler.cost_model.params import params_of
from neuronmm_compiler.cost_model.trust import trust_note
from neuronmm_compiler.driver import tune
from neuronmm_compiler.frontends.workloads import gemm_workload, mlp_workload
from neuronmm_compiler.targets import get_target, with_lnc
from neuronmm_compiler.verification import verify_source

INTERPRET_MAX_MATMULS = 20000


def cases(quick: bool) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = [
        ("gemm 4096x4096x4096", gemm_workload(4096, 4096, 4096)),
        ("gemm 1x4096x4096", gemm_workload(1, 4096, 4096)),
        ("gemm 512x8192x2048", gemm_workload(512, 8192, 2048)),
    ]
    models = {"llama3.2-1b": (2048, 8192), "llama3.1-8b": (4096, 14336)}
    for name, (hidden, intermediate) in models.items():
        for tokens in ((1, 512) if quick else (1, 32, 128, 512, 2048)):
            out.append((f"{name} mlp dense t={tokens}", mlp_workload(tokens, hidden, intermediate, dense=True)))
            out.append((f"{name} mlp svd0.8 t={tokens}", mlp_workload(tokens, hidden, intermediate, keep_ratio=0.8)))
    for tokens in ((96,) if quick else (1, 96, 512)):
        out.append((f"qwen3-4b mlp svd0.8 t={tokens}", mlp_workload(tokens, 2560, 9728, keep_ratio=0.8)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="trn2")
    parser.add_argument("--quick", action="store_true", help="fewer token counts")
    args = parser.parse_args()
    for target_name in args.targets.split(","):
        one = with_lnc(get_target(target_name), 1)
        two = with_lnc(one, 2)
        pessimistic = replace(two, params=replace(params_of(two), lnc_hbm_share=0.5))
        print(f"== {target_name}: LNC=2 vs LNC=1 (cost model; {trust_note(two)})")
        print(f"{'workload':32} {'LNC=1 us':>10} {'LNC=2 us':>10} {'ratio':>6} {'split':>9} {'share 0.5':>10} "
              f"{'ratio':>6}  verified")
        ratios, pessimistic_ratios = [], []
        for label, workload in cases(args.quick):
            t1 = tune(workload, target=one, dialect="nki").compiled
            t2 = tune(workload, target=two, dialect="nki").compiled
            t5 = tune(workload, target=pessimistic, dialect="nki").compiled
            ratio = t2.cost.latency_us / t1.cost.latency_us
            ratio5 = t5.cost.latency_us / t1.cost.latency_us
            ratios.append(ratio)
            pessimistic_ratios.append(ratio5)
            verified: object = "-"
            if t2.cost.matmul_instructions <= INTERPRET_MAX_MATMULS:
                verified = verify_source(t2.kernel.source, filename=label).ok
            print(f"{label:32} {t1.cost.latency_us:10.1f} {t2.cost.latency_us:10.1f} {ratio:6.3f} "
                  f"{t2.schedule.lnc_split:>9} {t5.cost.latency_us:10.1f} {ratio5:6.3f}  {verified}")
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        geo5 = math.exp(sum(map(math.log, pessimistic_ratios)) / len(pessimistic_ratios))
        print(f"geomean LNC=2 / LNC=1: {geo:.3f} (HBM share 1.0, shipped), {geo5:.3f} (share 0.5); "
              f"median {sorted(ratios)[len(ratios) // 2]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

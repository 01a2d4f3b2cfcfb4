#!/usr/bin/env python3
"""What does one step of the search's polish buy, and what does it cost? The default tune with and without it, side
by side in one run.

For the MLP shapes ``benchmarks/vs_nkilib.py`` compares with nki-library (dense and SVD at keep 0.9 / 0.8, at 1, 8,
32, 96, 128, 512 and 2048 tokens), on trn2 in-graph at the given LNC, this tunes each MLP twice, the order alternating
from one MLP to the next: with the search as shipped and with one step switched off (``--without``):

  rival          the rival descents (search/tuner.py ``_rivals``): the best start of each other logical-core split
                 than the winner's, polished within its structural class
  extra-rivals   every rival descent but the first (the best-ranked start's)

and prints per MLP both tuned latencies (cost model, us), their ratio (> 1: the step found a faster schedule), the
schedules each search costed and its wall seconds; then how many MLPs the step made faster or slower, the schedules
costed in all, and the median per-MLP ratio of wall seconds. Every latency is a prediction of the same model; only
the search differs, and it is deterministic (same seed), so the latencies repeat; the seconds are this machine's.
Usage:
  python benchmarks/search_steps.py [--without rival] [--lnc 2] [--tokens 1,8,32,96,128,512,2048]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from vs_nkilib import SHAPES, TOKENS

from neuronmm_compiler.driver import tune
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.search import tuner
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc


@contextmanager
def _patched(name: str, value: object) -> Iterator[None]:
    saved = getattr(tuner, name)
    setattr(tuner, name, value)
    try:
        yield
    finally:
        setattr(tuner, name, saved)


STEPS: dict[str, Callable[[], object]] = {
    "rival": lambda: _patched("_rivals", lambda *args: []),
    "extra-rivals": lambda: _patched("RIVAL_DESCENTS", 1),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--without", choices=sorted(STEPS), default="rival", help="the step switched off")
    parser.add_argument("--lnc", type=int, default=2)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args()
    target = with_launch(with_lnc(get_target("trn2"), args.lnc), IN_GRAPH)
    off = STEPS[args.without]
    print(f"== trn2 LNC={args.lnc} in-graph: the fused MLP tuned with and without the '{args.without}' step "
          "(default budget, seed 0); cost-model latencies, us")
    print(f"{'model':17s} {'tokens':>6s} {'MLP':>5s} {'with':>9s} {'without':>9s}  ratio {'costed':>13s} "
          f"{'s':>5s} {'s':>5s}")
    faster: list[str] = []
    slower: list[str] = []
    costed = [0, 0]
    seconds: list[float] = []
    for model, (hidden, inter) in SHAPES.items():
        for tokens in (int(t) for t in args.tokens.split(",")):
            for mlp in ("dense", 0.9, 0.8):
                workload = (mlp_workload(tokens, hidden, inter, dense=True) if mlp == "dense"
                            else mlp_workload(tokens, hidden, inter, keep_ratio=mlp))
                runs: dict[bool, tuple[float, int, float]] = {}
                for with_step in ((True, False) if len(seconds) % 2 == 0 else (False, True)):
                    start = time.perf_counter()
                    if with_step:
                        result = tune(workload, target=target, dialect="nki")
                    else:
                        with off():
                            result = tune(workload, target=target, dialect="nki")
                    runs[with_step] = (result.compiled.cost.latency_us, result.search.evaluated,
                                       time.perf_counter() - start)
                (lat_w, n_w, s_w), (lat_o, n_o, s_o) = runs[True], runs[False]
                ratio = lat_o / lat_w
                costed[0] += n_w
                costed[1] += n_o
                seconds.append(s_w / s_o)
                label = f"{model} t={tokens} {mlp}"
                if ratio > 1.0005:
                    faster.append(f"{label} {ratio:.4f}x")
                elif ratio < 0.9995:
                    slower.append(f"{label} {ratio:.4f}x")
                print(f"{model:17s} {tokens:6d} {mlp!s:>5s} {lat_w:9.1f} {lat_o:9.1f} {ratio:6.3f} "
                      f"{n_w:6d}/{n_o:6d} {s_w:5.1f} {s_o:5.1f}", flush=True)
    print(f"with the step faster at {len(faster)} of {len(seconds)} MLPs: {'; '.join(faster) or 'none'}")
    print(f"with the step slower at {len(slower)}: {'; '.join(slower) or 'none'}")
    print(f"schedules costed: {costed[0]} with, {costed[1]} without ({costed[0] / costed[1]:.3f}x); wall seconds "
          f"with/without per MLP, median {statistics.median(seconds):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

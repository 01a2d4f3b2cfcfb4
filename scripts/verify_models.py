#!/usr/bin/env python3
"""Tune and verify the fused SVD MLP kernels of every model nmmc ships a config for.

For Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B, Qwen3-1.7B and Qwen3-4B at keep ratio 0.8, this runs
what ``nmmc tune --model <config> --keep-ratio 0.8 --tokens 1,32,128,512,2048 -o DIR`` does, checks
the block-aligned ranks against the paper's (1280, 1792, 2560, 1280, 1664), and runs every emitted
kernel in the interpreter against the float64 reference. Long (tens of minutes: the largest kernels
issue tens of thousands of matmuls); the test suite covers the smaller cases.

Usage: python scripts/verify_models.py [--out DIR] [--tokens 1,32,128,512,2048] [--models llama-3.2-1b,...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from neuronmm_compiler.checkpoints.config import KNOWN_MODELS, known_config
from neuronmm_compiler.model_tuning.pipeline import parse_buckets, resolve_model, tune_model
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_file

PAPER_RANKS = {"llama-3.2-1b": 1280, "llama-3.2-3b": 1792, "llama-3.1-8b": 2560, "qwen3-1.7b": 1280,
               "qwen3-4b": 1664}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="where to write the kernels (default: a temporary directory)")
    parser.add_argument("--tokens", default="1,32,128,512,2048")
    parser.add_argument("--models", default=",".join(KNOWN_MODELS))
    parser.add_argument("--target", default="trn1")
    parser.add_argument("--trials", type=int, default=150)
    args = parser.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="nmmc-models-"))
    failures = 0
    for name in args.models.split(","):
        source = resolve_model(known_config(name), 0.8)
        rank_ok = source.ranks == (PAPER_RANKS[name],) * 3
        print(f"{name}: ranks {source.ranks} ({'as the paper' if rank_ok else 'DIFFERENT FROM THE PAPER'})",
              flush=True)
        failures += not rank_ok
        out = root / name
        index = tune_model(source, parse_buckets(args.tokens), out, target=get_target(args.target), dialect="nki",
                           trials=args.trials, seed=0)
        for entry in index["buckets"]:
            start = time.perf_counter()
            report = verify_file(out / entry["file"])
            status = "ok" if report.ok else f"FAILED: {report.error}"
            failures += not report.ok
            print(f"  {entry['tokens']:>5} tokens  {entry['file']:<14} predicted {entry['predicted_us']:9.1f} us  "
                  f"verify {status} (rel {report.rel_error}, {time.perf_counter() - start:.0f} s)", flush=True)
    print(f"\n{failures} failure(s); kernels in {root}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

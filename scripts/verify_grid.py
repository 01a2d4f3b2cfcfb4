#!/usr/bin/env python3
"""Emit and verify GEMM kernels over a wide grid: presets x dialects x layouts x dtypes x shapes.

Longer than the CI suite (a few minutes). Prints one line per kernel and a summary; exits non-zero
if any kernel fails. Usage: python scripts/verify_grid.py [--quick] [--seed S] [--target trn1]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.errors import ScheduleError
from neuronmm_compiler.frontends.workloads import gemm_workload
from neuronmm_compiler.ir import canonical_dtype
from neuronmm_compiler.schedule import PRESETS
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source

SHAPES = [
    (1, 512, 128), (1, 4096, 4096), (7, 2048, 8192), (32, 2048, 2048), (127, 3072, 8192),
    (200, 700, 300), (513, 1025, 129), (1024, 2048, 1024), (2048, 2048, 2048), (4096, 1024, 512),
]
QUICK = [(1, 512, 128), (200, 700, 300), (1024, 2048, 1024)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="three shapes only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="trn1")
    args = parser.parse_args()
    shapes = QUICK if args.quick else SHAPES
    failures = skipped = passed = 0
    start = time.perf_counter()
    for shape, preset, dialect, layout, dtype in itertools.product(
        shapes, PRESETS, ("nki", "neuronxcc"), ("mk", "km"), ("bf16", "fp32")
    ):
        label = f"{'x'.join(map(str, shape)):>16} {preset:<20} {dialect:<9} {layout} {dtype}"
        try:
            workload = gemm_workload(*shape, dtype=canonical_dtype(dtype), a_layout=layout)
            compiled = compile_workload(workload, preset=preset, dialect=dialect, target=get_target(args.target))
        except ScheduleError as exc:
            skipped += 1
            print(f"{label}  does not fit: {exc}")
            continue
        t0 = time.perf_counter()
        report = verify_source(compiled.kernel.source, filename=label, seed=args.seed)
        seconds = time.perf_counter() - t0
        if report.ok:
            passed += 1
            print(f"{label}  ok   rel {report.rel_error:.2e}  {seconds:6.2f}s")
        else:
            failures += 1
            print(f"{label}  FAIL {report.error}")
    print(f"\n{passed} passed, {failures} failed, {skipped} did not fit, {time.perf_counter() - start:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

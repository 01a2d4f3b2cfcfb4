#!/usr/bin/env python3
"""Run nki-library's MLP, as nmmc models it (lowerings/nkilib_mlp.py), through nmmc's interpreter.

The ``nkilib-mlp`` baseline is a program of nmmc's kernel IR; this prints it as a kernel file (never shipped to
users) and verifies it like any nmmc kernel: every program of the logical core run, the result compared with the
float64 reference of the dense MLP, NKI's rules checked. Usage:
  python scripts/verify_nkilib.py [--target trn2] [--lnc 1,2] TOKENSxHIDDENxINTERMEDIATE ...
  python scripts/verify_nkilib.py --benchmark      # the shapes of benchmarks/vs_nkilib.py (minutes)
  python scripts/verify_nkilib.py --fp8 1x4096x3584 # its FP8 path (QuantizationType.ROW) against its own float64
                                                    # reference (lowerings/nkilib_fp8.py: FP8 weights, bf16 activations)
Exit status 1 when a kernel fails verification.
"""

from __future__ import annotations

import argparse
import sys
import time

from neuronmm_compiler.lowerings.nkilib_mlp import NotModelled, nkilib_source, nkilib_variant
from neuronmm_compiler.targets import get_target, with_lnc
from neuronmm_compiler.verification import verify_source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", help="TOKENSxHIDDENxINTERMEDIATE")
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--lnc", default="1,2")
    parser.add_argument("--benchmark", action="store_true", help="every shape of benchmarks/vs_nkilib.py")
    parser.add_argument("--fp8", action="store_true", help="the FP8 path (float8_e4m3 weights, per-channel scales)")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    if args.benchmark:
        sys.path.insert(0, "benchmarks")
        from vs_nkilib import SHAPES, TOKENS

        shapes += [(t, h, i) for h, i in SHAPES.values() for t in TOKENS]
    if not shapes:
        parser.error("give shapes or --benchmark")
    failed = 0
    for lnc in (int(v) for v in args.lnc.split(",")):
        target = with_lnc(get_target(args.target), lnc)
        for tokens, hidden, inter in shapes:
            what = f"{tokens}x{hidden}x{inter} {nkilib_variant(tokens)} LNC={lnc}" + (" fp8" if args.fp8 else "")
            if args.fp8:
                failed += not _fp8(what, tokens, hidden, inter, target)
                continue
            try:
                source = nkilib_source(tokens, hidden, inter, target)
            except NotModelled as exc:
                print(f"{what:36} not run by nki-library: {exc}")
                continue
            start = time.perf_counter()
            report = verify_source(source, filename=f"nkilib_{tokens}x{hidden}x{inter}.py", rules=True)
            seconds = time.perf_counter() - start
            status = "OK" if report.ok else "FAILED"
            rel = f"{report.rel_error:.2e}" if report.rel_error is not None else "n/a"
            print(f"{what:36} {status}: relative error {rel}, {seconds:.1f} s" + (f"; {report.error}"
                                                                                  if report.error else ""))
            failed += not report.ok
    return 1 if failed else 0


def _fp8(what: str, tokens: int, hidden: int, inter: int, target) -> bool:
    from neuronmm_compiler.lowerings.nkilib_fp8 import verify_nkilib_fp8

    start = time.perf_counter()
    try:
        check = verify_nkilib_fp8(tokens, hidden, inter, target)
    except NotModelled as exc:
        print(f"{what:36} not run by nki-library: {exc}")
        return True
    rel = f"{check.rel_error:.2e}" if check.rel_error is not None else "n/a"
    status = "OK" if check.ok else "FAILED"
    extra = "; ".join(filter(None, [check.error, *check.violations]))
    print(f"{what:36} {status}: relative error {rel} (bound {check.tolerance:g}), "
          f"{time.perf_counter() - start:.1f} s" + (f"; {extra}" if extra else ""))
    return check.ok


if __name__ == "__main__":
    sys.exit(main())

"""Fuzz nmmc with random graph files: emit, verify, compare the cost model's bytes with the interpreter's.

    python scripts/fuzz.py --cases 5000 --seed 0 --jobs 2

Case i is drawn from random.Random(f"{seed}:{i}"), so any case can be rerun alone with
``--only i``. Prints the outcome counts (ok: emitted, verified, bytes equal; rejected: a one-line
user error, counted by message), and every internal error, verification failure or byte mismatch
with the case's graph file. Exits 1 if there was any of those. See src/neuronmm_compiler/verification/fuzz.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import random
import re
import sys
import time

from neuronmm_compiler.verification.fuzz import GOOD, random_case, run_case


def one(args: tuple[int, int]) -> tuple[int, str, str, int, str]:
    seed, index = args
    case = random_case(random.Random(f"{seed}:{index}"))
    outcome = run_case(case)
    return index, outcome.status, outcome.detail, outcome.kernels, case.describe()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", type=int, default=None, help="Run this case index alone and print it.")
    args = parser.parse_args()
    indices = [args.only] if args.only is not None else list(range(args.cases))
    started = time.perf_counter()
    counts: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    kernels: collections.Counter[int] = collections.Counter()
    failures = []
    work = [(args.seed, i) for i in indices]
    with multiprocessing.Pool(args.jobs) as pool:
        for index, status, detail, n_kernels, case in pool.imap_unordered(one, work, chunksize=8):
            counts[status] += 1
            if status == "ok":
                kernels[n_kernels] += 1
            elif status == "rejected":
                reasons[re.sub(r"%?\b(op|x|w|y)\d+\b|fuzz_k\d+", "#", detail)[:110]] += 1
            if status not in GOOD or args.only is not None:
                failures.append((index, status, detail, case))
            done = sum(counts.values())
            if done % 500 == 0:
                print(f"  {done} cases, {time.perf_counter() - started:.0f} s: {dict(counts)}", file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(f"nmmc fuzz: {len(indices)} cases, seed {args.seed}, {elapsed:.0f} s on {args.jobs} processes")
    for status in ("ok", "rejected", "internal", "unverified", "bytes"):
        print(f"  {status:<11}{counts[status]:>6}")
    print("  kernels per emitted file: " + ", ".join(f"{k}: {v}" for k, v in sorted(kernels.items())))
    print("rejections by message:")
    for reason, count in reasons.most_common():
        print(f"  {count:>5}  {reason}")
    for index, status, detail, case in sorted(failures):
        print(f"\n== case {index}: {status}\n{detail}\n{json.dumps(json.loads(case), indent=1)}")
    bad = sum(counts[s] for s in counts if s not in GOOD)
    print(f"\ninternal errors: {counts['internal']}, verification failures: {counts['unverified']}, "
          f"byte mismatches: {counts['bytes']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

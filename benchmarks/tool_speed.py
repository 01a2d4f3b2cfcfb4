#!/usr/bin/env python3
"""How fast is nmmc itself? Wall time (and peak memory) of the commands users wait for.

Each case runs ``nmmc`` in a fresh process (so start-up is included, as a user sees it) with
``--no-cache`` and ``--trials 150``: GEMM tunes (the shapes of issue 17 and, once each on trn1,
benchmarks/search_quality.py's), the SVD MLP at 2048 tokens (hidden 4096, intermediate 14336,
keep ratio 0.8), Llama-3.1-8B's MLP over five token buckets (``tune --model``), ``nmmc --help``, and
``nmmc verify`` of a 4096x8192x8192 GEMM with its peak resident memory.

With ``--base DIR`` (the ``src`` directory of another checkout, e.g. a worktree of main) every
case also runs against that code, interleaved with this checkout's run by run, so both see the
same load on a shared machine: the ratios of one run are what to compare. Medians of ``--repeat``
runs (suite shapes and verify: one run each unless ``--repeat-all``).

Usage:
  python benchmarks/tool_speed.py [--base ../main/src] [--repeat 3] [--skip-verify] [--skip-suite]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from search_quality import SUITE  # noqa: E402

MODEL = ROOT / "src" / "neuronmm_compiler" / "models" / "configs" / "llama-3.1-8b.json"
TUNE = ["tune", "--no-cache", "--trials", "150"]
CASES: list[tuple[str, list[str]]] = [
    ("nmmc --help", ["--help"]),
    ("GEMM 3000x5000x700", [*TUNE, "--shape", "3000x5000x700"]),
    ("GEMM 2000x3000x1000 fp32", [*TUNE, "--shape", "2000x3000x1000", "--dtype", "fp32"]),
    ("GEMM 2500x6000x1500 trn3", [*TUNE, "--shape", "2500x6000x1500", "--target", "trn3"]),
    ("GEMM 8192x8192x8192", [*TUNE, "--shape", "8192x8192x8192"]),
    ("MLP 2048 tok, 4096/14336, keep 0.8", [*TUNE, "--mlp", "--tokens", "2048", "--hidden", "4096",
                                            "--intermediate", "14336", "--keep-ratio", "0.8"]),
    ("Llama-3.1-8B x 5 buckets (--model)", [*TUNE, "--model", str(MODEL), "--keep-ratio", "0.8",
                                            "--tokens", "1,32,128,512,2048"]),
]
SUITE_CASES = [(f"suite {m}x{n}x{k}", [*TUNE, "--shape", f"{m}x{n}x{k}"]) for _, m, n, k in SUITE]
VERIFY_SHAPE = "4096x8192x8192"


def run(src: Path, args: list[str], out: Path) -> tuple[float, int]:
    """(wall seconds, peak resident bytes) of ``nmmc ARGS`` run on the package in ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    if args[0] == "tune":
        args = [*args, "-o", str(out)]
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "from neuronmm_compiler.cli import main; main()", *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"nmmc {' '.join(args)} (src {src}) exited {proc.returncode}: "
                           f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    return seconds, usage.ru_maxrss * 1024


def measure(cases: list[tuple[str, list[str]]], versions: dict[str, Path], repeat: int,
            work: Path) -> dict[str, dict[str, list[tuple[float, int]]]]:
    results: dict[str, dict[str, list[tuple[float, int]]]] = {}
    for index, (label, args) in enumerate(cases):
        results[label] = {name: [] for name in versions}
        for rep in range(repeat):
            for name, src in versions.items():
                out = work / f"{len(list(work.iterdir()))}-{index}-{name}-{rep}"
                results[label][name].append(run(src, args, out))
        print(_row(label, results[label]), flush=True)
    return results


def _row(label: str, runs: dict[str, list[tuple[float, int]]]) -> str:
    medians = {name: statistics.median(s for s, _ in values) for name, values in runs.items()}
    cells = "".join(f"{medians[name]:>10.2f}" for name in runs)
    ratio = f"{medians['before'] / medians['after']:>8.2f}x" if "before" in medians else ""
    return f"  {label:<38}{cells}{ratio}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, help="src directory of the code to compare with (e.g. a main worktree)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--repeat-all", action="store_true", help="repeat the suite shapes and verify too")
    parser.add_argument("--skip-verify", action="store_true")
    parser.add_argument("--skip-suite", action="store_true")
    parser.add_argument("--cases", default="", help="only the main cases whose label contains one of these "
                                                    "comma-separated words (default: all)")
    options = parser.parse_args()
    versions = {"before": options.base.resolve()} if options.base else {}
    versions["after"] = ROOT / "src"
    print(f"nmmc tool speed: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; "
          f"wall seconds, median of {options.repeat}, in a fresh process each (start-up included), --no-cache")
    print(f"  {'case':<38}" + "".join(f"{name:>10}" for name in versions) + ("   ratio" if options.base else ""))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        chosen = [case for case in CASES if not options.cases
                  or any(word in case[0] for word in options.cases.split(","))]
        results = measure(chosen, versions, options.repeat, work)
        once = options.repeat if options.repeat_all else 1
        if not options.skip_suite:
            print(f"  search_quality.py shapes on trn1 (median of {once}):")
            suite = measure(SUITE_CASES, versions, once, work)
            results.update(suite)
            gemm = [label for label in results if label.startswith(("GEMM", "suite"))]
            for name in versions:
                values = [statistics.median(s for s, _ in results[label][name]) for label in gemm]
                print(f"  {name}: median GEMM tune {statistics.median(values):.2f} s, worst {max(values):.2f} s "
                      f"over {len(values)} GEMM cases")
        if not options.skip_verify:
            kernel = work / "verify.py"
            subprocess.run([sys.executable, "-c", "from neuronmm_compiler.cli import main; main()", "emit",
                            "--shape", VERIFY_SHAPE, "-o", str(kernel)], check=True, stdout=subprocess.DEVNULL,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
            print(f"  nmmc verify {VERIFY_SHAPE} (aws-fully-optimized), median of {once}:")
            for name, src in versions.items():
                runs = [run(src, ["verify", str(kernel)], work / "unused") for _ in range(once)]
                seconds = statistics.median(s for s, _ in runs)
                peak = max(b for _, b in runs)
                print(f"    {name:<8}{seconds:>8.1f} s  peak RSS {peak / 2**30:.2f} GiB", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

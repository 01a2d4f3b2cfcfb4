#!/usr/bin/env python3
"""How long ``nmmc tune`` takes at its defaults: wall and CPU seconds of the seven commands of the tune-speed goal
(median at most 2 s, every one at most 5 s, on an idle 2-core machine).

Each command runs ``nmmc tune ... --no-cache`` (default target trn2 LNC=2, 150 trials) in a fresh process, start-up
included, as a user waits for it. CPU seconds (user + system of the child, from ``wait4``) are what to compare on a
shared machine: wall seconds there include the time other jobs held the cores. With ``--extra`` two slower commands
are timed too: ``nmmc export`` of Llama-3.2-1B for two buckets and the Llama-3.1-8B decode SVD MLP.

With ``--base DIR`` (the ``src`` directory of another checkout, e.g. ``git worktree add /tmp/base <commit>``) every
command also runs against that code, interleaved run by run with this checkout's, so both see the same load.

Usage:
  python benchmarks/tune_speed.py [--base /tmp/base/src] [--repeat 3] [--extra] [--only MLP,8192]
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
TUNE = ["tune", "--no-cache"]
MLP = ["--mlp", "--hidden", "4096", "--intermediate", "14336", "--keep-ratio", "0.8"]
CASES: list[tuple[str, list[str]]] = [
    ("GEMM 3000x5000x700", [*TUNE, "--shape", "3000x5000x700"]),
    ("GEMM 2000x3000x1000 fp32", [*TUNE, "--shape", "2000x3000x1000", "--dtype", "fp32"]),
    ("GEMM 8192x8192x8192", [*TUNE, "--shape", "8192x8192x8192"]),
    ("GEMM 1x11008x4096", [*TUNE, "--shape", "1x11008x4096"]),
    ("GEMM 130x9000x2100", [*TUNE, "--shape", "130x9000x2100"]),
    ("GEMM 2500x6000x1500 trn3", [*TUNE, "--shape", "2500x6000x1500", "--target", "trn3"]),
    ("SVD MLP 2048 tok 4096/14336 keep 0.8", [*TUNE, *MLP, "--tokens", "2048"]),
]
EXTRA: list[tuple[str, list[str]]] = [
    ("export llama-3.2-1b tokens 1,128",
     ["export", "llama-3.2-1b", "--tokens", "1,128", "--target", "trn2", "--no-cache"]),
    ("SVD MLP 1 tok (Llama-3.1-8B decode)", [*TUNE, *MLP, "--tokens", "1"]),
]


def run(src: Path, args: list[str], out: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of ``nmmc ARGS -o OUT`` run on the package in ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = [sys.executable, "-c", "from neuronmm_compiler.cli import main; main()", *args, "-o", str(out)]
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"nmmc {' '.join(args)} (src {src}) exited {code}: "
                           f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, help="src directory of the code to compare with (e.g. a worktree's)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per command and version (the median is printed)")
    parser.add_argument("--extra", action="store_true", help="also time the export and the decode SVD MLP")
    parser.add_argument("--only", default="", help="only the commands whose label contains one of these "
                                                   "comma-separated words")
    options = parser.parse_args()
    versions = {"before": options.base.resolve()} if options.base else {}
    versions["after"] = ROOT / "src"
    cases = CASES + (EXTRA if options.extra else [])
    if options.only:
        cases = [case for case in cases if any(word in case[0] for word in options.only.split(","))]
    print(f"nmmc tune speed: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; seconds, median "
          f"of {options.repeat} run(s) in a fresh process each (start-up included), --no-cache, "
          f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
    print(f"  {'command':<38}" + "".join(f"{name + ' wall':>13}{name + ' cpu':>12}" for name in versions)
          + ("   cpu ratio" if options.base else ""))
    medians: dict[str, dict[str, tuple[float, float]]] = {name: {} for name in versions}
    with tempfile.TemporaryDirectory() as tmp:
        for index, (label, args) in enumerate(cases):
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in versions}
            for rep in range(options.repeat):
                for name, src in versions.items():
                    out = Path(tmp) / f"{index}-{name}-{rep}"
                    runs[name].append(run(src, args, out if args[0] == "export" else out.with_suffix(".py")))
            cells = ""
            for name in versions:
                wall = statistics.median(w for w, _ in runs[name])
                cpu = statistics.median(c for _, c in runs[name])
                medians[name][label] = (wall, cpu)
                cells += f"{wall:>13.2f}{cpu:>12.2f}"
            ratio = (f"{medians['before'][label][1] / medians['after'][label][1]:>11.2f}x"
                     if options.base else "")
            print(f"  {label:<38}{cells}{ratio}", flush=True)
    main_labels = [label for label, _ in CASES if label in medians["after"]]
    for name in versions:
        walls = [medians[name][label][0] for label in main_labels]
        cpus = [medians[name][label][1] for label in main_labels]
        if walls:
            print(f"  {name}: median of the {len(walls)} tune commands {statistics.median(walls):.2f} s wall, "
                  f"{statistics.median(cpus):.2f} s CPU; worst {max(walls):.2f} s wall, {max(cpus):.2f} s CPU")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

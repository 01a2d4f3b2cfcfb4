#!/usr/bin/env python3
"""MX decode and prefill MLPs against bf16: the predicted latencies behind docs/mx.md's table ("Cost").

Runs ``nmmc tune --mlp --tokens T --hidden 4096 --intermediate 14336 --dense --target trn3 --dtype D --json`` (LNC=2,
in-graph, 150 trials, seed 0; ``--verify`` where asked) for D in bf16, mxfp8_e4m3, mxfp4 and T in 1, 512, and prints
per command: the predicted latency, the cost model's lower bound (HBM bytes at full bandwidth, FLOPs at the peak of
the kernel's FLOP mix), the ratio to bf16 at the same T, DMAs per program, SBUF bytes per partition, where the MX
scales are loaded (``mx_scales``: block or hoisted, lowerings/mx.py) and the verification verdict. Every latency is a
cost-model prediction for trn3 (not validated: no published trn3 measurement); the baseline is nmmc's own dense bf16
MLP tuned the same way. Usage:

  python benchmarks/mx_scale_hoist.py [--verify] [--tokens 1,512]

(``PYTHONPATH=OTHER/src python benchmarks/mx_scale_hoist.py`` measures another checkout's sources the same way.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = ["--mlp", "--hidden", "4096", "--intermediate", "14336", "--dense", "--target", "trn3"]
DTYPES = ("bf16", "mxfp8_e4m3", "mxfp4")


def run(nmmc: list[str], tokens: int, dtype: str, verify: bool, out: Path) -> tuple[str, dict, float]:
    """(the command line, its JSON, wall seconds)."""
    args = ["tune", *SHAPE[:1], "--tokens", str(tokens), *SHAPE[1:], "--dtype", dtype,
            *(["--verify"] if verify else []), "--no-cache", "--json", "-o", str(out)]
    start = time.monotonic()
    done = subprocess.run([*nmmc, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"nmmc {' '.join(args)} failed: {done.stdout}{done.stderr}")
    shown = "nmmc " + " ".join(a for a in args if a not in ("-o", str(out)))
    return shown, json.loads(done.stdout), time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="verify every kernel in the interpreter")
    parser.add_argument("--tokens", default="1,512")
    options = parser.parse_args()
    nmmc = [sys.executable, "-c", "from neuronmm_compiler.cli import main; main()"]
    print(f"{'tokens':>6} {'dtype':>11} {'us':>8} {'bound':>8} {'x bf16':>7} {'DMAs/prog':>9} {'SBUF':>7} "
          f"{'mx_scales':>9} {'verified':>8} {'s':>5}")
    with tempfile.TemporaryDirectory() as tmp:
        for tokens in map(int, options.tokens.split(",")):
            bf16 = None
            for dtype in DTYPES:
                command, report, seconds = run(nmmc, tokens, dtype, options.verify, Path(tmp) / f"{dtype}_{tokens}.py")
                predicted = report["predicted"]
                latency = predicted["latency_us"]
                bf16 = latency if dtype == "bf16" else bf16
                programs = len(predicted["program_latency_us"]) or 1
                verdict = "-"
                if options.verify:
                    verdict = "ok" if report.get("verify", {}).get("ok") else "FAILED"
                print(f"$ {command}")
                print(f"{tokens:>6} {dtype:>11} {latency:8.2f} {predicted['lower_bound_us']:8.2f} "
                      f"{latency / bf16:7.3f} {predicted['dma_transfers'] // programs:>9} "
                      f"{predicted['sbuf_bytes_per_partition']:>7} "
                      f"{report['schedule'].get('mx_scales', 'block') if dtype != 'bf16' else '-':>9} "
                      f"{verdict:>8} {seconds:5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

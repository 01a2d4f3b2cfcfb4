"""Predicted latency of bf16 and FP8 MLPs, dense and SVD at several ranks (docs/quantization.md, "FP8 SVD at small
ranks").

    python benchmarks/fp8_svd_ranks.py [--hidden 2048] [--intermediate 8192] [--ranks 1024,512,128] [--tokens 1,128]

Runs ``nmmc tune --mlp ... --dtype bf16|fp8 --target trn2 --no-cache`` (LNC=2, in-graph, seed 0) for the dense MLP
and every rank, and prints the tuned latency of each (cost model only, nothing measured). About 10 s per tune on
one core; the tables of docs/quantization.md ("Cost") are this script at 4096 x 14336 rank 2560 tokens 1,512
(Llama-3.1-8B),
at 2048 x 8192 (Llama-3.2-1B) and at 576 x 1536 ranks 384,128 (SmolLM2-135M):
benchmarks/results/fp8-svd-ranks-2026-12-07.txt.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from click.testing import CliRunner

from neuronmm_compiler.cli import main as nmmc

TUNED = re.compile(r"^\s+nmmc tuned\s+([0-9.]+)", re.MULTILINE)


def tuned_us(hidden: int, intermediate: int, structure: list[str], dtype: str, tokens: int, out: Path) -> float:
    """The tuned kernel's predicted latency (us) that ``nmmc tune`` prints."""
    args = ["tune", "--mlp", "--hidden", str(hidden), "--intermediate", str(intermediate), *structure,
            "--dtype", dtype, "--tokens", str(tokens), "--target", "trn2", "--no-cache", "--no-progress",
            "-o", str(out)]
    result = CliRunner().invoke(nmmc, args, catch_exceptions=False)
    found = TUNED.search(result.output)
    if result.exit_code != 0 or found is None:
        raise RuntimeError(f"nmmc {' '.join(args)} exited {result.exit_code}: {result.output[-2000:]}")
    return float(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--ranks", default="1024,512,128")
    parser.add_argument("--tokens", default="1,128")
    parser.add_argument("--out", type=Path, default=Path("/tmp/fp8_svd_ranks_kernel.py"),
                        help="where each tune writes its kernel (overwritten)")
    options = parser.parse_args(argv)
    tokens = [int(t) for t in options.tokens.split(",")]
    candidates = [("dense", ["--dense"])] + [(f"rank {r}", ["--rank", r]) for r in options.ranks.split(",")]
    print(f"hidden {options.hidden} x intermediate {options.intermediate}, trn2 LNC=2 in-graph, predicted us")
    print("| candidate | " + " | ".join(f"bf16 T={t} | fp8 T={t}" for t in tokens) + " |")
    for name, structure in candidates:
        cells = [f"{tuned_us(options.hidden, options.intermediate, structure, dtype, t, options.out):.1f}"
                 for t in tokens for dtype in ("bf16", "fp8")]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

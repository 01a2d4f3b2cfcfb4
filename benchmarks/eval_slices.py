"""How representative one short evaluation is: the perplexity increase of a ``compress`` output on consecutive
1024-token slices of each of the heal study's texts, each slice alone and all together.

    python benchmarks/eval_slices.py MODEL_DIR OUT --texts WORK/texts [--slices 4]

``OUT`` is a ``nmmc compress`` output directory; ``WORK/texts`` what ``benchmarks/compression.py --heal-study
--work WORK`` wrote. The NumPy forward pass, sequences of 512 (as ``compress --eval``), so the first slice's figure
is ``compress --eval-tokens 1024``'s. Measured 2026-12-02 (benchmarks/results/compression-runs.md, "Seventh
run"): for one set of factors the licence text's four slices ranged from +55% to +146%.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from neuronmm_compiler.compression.calibration import load_tokens
from neuronmm_compiler.compression.compress_steps import load_factors
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.manifest import read_manifest
from neuronmm_compiler.compression.quality import evaluate, factored_mlp

TEXTS = ("docs-eval", "licences", "code", "changelogs")
SLICE = 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out", help="a compress output directory")
    ap.add_argument("--texts", required=True)
    ap.add_argument("--slices", type=int, default=4)
    a = ap.parse_args()
    model = CausalLM(a.model_dir)
    mlp = factored_mlp(load_factors(a.out, read_manifest(Path(a.out) / "manifest.json")))
    for name in TEXTS:
        ids = load_tokens(Path(a.texts) / f"{name}.txt", a.model_dir, SLICE * a.slices)
        row, log_ratio = [], 0.0
        for s in range(a.slices):
            q = evaluate(model, ids[s * SLICE:(s + 1) * SLICE], mlp, length=512, per_layer=False)
            row.append(f"{q.ppl_original:.2f} -> {q.ppl_compressed:.2f} ({q.ppl_increase:+.1%})")
            log_ratio += math.log1p(q.ppl_increase)
        print(f"{name}: " + " | ".join(row) + f" | together {math.expm1(log_ratio / a.slices):+.1%}", flush=True)


if __name__ == "__main__":
    main()

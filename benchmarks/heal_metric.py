"""The closed form with and without its output metric (``--heal-metric``), on the heal study's texts (issue 27).

    python benchmarks/heal_metric.py MODEL_DIR --texts WORK/texts [--tokens 4096] [--metric mlp-output projection]

Calibrates on ``--tokens`` each of docs-cal and man plus the 2048 tokens of samples.npy (what
``benchmarks/compression.py --heal-study --work WORK`` wrote), takes whitened SVD at ``--rank``, heals it
with the closed form (prior 1, as compress) once per metric, and prints each result's perplexity on the
first 1024 tokens of every evaluation text and the closed form's CPU seconds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from finetune_sweep import EVALS, perplexities

from neuronmm_compiler.models.calibration import calibrate, load_tokens
from neuronmm_compiler.models.compress_steps import whitened_factors
from neuronmm_compiler.models.finetune import import_torch
from neuronmm_compiler.models.forward import CausalLM
from neuronmm_compiler.models.heal import HEAL_METRICS, closed_form_heal
from neuronmm_compiler.models.torch_lm import TorchLM
from neuronmm_compiler.models.whitening import DEFAULT_DAMPING


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--texts", required=True)
    ap.add_argument("--tokens", type=int, default=4096, help="calibration tokens of docs-cal and of man each")
    ap.add_argument("--rank", type=int, default=384)
    ap.add_argument("--metric", nargs="+", default=list(HEAL_METRICS), choices=HEAL_METRICS)
    a = ap.parse_args()
    texts, model = Path(a.texts), CausalLM(a.model_dir)
    ids = np.concatenate([load_tokens(texts / "docs-cal.txt", a.model_dir, a.tokens),
                          load_tokens(texts / "man.txt", a.model_dir, a.tokens),
                          load_tokens(texts / "samples.npy", a.model_dir, 2048)])
    cal = calibrate(model, ids, source="docs+man+samples")
    plan = [{"gate": a.rank, "up": a.rank, "down": a.rank}] * model.arch.num_hidden_layers
    white = whitened_factors(model, cal, plan, DEFAULT_DAMPING)
    torch = import_torch()
    lm = TorchLM(model, torch)
    evals = {n: load_tokens(texts / f, a.model_dir, 1024) for n, f in EVALS.items()}
    original = perplexities(lm, torch, evals, None)
    for metric in a.metric:
        began = time.process_time()
        healed, _ = closed_form_heal(model, ids, white, prior=cal.grams, prior_weight=1.0, metric=metric)
        cpu = time.process_time() - began
        ppl = perplexities(lm, torch, evals, healed)
        print(f"{metric} ({ids.size} calibration tokens, closed form {cpu:.0f} CPU s):",
              " ".join(f"{n} {v:.2f} ({v / original[n] - 1:+.1%})" for n, v in ppl.items()), flush=True)


if __name__ == "__main__":
    main()

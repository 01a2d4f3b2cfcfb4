"""Which layers' compression costs each evaluation text most: the closed form's factors put into one layer at a
time (every other layer dense), and into one projection of every layer (issue 27).

    python benchmarks/heal_layer_sensitivity.py MODEL_DIR --texts WORK/texts [--tokens 4096] [--rank 384]
        [--evals docs licences]

Calibrates as ``benchmarks/heal_metric.py`` does (``--tokens`` each of docs-cal and man plus 2048 sampled tokens),
heals whitened SVD at ``--rank`` with the closed form (``--heal-metric``, prior 1), then prints, per layer, the
perplexity increase on the first 1024 tokens of each evaluation text with only that layer compressed, and per
projection with only that projection compressed in every layer. The factors were fitted for a model whose other
layers are compressed too, so a single layer's number is its share, not its optimum.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from finetune_sweep import EVALS, overall, perplexities
from heal_metric import study_args, study_start

from neuronmm_compiler.checkpoints.config import PROJECTIONS
from neuronmm_compiler.compression.calibration import DEFAULT_SEQUENCE, load_tokens
from neuronmm_compiler.compression.finetune import import_torch
from neuronmm_compiler.compression.fisher import residual_fisher, residual_metric
from neuronmm_compiler.compression.heal import DEFAULT_HEAL_METRIC, HEAL_METRICS, closed_form_heal
from neuronmm_compiler.compression.torch_lm import TorchLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    study_args(ap)
    ap.add_argument("--heal-metric", default=DEFAULT_HEAL_METRIC, choices=HEAL_METRICS)
    ap.add_argument("--evals", nargs="+", default=["docs", "licences"], choices=sorted(EVALS))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    model, ids, cal, white = study_start(a)
    texts, layers = Path(a.texts), model.arch.num_hidden_layers
    stream = None
    if a.heal_metric == "fisher":
        fisher, _ = residual_fisher(model, ids, length=DEFAULT_SEQUENCE, threads=a.threads)
        stream = [residual_metric(f) for f in fisher]
    healed, _ = closed_form_heal(model, ids, white, prior=cal.grams, prior_weight=1.0, metric=a.heal_metric,
                                 stream_metrics=stream)
    torch = import_torch()
    torch.set_num_threads(a.threads)
    lm = TorchLM(model, torch)
    evals = {n: load_tokens(texts / EVALS[n], a.model_dir, 1024) for n in a.evals}
    original = {n: overall(v) for n, v in perplexities(lm, torch, evals, None).items()}
    dense = {layer: {p: model.mlp_weight(layer, p) for p in PROJECTIONS} for layer in range(layers)}

    def report(label: str, factors: dict) -> None:
        ppl = {n: overall(v) for n, v in perplexities(lm, torch, evals, factors).items()}
        print(label, " ".join(f"{n} {v / original[n] - 1:+.2%}" for n, v in ppl.items()), flush=True)

    for layer in range(layers):
        report(f"layer {layer}", {k: healed[k] if k == layer else dense[k] for k in range(layers)})
    for proj in PROJECTIONS:
        report(f"{proj} of every layer", {k: {**dense[k], proj: healed[k][proj]} for k in range(layers)})


if __name__ == "__main__":
    main()

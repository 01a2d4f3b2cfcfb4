"""The closed form with and without its output metric (``--heal-metric``), on the heal study's texts (issue 27).

    python benchmarks/heal_metric.py MODEL_DIR --texts WORK/texts [--tokens 4096] [--metric mlp-output fisher]
        [--mix 0.5 0.1] [--mix-ramp 1.0:0.5 1.0:0.1] [--fisher-tokens 8192] [--metric-tokens 16384 2560]
        [--threads 2] [--eval-tokens 4096]

Calibrates on ``--tokens`` each of docs-cal and man plus the 2048 tokens of samples.npy (what
``benchmarks/compression.py --heal-study --work WORK`` wrote), takes whitened SVD at ``--rank``, heals it
with the closed form (prior 1, as compress) once per metric (and, for ``fisher``, per identity weight
``--mix``, or per ``--mix-ramp FIRST:LAST``, an identity weight going linearly from FIRST at the first layer to
LAST at the last; the Fisher is estimated once) and per ``--metric-tokens``, and prints each result's perplexity on the
first ``--eval-tokens`` (default 1024, a multiple of 1024) of every evaluation text and the closed form's CPU seconds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from finetune_sweep import EVALS, overall, perplexities

from neuronmm_compiler.compression.calibration import DEFAULT_SEQUENCE, calibrate, load_tokens
from neuronmm_compiler.compression.finetune import import_torch
from neuronmm_compiler.compression.fisher import FISHER_MIX, FISHER_TOKENS, residual_fisher, residual_metric
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.heal import HEAL_METRICS, METRIC_TOKENS, closed_form_heal
from neuronmm_compiler.compression.heal_steps import whitened_factors
from neuronmm_compiler.compression.torch_lm import TorchLM
from neuronmm_compiler.compression.whitening import DEFAULT_DAMPING


def study_args(ap: argparse.ArgumentParser) -> None:
    """The model, texts, calibration size and rank of a closed-form study (this script's and its siblings')."""
    ap.add_argument("model_dir")
    ap.add_argument("--texts", required=True)
    ap.add_argument("--tokens", type=int, default=4096, help="calibration tokens of docs-cal and of man each")
    ap.add_argument("--rank", type=int, default=384)


def study_start(a: argparse.Namespace):
    """``(model, ids, calibration, whitened factors)``: docs-cal and man ``--tokens`` each plus 2048 sampled tokens,
    whitened SVD at ``--rank`` for every projection."""
    texts, model = Path(a.texts), CausalLM(a.model_dir)
    ids = np.concatenate([load_tokens(texts / "docs-cal.txt", a.model_dir, a.tokens),
                          load_tokens(texts / "man.txt", a.model_dir, a.tokens),
                          load_tokens(texts / "samples.npy", a.model_dir, 2048)])
    cal = calibrate(model, ids, source="docs+man+samples")
    plan = [{"gate": a.rank, "up": a.rank, "down": a.rank}] * model.arch.num_hidden_layers
    return model, ids, cal, whitened_factors(model, cal, plan, DEFAULT_DAMPING)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    study_args(ap)
    ap.add_argument("--metric", nargs="+", default=list(HEAL_METRICS), choices=HEAL_METRICS)
    ap.add_argument("--mix", nargs="+", type=float, default=[FISHER_MIX], help="identity weights for --metric fisher")
    ap.add_argument("--mix-ramp", nargs="+", default=[], metavar="FIRST:LAST",
                    help="per-layer identity weights for --metric fisher, linear from the first layer to the last")
    ap.add_argument("--fisher-tokens", type=int, default=FISHER_TOKENS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-tokens", type=int, default=1024, help="tokens of each evaluation text (multiple of 1024)")
    ap.add_argument("--metric-tokens", type=int, nargs="+", default=[METRIC_TOKENS],
                    help="tokens the output metric's Grams are summed over (one closed form per value)")
    a = ap.parse_args()
    model, ids, cal, white = study_start(a)
    texts = Path(a.texts)
    torch = import_torch()
    lm = TorchLM(model, torch)
    evals = {n: load_tokens(texts / f, a.model_dir, a.eval_tokens) for n, f in EVALS.items()}
    original = {n: overall(v) for n, v in perplexities(lm, torch, evals, None).items()}
    runs = [(m, None, t) for m in a.metric if m != "fisher" for t in a.metric_tokens]
    if "fisher" in a.metric:
        began = time.process_time()
        fisher, _ = residual_fisher(model, ids, length=DEFAULT_SEQUENCE, tokens=a.fisher_tokens, threads=a.threads)
        print(f"fisher on {a.fisher_tokens} tokens: {time.process_time() - began:.0f} CPU s", flush=True)
        layers = len(fisher)
        ramps = [tuple(float(x) for x in r.split(":")) for r in a.mix_ramp]
        runs += [("fisher", [mix] * layers, t) for mix in a.mix for t in a.metric_tokens]
        runs += [("fisher", list(np.linspace(first, last, layers)), t) for first, last in ramps
                 for t in a.metric_tokens]
    for metric, mix, metric_tokens in runs:
        began = time.process_time()
        stream = None if mix is None else [residual_metric(f, m) for f, m in zip(fisher, mix, strict=True)]
        healed, _ = closed_form_heal(model, ids, white, prior=cal.grams, prior_weight=1.0, metric=metric,
                                     stream_metrics=stream, metric_tokens=metric_tokens)
        cpu = time.process_time() - began
        ppl = {n: overall(v) for n, v in perplexities(lm, torch, evals, healed).items()}
        shown = None if mix is None else f"{mix[0]:g}" if len(set(mix)) == 1 else f"{mix[0]:g}..{mix[-1]:g}"
        label = (metric if shown is None else f"{metric} mix {shown}") + f", --metric-tokens {metric_tokens}"
        print(f"{label} ({ids.size} calibration tokens, closed form {cpu:.0f} CPU s):",
              " ".join(f"{n} {v:.2f} ({v / original[n] - 1:+.1%})" for n, v in ppl.items()), flush=True)


if __name__ == "__main__":
    main()

"""Calibration and the closed form with their token-wise products taken per sequence or per block of sequences.

    python benchmarks/block_tokens.py MODEL_DIR --texts WORK/texts --samples SAMPLES.npy [--tokens 4096]
        [--blocks 512 2048] [--rounds 2]

``models.calibration.BLOCK_TOKENS`` sets how many tokens of consecutive sequences are concatenated (after
their attention) before the Grams and MLP products; 512 is one sequence per block, what nmmc did before
2026-12-02. Calibrates on ``--tokens`` each of docs-cal and man plus 2048 tokens of ``--samples``, takes
whitened SVD at ``--rank`` and heals it with the closed form (output metric, prior 1, as ``compress``), once
per block size per round, the sizes alternating so that a change in the machine's load hits each; prints each
run's wall and CPU seconds, the medians and their ratios to the first size's, and (first round) each result's
perplexity on the first 1024 tokens of every evaluation text.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from finetune_sweep import EVALS, perplexities

import neuronmm_compiler.compression.calibration as calibration
from neuronmm_compiler.compression.calibration import calibrate, load_tokens
from neuronmm_compiler.compression.finetune import import_torch
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.heal import closed_form_heal
from neuronmm_compiler.compression.heal_steps import whitened_factors
from neuronmm_compiler.compression.torch_lm import TorchLM
from neuronmm_compiler.compression.whitening import DEFAULT_DAMPING


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--texts", required=True)
    ap.add_argument("--samples", required=True, help="token ids sampled from the model (.npy)")
    ap.add_argument("--tokens", type=int, default=4096, help="calibration tokens of docs-cal and of man each")
    ap.add_argument("--rank", type=int, default=384)
    ap.add_argument("--blocks", type=int, nargs="+", default=[512, calibration.BLOCK_TOKENS])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    texts, model = Path(a.texts), CausalLM(a.model_dir)
    ids = np.concatenate([load_tokens(texts / "docs-cal.txt", a.model_dir, a.tokens),
                          load_tokens(texts / "man.txt", a.model_dir, a.tokens),
                          load_tokens(Path(a.samples), a.model_dir, 2048)])
    plan = [{"gate": a.rank, "up": a.rank, "down": a.rank}] * model.arch.num_hidden_layers
    torch = import_torch()
    lm = TorchLM(model, torch)
    evals = {n: load_tokens(texts / f, a.model_dir, 1024) for n, f in EVALS.items()}
    print(f"{len(ids)} calibration tokens, rank {a.rank}; original perplexity "
          + " ".join(f"{n} {p[0]:.2f}" for n, p in perplexities(lm, torch, evals, None).items()), flush=True)
    seconds: dict[int, dict[str, list[float]]] = {b: {"calibrate": [], "closed form": []} for b in a.blocks}
    for round_ in range(a.rounds):
        for block in a.blocks:
            calibration.BLOCK_TOKENS = block
            cal, wall, cpu = timed(lambda: calibrate(model, ids, source="docs+man+samples"))
            seconds[block]["calibrate"].append(wall)
            white = whitened_factors(model, cal, plan, DEFAULT_DAMPING)
            (healed, _), wall2, cpu2 = timed(lambda w=white, c=cal: closed_form_heal(model, ids, w, prior=c.grams,
                                                                                   prior_weight=1.0))
            seconds[block]["closed form"].append(wall2)
            line = (f"round {round_ + 1} block {block}: calibrate {wall:.1f} s ({cpu:.0f} CPU s), closed form "
                    f"{wall2:.1f} s ({cpu2:.0f} CPU s)")
            if round_ == 0:
                line += "; perplexity " + " ".join(f"{n} {p[0]:.3f}" for n, p in
                                                   perplexities(lm, torch, evals, healed).items())
            print(line, flush=True)
    first = a.blocks[0]
    for stage in ("calibrate", "closed form"):
        base = statistics.median(seconds[first][stage])
        print(f"{stage}, median wall s: " + ", ".join(
            f"block {b} {statistics.median(seconds[b][stage]):.1f} "
            f"({statistics.median(seconds[b][stage]) / base:.2f}x block {first}'s)" for b in a.blocks))


if __name__ == "__main__":
    main()

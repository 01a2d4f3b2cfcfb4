"""Check nmmc's NumPy forward pass (``neuronmm_compiler.compression.forward``) against transformers' logits.

    pip install torch==2.13.0 transformers     # a separate environment: neither is an nmmc dependency
    pip install -e .                            # nmmc in the same environment
    python scripts/check_forward.py MODEL_DIR [--tokens 256] [--seed 0]

Loads MODEL_DIR (config.json + safetensors) with ``AutoModelForCausalLM`` in float32 on the CPU and
with nmmc's ``CausalLM``, runs both on the same random token ids, and prints the largest absolute
logit difference relative to the largest logit, the top-1 agreement and both perplexities of the
sequence on itself. Exit status 1 if the relative difference exceeds ``--tolerance`` (default 1e-3).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from neuronmm_compiler.compression.forward import CausalLM, log_softmax

    ours = CausalLM(args.model_dir)
    ids = np.random.default_rng(args.seed).integers(0, ours.arch.vocab_size, args.tokens)
    theirs = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    theirs.eval()
    with torch.no_grad():
        reference = theirs(torch.from_numpy(ids)[None]).logits[0].double().numpy()
    logits = ours.forward(ids).astype(np.float64)
    diff = float(np.abs(logits - reference).max() / np.abs(reference).max())
    agree = float(np.mean(logits.argmax(-1) == reference.argmax(-1)))

    def ppl(x: np.ndarray) -> float:
        logp = log_softmax(x)
        return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))

    print(f"{args.model_dir}: {args.tokens} random tokens; max |logit difference| / max |logit| = {diff:.2e}, "
          f"top-1 agreement {agree:.4f}, perplexity nmmc {ppl(logits):.4f} vs transformers {ppl(reference):.4f}")
    sys.exit(0 if diff <= args.tolerance else 1)


if __name__ == "__main__":
    main()

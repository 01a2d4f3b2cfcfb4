"""Where a compressed model loses: per-token NLL of the original and the compressed model on one text.

    python benchmarks/token_losses.py MODEL_DIR OUT TEXT [--tokens 4096] [--top 25]

``OUT`` is a ``nmmc compress`` output directory (its factors replace the MLPs, as ``compress --eval``), ``TEXT`` a
text file (tokenized with the model's tokenizer) or a ``.npy`` of token ids. Sequences of 512 tokens, as
``compress --eval``. Prints the mean NLL increase (its exponential is ``compress --eval``'s perplexity ratio), how
it splits over the original model's confidence (the original's NLL of the true token, in buckets), how much of
it the worst 1/5/10/20% of tokens carry, and the tokens that lost most with the text before them. Used for
benchmarks/results/compression-runs.md's "Eighth run": on the licence text the loss sits in a few tokens the
original predicted with confidence (completions of long or capitalised words in boilerplate).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from neuronmm_compiler.compression.calibration import load_tokens, sequences
from neuronmm_compiler.compression.compress_steps import load_factors
from neuronmm_compiler.compression.forward import CausalLM, log_softmax
from neuronmm_compiler.compression.manifest import read_manifest
from neuronmm_compiler.compression.quality import factored_mlp, original_predictions, target_nll, worst_share

BUCKETS = ((0.0, 0.05), (0.05, 0.5), (0.5, 2.0), (2.0, 5.0), (5.0, np.inf))  # original NLL, nats


def token_nll(model: CausalLM, ids: np.ndarray, mlp) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Targets, the original's and the compressed model's NLL of each, over sequences of 512."""
    chunks = sequences(ids, 512)
    compressed = [target_nll(log_softmax(model.forward(chunk, override=mlp)), chunk) for chunk in chunks]
    return (np.concatenate([chunk[1:] for chunk in chunks]), original_predictions(model, ids, length=512).token_nll,
            np.concatenate(compressed))


def report(targets: np.ndarray, original: np.ndarray, compressed: np.ndarray, *, top: int,
           decode=None) -> list[str]:
    increase = compressed - original
    total = increase.sum()
    lines = [f"{len(targets)} tokens: mean NLL increase {increase.mean():.3f} nats "
             f"(perplexity x{np.exp(increase.mean()):.3f})"]
    for lo, hi in BUCKETS:
        inside = (original >= lo) & (original < hi)
        if inside.any():
            lines.append(f"  original NLL in [{lo:g}, {hi:g}): {inside.sum():5d} tokens, mean increase "
                         f"{increase[inside].mean():+.3f}, share of the total {increase[inside].sum() / total:+.2f}")
    if total > 0:
        fractions = (0.01, 0.05, 0.1, 0.2)
        lines.append("  the worst " + ", ".join(f"{f:.0%}" for f in fractions) + " of tokens carry "
                     + ", ".join(f"{worst_share(increase, f) or 0:.2f}" for f in fractions) + " of the increase")
    for i in sorted(np.argsort(increase)[::-1][:top]):
        before = decode(targets[max(0, i - 12):i].tolist()) if decode else str(targets[max(0, i - 12):i].tolist())
        word = decode([int(targets[i])]) if decode else str(int(targets[i]))
        lines.append(f"  {i:5d} {original[i]:5.2f} -> {compressed[i]:5.2f}  ...{before[-50:]!r} [{word!r}]")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out", help="a compress output directory")
    ap.add_argument("text")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--top", type=int, default=25, help="print this many of the tokens that lost most")
    a = ap.parse_args()
    model = CausalLM(a.model_dir)
    mlp = factored_mlp(load_factors(a.out, read_manifest(Path(a.out) / "manifest.json")))
    ids = load_tokens(Path(a.text), a.model_dir, a.tokens)
    decode = None
    tokenizer = Path(a.model_dir) / "tokenizer.json"
    if tokenizer.is_file():
        from tokenizers import Tokenizer

        decode = Tokenizer.from_file(str(tokenizer)).decode
    print("\n".join(report(*token_nll(model, ids, mlp), top=a.top, decode=decode)))


if __name__ == "__main__":
    main()

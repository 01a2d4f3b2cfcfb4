"""Measured quality of a compressed MLP: perplexity, top-1 agreement, per-layer MLP output error.

:func:`evaluate` runs the model (:class:`~.forward.CausalLM`) twice over held-out token ids, once as
it is and once with every layer's MLP replaced by its factors (attention, norms and embeddings are
the original ones, as in a compressed checkpoint), and reports

- perplexity of both, ``exp(mean next-token negative log-likelihood)`` over every predicted token;
- the perplexity increase of every sequence on its own, so that a report can say how much one text's
  sequences disagree (measured on SmolLM2-135M: the 1024-token slices of one licence text ranged from
  +55% to +146% for the same factors; benchmarks/results/compression-runs.md, "Seventh run");
- the share of the NLL increase that the tenth of the tokens that lost most carry: near 0.1 the loss is
  spread over the text, near or above 1 a few tokens carry it (on SmolLM2-135M's licence text 0.73, in
  memorised word completions; benchmarks/results/compression-runs.md, "Eighth run");
- top-1 agreement, the fraction of positions where both models' most likely next token is the same;
- per layer, the relative error ``||y - y'||_F / ||y||_F`` of the compressed MLP's output ``y'`` on the
  original model's MLP inputs (real activations, not random ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .calibration import DEFAULT_SEQUENCE, sequences
from .forward import log_softmax, silu
from .heal_solve import project

__all__ = ["Factors", "Original", "Quality", "evaluate", "factored_mlp", "original_predictions", "spread_note",
           "target_nll", "worst_share"]

#: Per layer and projection: ``(u, v)`` factors or a dense ``W`` [in, out].
Factors = Mapping[int, Mapping[str, "tuple[np.ndarray, np.ndarray] | np.ndarray"]]


def factored_mlp(factors: Factors) -> Callable[[int, np.ndarray], np.ndarray]:
    """``mlp(layer, x)``: ``down(silu(gate(x)) * up(x))`` with each projection from ``factors``."""
    cast = {layer: {proj: (tuple(np.asarray(t, dtype=np.float32) for t in f) if isinstance(f, tuple)
                           else np.asarray(f, dtype=np.float32)) for proj, f in projections.items()}
            for layer, projections in factors.items()}

    def mlp(layer: int, x: np.ndarray) -> np.ndarray:
        f = cast[layer]
        return project(silu(project(x, f["gate"])) * project(x, f["up"]), f["down"])

    return mlp


class Original(NamedTuple):
    """The unmodified model on some ids: perplexity, top-1 next-token predictions, the mean negative
    log-likelihood of each sequence and that of every predicted token (float64, in order)."""

    ppl: float
    top1: np.ndarray
    sequence_nll: tuple[float, ...]
    token_nll: np.ndarray


#: The fraction of a text's tokens (those that lost most) whose share of its NLL increase is reported.
WORST_FRACTION = 0.1
WORST_KEY = "increase_share_of_worst_tenth_tokens"


def worst_share(increase: np.ndarray, fraction: float = WORST_FRACTION) -> float | None:
    """The share of the total NLL increase ``sum(increase)`` that the ``fraction`` of tokens with the largest
    increase carry (above 1 when the others improved on balance); None when the total did not rise or there are
    too few tokens for one."""
    increase = np.asarray(increase, dtype=np.float64)
    total, count = float(increase.sum()), int(len(increase) * fraction)
    if not total > 0 or count < 1:
        return None
    return float(np.sort(increase)[len(increase) - count:].sum() / total)


@dataclass(frozen=True)
class Quality:
    """What :func:`evaluate` measured. ``sequence_increases``: each sequence's own perplexity increase;
    ``worst_share``: :func:`worst_share` of the tokens' NLL increases."""

    tokens: int
    ppl_original: float
    ppl_compressed: float
    top1_agreement: float
    layer_errors: tuple[float, ...]
    sequence_increases: tuple[float, ...] = ()
    worst_share: float | None = None

    @property
    def ppl_increase(self) -> float:
        """Relative perplexity increase, e.g. 0.10 for +10%."""
        return self.ppl_compressed / self.ppl_original - 1.0

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "perplexity_original": self.ppl_original,
                "perplexity_compressed": self.ppl_compressed, "perplexity_increase": self.ppl_increase,
                "top1_agreement": self.top1_agreement, "mlp_output_error": list(self.layer_errors),
                "perplexity_increase_by_sequence": list(self.sequence_increases), WORST_KEY: self.worst_share}


def spread_note(quality: Mapping) -> str:
    """How far one file's perplexity increase can be trusted: its sequences' lowest and highest increase (none
    for one sequence), and the share of the rise its worst tenth of tokens carry (none when it did not rise);
    empty for a record from before 2026-12-02 that has neither."""
    each = quality.get("perplexity_increase_by_sequence") or []
    note = f"; its {len(each)} sequences {min(each):+.1%} to {max(each):+.1%}" if len(each) >= 2 else ""
    share = quality.get(WORST_KEY)
    if share is not None:
        # a share above 100% means the other tokens' losses fell: say so, or the number reads as impossible
        offset = "; the other tokens improved, offsetting the rest" if share > 1 else ""
        note += f"; {WORST_FRACTION:.0%} of its tokens carry {share:.0%} of the rise{offset}"
    return note


def target_nll(logp: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """Each next token's negative log-likelihood (float64) under ``logp`` [tokens, vocab], the log-probabilities
    of one sequence ``chunk``."""
    targets = chunk[1:]
    return -logp[np.arange(len(targets)), targets].astype(np.float64)


def evaluate(model, ids: np.ndarray, mlp: Callable[[int, np.ndarray], np.ndarray], *,
             length: int = DEFAULT_SEQUENCE, original: Original | None = None,
             per_layer: bool = True, progress: Callable[[int, int], None] | None = None) -> Quality:
    """Perplexity and agreement of ``model`` with and without ``mlp`` substituted (see the module docstring).

    ``original``: the original model on the same ids, from :func:`original_predictions`, to skip
    recomputing it when evaluating several compressions.
    ``per_layer=False`` skips the per-layer MLP output errors (one forward pass per sequence instead of
    two; ``layer_errors`` is then empty).
    """
    chunks = sequences(ids, length)
    n_layers = model.arch.num_hidden_layers
    residual, total = np.zeros(n_layers), np.zeros(n_layers)

    def observe(layer: int, x: np.ndarray, h: np.ndarray) -> None:
        y = (h @ model.mlp_weight(layer, "down")).astype(np.float64)
        diff = y - mlp(layer, x)
        residual[layer] += float(np.einsum("ij,ij->", diff, diff))
        total[layer] += float(np.einsum("ij,ij->", y, y))

    if original is None:
        original = original_predictions(model, ids, length=length)
    ppl_original, top1_original, sequence_nll, token_nll = original
    nll, agree, count, offset, increases, token_increase = 0.0, 0, 0, 0, [], []
    for done, chunk in enumerate(chunks, 1):
        if per_layer:
            model.forward(chunk, observe=observe, logits=False)
        logp = log_softmax(model.forward(chunk, override=mlp))
        targets = chunk[1:]
        each_nll = target_nll(logp, chunk)
        chunk_nll = float(each_nll.sum())
        token_increase.append(each_nll - token_nll[offset:offset + len(targets)])
        nll += chunk_nll
        increases.append(math.exp(chunk_nll / len(targets) - sequence_nll[done - 1]) - 1.0)
        agree += int(np.count_nonzero(logp[:-1].argmax(axis=-1) == top1_original[offset:offset + len(targets)]))
        count += len(targets)
        offset += len(targets)
        if progress is not None:
            progress(done, len(chunks))
    errors = tuple(float(math.sqrt(r / t)) if t > 0 else 0.0 for r, t in zip(residual, total, strict=True)
                   if per_layer)
    return Quality(count, ppl_original, float(math.exp(nll / count)), agree / count, errors, tuple(increases),
                   worst_share(np.concatenate(token_increase)))


def original_predictions(model, ids: np.ndarray, *, length: int = DEFAULT_SEQUENCE) -> Original:
    """The unmodified model's perplexity, top-1 next-token predictions and per-sequence and per-token NLL on
    ``ids``."""
    nll, count, top1, each, tokens = 0.0, 0, [], [], []
    for chunk in sequences(ids, length):
        logp = log_softmax(model.forward(chunk))
        targets = chunk[1:]
        token_nll = target_nll(logp, chunk)
        chunk_nll = float(token_nll.sum())
        nll += chunk_nll
        each.append(chunk_nll / len(targets))
        tokens.append(token_nll)
        top1.append(logp[:-1].argmax(axis=-1))
        count += len(targets)
    return Original(float(math.exp(nll / count)), np.concatenate(top1), tuple(each), np.concatenate(tokens))

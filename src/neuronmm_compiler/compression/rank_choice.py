"""Ranks chosen for accuracy and speed together: per layer, the MLP variant on the Pareto front of
predicted latency and whitened truncation loss.

Each layer's MLP can be the dense gated MLP (nmmc's fused dense kernel) or an SVD MLP with a
block-aligned rank ``r_gu`` for gate and up (they share their input and are computed together) and
``r_down`` for down. Only ranks that store fewer parameters than the dense matrix are candidates
(``r (in + out) < in out``). Each variant has

- a predicted latency (:mod:`.latency`: nmmc's cost model, summed over the user's token buckets);
  the same for every layer, as every layer has the same shapes;
- an accuracy proxy, the layer's whitened truncation loss: the sum over its three projections of the
  squared relative output error on the calibration activations (:func:`.whitening.truncation_loss`
  squared; the three add roughly in quadrature in the MLP output), times the layer's *measured
  sensitivity* (:mod:`.sensitivity`: the log-perplexity increase on calibration text per unit of
  that loss, when that layer alone is compressed), so that it estimates the layer's contribution to
  the model's log-perplexity increase; 0 for dense. A layer whose activations use many directions, or
  whose errors the rest of the model amplifies (a *sensitive* layer), costs more at a given rank, so
  it keeps more rank.

The model's latency and loss are the sums over layers. :func:`pareto_front` computes the exact Pareto
front of (latency, loss) over every per-layer assignment by dynamic programming over the layers
(after each layer, only non-dominated partial sums are kept); :class:`Front` then picks the fastest
assignment within a loss budget, or the most accurate within a latency budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .whitening import truncation_loss

__all__ = ["BUDGET_NOT_APPLIED", "DENSE", "Front", "Variant", "candidate_ranks", "layer_losses", "pareto_front",
           "variants"]

#: What ``compress --choose-ranks --tokens`` in bf16 says: this choice does not spend --max-ppl-increase.
BUDGET_NOT_APPLIED = ("--max-ppl-increase does not bound this choice: with --tokens and bf16 weights, --choose-ranks "
                      "picks the most accurate ranks (by a predicted-loss proxy) within the predicted latency of "
                      "uniform ranks, and the budget is only checked afterwards on --eval; for a choice measured "
                      "within the budget drop --tokens, or add --dtype fp8 (docs/compression.md, docs/quantization.md)")
#: The dense variant of a layer (no factorization).
DENSE = None
#: An MLP variant: ``(r_gate_up, r_down)``, or :data:`DENSE`.
Variant = "tuple[int, int] | None"
#: At most this many points are kept on a partial front (thinned evenly by latency beyond it).
MAX_FRONT = 20000


def candidate_ranks(k: int, n: int, align: int = 128) -> list[int]:
    """Multiples of ``align`` that store fewer parameters than the dense ``k x n`` matrix."""
    return [r for r in range(align, min(k, n) + 1, align) if r * (k + n) < k * n]


def variants(hidden: int, intermediate: int, align: int = 128) -> list[tuple[int, int] | None]:
    """Every MLP variant of a layer: dense first, then ``(r_gate_up, r_down)`` pairs."""
    gate_up, down = candidate_ranks(hidden, intermediate, align), candidate_ranks(intermediate, hidden, align)
    return [DENSE, *[(g, d) for g in gate_up for d in down]]


def layer_losses(spectra: Mapping[str, np.ndarray], options: Sequence[tuple[int, int] | None],
                 scale: float = 1.0) -> np.ndarray:
    """The loss of each variant for one layer from its projections' squared whitened spectra, times
    ``scale`` (the layer's measured sensitivity)."""
    out = np.zeros(len(options))
    for i, option in enumerate(options):
        if option is DENSE:
            continue
        r_gu, r_down = option
        out[i] = scale * sum(truncation_loss(spectra[p], r) ** 2 for p, r in (("gate", r_gu), ("up", r_gu),
                                                                                ("down", r_down)))
    return out


@dataclass(frozen=True)
class FrontPoint:
    latency: float
    loss: float
    choice: tuple[tuple[int, int] | None, ...]  # per layer


@dataclass(frozen=True)
class Front:
    """The Pareto front, sorted by increasing latency (and so decreasing loss)."""

    points: tuple[FrontPoint, ...]

    def fastest_within(self, loss_budget: float) -> FrontPoint:
        """The lowest-latency point whose loss is at most ``loss_budget`` (the dense end always is)."""
        fits = [p for p in self.points if p.loss <= loss_budget * (1 + 1e-12)]
        return fits[0]

    def most_accurate_within(self, latency_budget: float) -> FrontPoint:
        """The lowest-loss point whose latency is at most ``latency_budget``; InputError if none."""
        fits = [p for p in self.points if p.latency <= latency_budget * (1 + 1e-12)]
        if not fits:
            raise InputError(f"no choice of ranks reaches a predicted MLP latency of {latency_budget:.2f} us "
                             f"(the fastest is {self.points[0].latency:.2f} us, cost-model prediction)")
        return fits[-1]

    def summary(self, limit: int = 12) -> list[FrontPoint]:
        """At most ``limit`` points spread evenly along the front (both ends included)."""
        if len(self.points) <= limit:
            return list(self.points)
        picks = np.unique(np.linspace(0, len(self.points) - 1, limit).round().astype(int))
        return [self.points[i] for i in picks]


def pareto_front(losses: Sequence[np.ndarray], latencies: np.ndarray,
                 options: Sequence[tuple[int, int] | None]) -> Front:
    """The exact Pareto front of (sum of latencies, sum of losses) over per-layer choices.

    ``losses[layer][i]`` and ``latencies[i]`` are the loss and latency of variant ``options[i]``.
    """
    latencies = np.asarray(latencies, dtype=np.float64)
    if not losses:
        raise InputError("a model with no layers has no ranks to choose")
    front_lat, front_loss = np.zeros(1), np.zeros(1)
    parents: list[np.ndarray] = []
    picks: list[np.ndarray] = []
    for layer_loss in losses:
        lat = (front_lat[:, None] + latencies[None, :]).ravel()
        loss = (front_loss[:, None] + np.asarray(layer_loss)[None, :]).ravel()
        order = np.lexsort((loss, lat))
        lat, loss = lat[order], loss[order]
        best_before = np.concatenate([[np.inf], np.minimum.accumulate(loss)[:-1]])
        keep = np.flatnonzero(loss < best_before * (1 - 1e-12) - 1e-300)
        if keep.size > MAX_FRONT:
            keep = keep[np.unique(np.linspace(0, keep.size - 1, MAX_FRONT).round().astype(int))]
        chosen = order[keep]
        parents.append(chosen // len(options))
        picks.append(chosen % len(options))
        front_lat, front_loss = lat[keep], loss[keep]
    points = []
    for end in range(front_lat.size):
        index, choice = end, []
        for parent, pick in zip(reversed(parents), reversed(picks), strict=True):
            choice.append(options[int(pick[index])])
            index = int(parent[index])
        points.append(FrontPoint(float(front_lat[end]), float(front_loss[end]), tuple(reversed(choice))))
    return Front(tuple(points))


def uniform_point(losses: Sequence[np.ndarray], latencies: np.ndarray,
                  options: Sequence[tuple[int, int] | None], option: tuple[int, int] | None) -> FrontPoint:
    """The same variant in every layer (the plain NeuronMM plan), as a point to compare with the front."""
    i = list(options).index(option)
    return FrontPoint(float(len(losses) * latencies[i]), float(sum(loss[i] for loss in losses)),
                      tuple(option for _ in losses))


def choose(front: Front, *, loss_budget: float | None = None, latency_budget: float | None = None,
           on_choice: Callable[[FrontPoint], None] | None = None) -> FrontPoint:
    """Fastest within ``loss_budget`` or most accurate within ``latency_budget`` (exactly one given)."""
    if (loss_budget is None) == (latency_budget is None):
        raise InputError("give exactly one of an accuracy budget and a latency budget")
    point = front.fastest_within(loss_budget) if loss_budget is not None else front.most_accurate_within(
        latency_budget)  # type: ignore[arg-type]
    if on_choice is not None:
        on_choice(point)
    return point

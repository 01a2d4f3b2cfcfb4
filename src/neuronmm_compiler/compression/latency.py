"""Predicted MLP latency of each rank variant, from nmmc's cost model (no hardware is run).

For each token bucket and each variant (:func:`.rank_choice.variants`: the dense gated MLP or an SVD
MLP with ranks ``(r_gu, r_gu, r_down)``), nmmc searches the fused kernel's schedule space with its
cost model, exactly as ``nmmc tune --mlp`` does (answered from the same result cache when that search
ran before), and takes the tuned kernel's predicted latency.
A variant's latency is the sum over the buckets. Every figure here is a cost-model prediction.
:func:`predict_candidate_latencies` does the same for the per-layer candidates of the measured format choice
(:mod:`.format_choice`: dense or one rank for gate, up and down, each in bf16, an FP8 or an MX weight format), each
built by ``model_tuning``'s :class:`~..model_tuning.formats.MlpFormat` as ``tune --model`` builds it: an MX candidate is
the MLP ``nmmc tune --mlp --dtype mxfp4`` tunes (``mlp_workload(..., mx=MxWeights(format))``, trn3 only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..artifacts.cache import ResultCache
from ..driver import tune_cached
from ..frontends.workloads import MlpWorkload, mlp_workload
from ..jobs import SearchSettings, resolve
from ..model_tuning.formats import MlpFormat
from ..search import DEFAULT_TRIALS
from ..targets import Target

__all__ = ["LatencyTable", "predict_candidate_latencies", "predict_latencies"]


@dataclass(frozen=True)
class LatencyTable:
    """Predicted latency (us) per bucket and variant; ``total[i]`` sums variant ``i`` over the buckets."""

    buckets: tuple[int, ...]
    options: tuple[tuple[int, int] | None, ...]
    per_bucket: np.ndarray  # [buckets, options]
    target: str

    @property
    def total(self) -> np.ndarray:
        return self.per_bucket.sum(axis=0)

    def of(self, option: tuple[int, int] | None) -> float:
        return float(self.total[self.options.index(option)])

    def to_dict(self) -> dict:
        return {"target": self.target, "buckets": list(self.buckets), "unit": "us, cost-model prediction",
                "variants": [{"ranks": None if o is None else [o[0], o[0], o[1]],
                              "predicted_us": [float(x) for x in self.per_bucket[:, i]]}
                             for i, o in enumerate(self.options)]}


def _tuned_table(buckets: Sequence[int], options: Sequence[Any], build: Callable[[int, Any], MlpWorkload], *,
                 target: Target, trials: int | None, seed: int,
                 progress: Callable[[int, int], None] | None) -> np.ndarray:
    """Predicted latency (us) of the tuned ``build(tokens, option)`` per bucket and option."""
    table = np.zeros((len(buckets), len(options)))
    total, done = len(buckets) * len(options), 0
    cache = ResultCache()
    settings = SearchSettings(trials=trials or DEFAULT_TRIALS, seed=seed)
    for b, tokens in enumerate(buckets):
        for i, option in enumerate(options):
            tuned, _ = tune_cached(resolve(build(tokens, option), target), settings, cache)
            table[b, i] = tuned.compiled.cost.latency_us
            done += 1
            if progress is not None:
                progress(done, total)
    return table


def predict_latencies(hidden: int, intermediate: int, buckets: Sequence[int],
                      options: Sequence[tuple[int, int] | None], *, target: Target, trials: int | None = None,
                      seed: int = 0, progress: Callable[[int, int], None] | None = None) -> LatencyTable:
    """Tune every variant at every bucket with the cost model; see the module docstring."""

    def build(tokens: int, option: tuple[int, int] | None) -> MlpWorkload:
        if option is None:
            return mlp_workload(tokens, hidden, intermediate, dense=True)
        return mlp_workload(tokens, hidden, intermediate, ranks=(option[0], option[0], option[1]))

    table = _tuned_table(buckets, options, build, target=target, trials=trials, seed=seed, progress=progress)
    return LatencyTable(tuple(buckets), tuple(options), table, target.name)


def predict_candidate_latencies(hidden: int, intermediate: int, buckets: Sequence[int],
                                candidates: Sequence[tuple[int | None, str]], *, target: Target,
                                trials: int | None = None, seed: int = 0,
                                progress: Callable[[int, int], None] | None = None) -> dict:
    """Per candidate ``(rank or None for dense, weight dtype)`` its predicted latency per bucket (us), the fused
    kernel tuned as ``nmmc tune --mlp [--dense | --rank R] --dtype D`` tunes it."""

    def build(tokens: int, candidate: tuple[int | None, str]) -> MlpWorkload:
        rank, dtype = candidate
        return MlpFormat(rank is not None, dtype).workload(tokens, hidden, intermediate,
                                                           None if rank is None else (rank, rank, rank))

    table = _tuned_table(buckets, candidates, build, target=target, trials=trials, seed=seed, progress=progress)
    return {c: [float(x) for x in table[:, i]] for i, c in enumerate(candidates)}

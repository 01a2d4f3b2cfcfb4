"""Per-layer {dense, SVD ranks} x {bf16, FP8} chosen from *measured* perplexity within an accuracy budget
(``nmmc compress --choose-ranks --dtype fp8`` without ``--tokens``; docs/compression.md, docs/quantization.md).

The ranks-only choice (:mod:`.measured_choice`) walks each layer down a ladder of ranks. With FP8 the candidates of a
layer are no longer nested: dense FP8 stores fewer bytes than SVD bf16 at every rank that keeps more than half of the
parameters, and may cost less accuracy. So the choice is a measured greedy knapsack over a per-layer *cost*: the
predicted MLP latency summed over the token buckets served (``--tokens``: :func:`.latency.predict_candidate_latencies`,
nmmc's cost model, the fused kernel of each candidate tuned as ``nmmc tune --mlp`` tunes it), or without buckets the
weight bytes (what a memory-bound decode MLP streams):

0. candidates that cannot pay are dropped before anything is measured: one predicted no cheaper than the original
   layer, or *dominated* -- another candidate at least as accurate by construction (same format and more rank, or
   bf16 at the same rank or dense) costs no more (at decode buckets SVD often predicts slower than dense FP8);

1. every layer starts as the original dense layer (bf16 dense: the model as it is);
2. the *sensitivity* of every (layer, candidate): the increase of the mean next-token NLL on the selection tokens
   with that layer alone at that candidate (one forward pass from the layer on each);
3. the moves (layer, candidate) are tried cheapest first -- measured NLL increase per unit of cost saved, a move that
   measured no increase first (most cost saved first among those) -- each only if it costs less than the
   layer's current choice and no candidate at least as accurate (same format and more rank, or bf16 at the same
   rank) was refused for that layer before; a move is accepted only if the whole model, with every move accepted so
   far, measures a perplexity increase within the budget. Every acceptance is a real forward pass, as in
   :mod:`.measured_choice`.

A candidate's MLP is computed as its kernel computes it (:mod:`.formats`): an SVD or FP8 candidate in bf16 or FP8
emulation; the FP8 candidate's static activation scales come from the layer's inputs on the selection tokens under the
choice current when the candidate is first measured (the final files calibrate them on every calibration token).
Cost: at most 2 x layers x (kept candidates) forward passes from a layer on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..checkpoints.config import PROJECTIONS
from .calibration import sequences
from .formats import add_range, emulated_mlp, fp8_layer, traced_mlp, weight_bytes
from .forward import rms_norm
from .measured_choice import MeasuredChoice, Ticker, initial_states, run_from
from .rank_choice import candidate_ranks

__all__ = ["candidates", "cost_record", "measured_format_choice", "useful_candidates"]

#: A candidate: (rank, or None for dense; the kernel dtype).
Candidate = tuple[int | None, str]


def candidates(hidden: int, intermediate: int, align: int, fmt: str) -> list[Candidate]:
    """Dense and every block-aligned rank storing fewer parameters than dense, each in bf16 and in ``fmt``; the
    original (dense bf16) first, then by weight bytes, most first."""
    ranks = sorted(set(candidate_ranks(hidden, intermediate, align)), reverse=True)
    out = [(None, "bfloat16"), (None, fmt)] + [(r, d) for r in ranks for d in ("bfloat16", fmt)]
    return sorted(out, key=lambda c: (-layer_bytes(hidden, intermediate, c), c[1] != "bfloat16"))


def layer_bytes(hidden: int, intermediate: int, candidate: Candidate) -> int:
    """Weight bytes of one layer's MLP (gate, up, down) at ``candidate``."""
    rank, dtype = candidate
    return sum(weight_bytes(shape, rank, dtype) for shape in ((hidden, intermediate),) * 2 + ((intermediate, hidden),))


def _at_least_as_accurate(a: Candidate, b: Candidate) -> bool:
    rank_a, rank_b = math.inf if a[0] is None else a[0], math.inf if b[0] is None else b[0]
    return rank_a >= rank_b and (a[1] == b[1] or a[1] == "bfloat16")


def useful_candidates(options: list[Candidate], cost: Mapping[Candidate, float]) -> tuple[list[Candidate], dict]:
    """The candidates after the first (the original layer) that cost less than it and are not dominated (another
    candidate at least as accurate by construction costs no more), in ``options``' order; and why each other one
    was dropped (candidate -> the candidate dominating it)."""
    kept, dropped = [], {}
    for b in options[1:]:
        better = next((a for a in options if a != b and _at_least_as_accurate(a, b) and cost[a] <= cost[b]), None)
        if better is None:
            kept.append(b)
        else:
            dropped[b] = better
    return kept, dropped


def cost_record(options: list[Candidate], cost: Mapping[Candidate, float], unit: str,
                per_bucket: Mapping[Candidate, list[float]] | None = None, **context: Any) -> dict:
    """What the choice records of its costs (``rank_choice.cost`` in the manifest)."""
    _, dropped = useful_candidates(options, cost)

    def name(c: Candidate) -> str:
        return f"{'dense' if c[0] is None else 'rank ' + str(c[0])} {c[1]}"

    return {"unit": unit, **context, "candidates": [
        {"rank": c[0], "format": c[1], "cost": cost[c], **({} if per_bucket is None else {"per_bucket": per_bucket[c]}),
         **({"dropped": f"dominated by {name(dropped[c])}" if dropped[c] != options[0] else
             f"costs no less than {name(options[0])}"} if c in dropped else {})} for c in options]}


def measured_format_choice(model, ids: np.ndarray, budget: float, factor: Callable[[int, str, int], tuple],
                           fmt: str, *, length: int = 512, align: int = 128, costs: dict | None = None,
                           progress: Callable[[int, int], None] | None = None) -> MeasuredChoice:
    """The choice of the module docstring within ``budget`` (relative perplexity increase) measured on ``ids``;
    ``factor(layer, projection, rank)`` gives that projection's ``(u, v)``. ``costs``: one layer's cost of each
    candidate (:func:`candidates`), as :func:`cost_record` records it (:func:`latency_costs`: predicted latency);
    default its weight bytes. The result's ``choice`` holds the ranks (None: dense), ``formats`` the kernel dtype
    of each layer."""
    a = model.arch
    layers = a.num_hidden_layers
    chunks = sequences(np.asarray(ids), length)
    options = candidates(a.hidden_size, a.intermediate_size, align, fmt)
    if costs is None:
        costs = cost_record(options, {c: float(layer_bytes(a.hidden_size, a.intermediate_size, c)) for c in options},
                            "weight bytes")
    cost = {(c["rank"], c["format"]): c["cost"] for c in costs["candidates"]}
    start = options[0]
    rest = [(c["rank"], c["format"]) for c in costs["candidates"][1:] if "dropped" not in c]
    full = layer_bytes(a.hidden_size, a.intermediate_size, start)
    cache: dict[tuple[int, Candidate], Callable] = {}

    def prepare(layer: int, cand: Candidate, states) -> None:
        if cand == start or (layer, cand) in cache:
            return
        rank, dtype = cand
        f: dict[str, Any] = {p: model.mlp_weight(layer, p) if rank is None else
                             tuple(np.asarray(t, np.float32) for t in factor(layer, p, rank)) for p in PROJECTIONS}
        if dtype == "bfloat16":
            cache[(layer, cand)] = emulated_mlp({layer: f})
            return
        ranges: dict[str, float] = {}
        weights = model.layers[layer]
        for h in states[layer]:  # the layer's MLP inputs under the current choice
            h = h + model._attention(weights, rms_norm(h, weights["input_norm"], a.rms_norm_eps))
            traced_mlp(f, rms_norm(h, weights["post_norm"], a.rms_norm_eps), lambda p, v: add_range(ranges, p, v))
        cache[(layer, cand)] = emulated_mlp({layer: f}, fp8={layer: fp8_layer(f, ranges, dtype)})

    def mlp(layer: int, cand: Candidate, x: np.ndarray) -> np.ndarray:
        return model.mlp(layer, x)[0] if cand == start else cache[(layer, cand)](layer, x)

    ticker = Ticker(2 * layers * len(rest), progress)

    choice: list[Candidate] = [start] * layers
    base, states = run_from(model, chunks, mlp, choice, 0, initial_states(model, chunks))
    sensitivity = []
    for layer in range(layers):
        row = []
        for cand in rest:
            prepare(layer, cand, states)
            trial = list(choice)
            trial[layer] = cand
            row.append(run_from(model, chunks, mlp, trial, layer, states)[0] - base)
            ticker.tick()
        sensitivity.append(row)
    saved = {c: cost[start] - cost[c] for c in rest}
    moves = sorted(((layer, c) for layer in range(layers) for c in rest),
                   key=lambda m: (max(sensitivity[m[0]][rest.index(m[1])], 0.0) / saved[m[1]], -saved[m[1]], m[0]))
    refused: dict[int, list[Candidate]] = {layer: [] for layer in range(layers)}
    result = MeasuredChoice([None] * layers, budget, math.exp(base), sensitivity, formats=["bfloat16"] * layers,
                            cost=costs, candidates=[list(c) for c in rest])
    for layer, cand in moves:
        ticker.tick()
        if saved[cand] <= saved.get(choice[layer], 0) or any(_at_least_as_accurate(r, cand) for r in refused[layer]):
            continue
        prepare(layer, cand, states)
        trial = list(choice)
        trial[layer] = cand
        nll, new_states = run_from(model, chunks, mlp, trial, layer, states)
        increase = math.exp(nll - base) - 1.0
        accepted = increase <= budget
        fraction = sum(layer_bytes(a.hidden_size, a.intermediate_size, c) for c in trial) / (full * layers)
        result.steps.append({"layer": layer, "rank": cand[0], "format": cand[1], "bytes": fraction, "kept": fraction,
                             "cost": sum(cost[c] for c in trial) / (cost[start] * layers),
                             "ppl_increase": increase, "accepted": accepted})
        if accepted:
            choice[layer], states = cand, new_states
        else:
            refused[layer].append(cand)
    result.choice = [c[0] for c in choice]
    result.formats = [c[1] for c in choice]
    ticker.finish()
    return result


def latency_costs(arch, fmt: str, buckets, target, align: int = 128,
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """One layer's cost of each candidate for :func:`measured_format_choice` with ``--tokens`` (its ``costs``): its
    fused kernel's predicted latency summed over ``buckets`` on ``target`` (nmmc's cost model)."""
    from ..cost_model.trust import trust_note
    from ..tuning.speedups import context_note
    from .latency import predict_candidate_latencies

    options = candidates(arch.hidden_size, arch.intermediate_size, align, fmt)
    per_bucket = predict_candidate_latencies(arch.hidden_size, arch.intermediate_size, buckets, options, target=target,
                                             progress=progress)
    cost = {c: float(sum(v)) for c, v in per_bucket.items()}
    where = f"token bucket{'s' if len(buckets) > 1 else ''} {','.join(map(str, buckets))}"
    return cost_record(options, cost, f"us of one layer's MLP kernel, cost-model prediction summed over {where} "
                             f"on {target.name} (LNC={target.lnc})", per_bucket, buckets=list(buckets),
                             target=target.name, lnc=target.lnc, trust=trust_note(target, fused=True),
                             context=context_note(target), baseline="the original layer: nmmc's fused dense bf16 MLP")

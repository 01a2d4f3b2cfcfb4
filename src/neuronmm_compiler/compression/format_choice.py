"""Per-layer {dense, SVD ranks} x {the allowed weight formats} chosen from *measured* perplexity within an accuracy
budget (``nmmc compress --choose-ranks --dtype fp8``, ``--dtype mxfp4``, or a list ``--dtype bf16,fp8,mxfp8,mxfp4``;
docs/compression.md "Choosing formats per layer", docs/quantization.md).

The ranks-only choice (:mod:`.measured_choice`) walks each layer down a ladder of ranks. With FP8 or MX the candidates
of a layer are no longer nested: dense FP8 stores fewer bytes than SVD bf16 at every rank that keeps more than half of
the parameters, and may cost less accuracy. So the choice is a measured greedy knapsack over a per-layer *cost*: the
predicted MLP latency summed over the token buckets served (``--tokens``: :func:`.latency.predict_candidate_latencies`,
nmmc's cost model, the fused kernel of each candidate tuned as ``nmmc tune --mlp --dtype D`` tunes it, MX ones
included), or without buckets the weight bytes (what a memory-bound decode MLP streams; an MX weight's E8M0 scales
counted):

0. candidates that cannot pay are dropped before anything is measured: an MX candidate whose shapes nmmc's MX kernel
   does not take (every contraction a multiple of 512: :func:`mx_supported`; said in one note per format), one
   predicted no cheaper than the original layer, or *dominated* -- another candidate at least as accurate by
   construction (:func:`at_least_as_accurate`) costs no more (at decode buckets SVD often predicts slower than dense
   FP8);

1. every layer starts as the original dense layer (bf16 dense: the model as it is);
2. the *sensitivity* of every (layer, candidate): the increase of the mean next-token NLL on the selection tokens
   with that layer alone at that candidate (one forward pass from the layer on each);
3. the moves (layer, candidate) are tried cheapest first -- measured NLL increase per unit of cost saved, a move that
   measured no increase first (most cost saved first among those) -- each only if it costs less than the
   layer's current choice and no candidate at least as accurate by construction was refused for that layer before;
   a move is accepted only if the whole model, with every move accepted so far, measures a perplexity increase
   within the budget. Every acceptance is a real forward pass, as in :mod:`.measured_choice`.

"At least as accurate by construction" (:func:`at_least_as_accurate`) is claimed only where one candidate computes a
refinement of the other: the same format at the same or more rank (dense counts as the most); bf16 at the same or
more rank than any FP8 or MX candidate (the quantized kernels round the same bf16 values further); and MXFP8 E4M3
over MXFP4 at the same or more rank (both quantize activations to MXFP8 E4M3 with the same quantize_mx; every E2M1
weight value times its block scale ``2^(e-2)`` is an E4M3 value times ``2^(e-8)``, the block's other scale, and E4M3
reaches further, so rounding to the nearest E4M3 value errs no more, element by element). FP8 against MX, and MXFP8
E5M2 against either other MX format (different activation elements), are not ordered: both are measured.

A candidate's MLP is computed as its kernel computes it (:mod:`.formats`, :mod:`.mx_layers`): an SVD or dense
candidate in bf16, FP8 or MX emulation; the FP8 candidate's static activation scales come from the layer's inputs on
the selection tokens under the choice current when the candidate is first measured (the final files calibrate them
on every calibration token); MX scales are computed from the values themselves, as the kernel does.
Cost: at most 2 x layers x (kept candidates) forward passes from a layer on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..checkpoints.config import PROJECTIONS
from ..errors import InputError
from ..ir.mx import MX_FORMATS
from .calibration import sequences
from .formats import add_range, emulated_mlp, fp8_layer, traced_mlp, weight_bytes
from .forward import rms_norm
from .measured_choice import MeasuredChoice, Ticker, initial_states, run_from
from .rank_choice import candidate_ranks

__all__ = ["allowed_formats", "at_least_as_accurate", "candidates", "cost_record", "measured_format_choice",
           "mx_unsupported", "supported", "useful_candidates"]

#: A candidate: (rank, or None for dense; the kernel dtype).
Candidate = tuple[int | None, str]
BF16 = "bfloat16"
#: (finer, coarser) MX formats: the finer's weight grid holds the coarser's and their activations are quantized alike
#: (module docstring; tests/test_compress_joint.py checks it element by element).
_MX_REFINES = {("mxfp8_e4m3", "mxfp4")}


def allowed_formats(fmt: str | Sequence[str]) -> tuple[str, ...]:
    """The weight formats the choice takes: one quantized format ``f`` means (bf16, ``f``), as ``--choose-ranks
    --dtype fp8`` always did; a sequence (``--dtype bf16,fp8,mxfp4``) is taken as given."""
    return (BF16, fmt) if isinstance(fmt, str) else tuple(fmt)


def candidates(hidden: int, intermediate: int, align: int, fmt: str | Sequence[str]) -> list[Candidate]:
    """The original layer (dense bf16) first, then dense and every block-aligned rank storing fewer parameters than
    dense in each allowed format (:func:`allowed_formats`), by weight bytes, most first (bf16 first on a tie)."""
    formats = allowed_formats(fmt)
    ranks = sorted(set(candidate_ranks(hidden, intermediate, align)), reverse=True)
    out = [(r, d) for r in [None, *ranks] for d in formats if (r, d) != (None, BF16)]
    out.sort(key=lambda c: (-layer_bytes(hidden, intermediate, c), c[1] != BF16, formats.index(c[1])))
    return [(None, BF16), *out]


def layer_bytes(hidden: int, intermediate: int, candidate: Candidate) -> int:
    """Weight bytes of one layer's MLP (gate, up, down) at ``candidate``."""
    rank, dtype = candidate
    return sum(weight_bytes(shape, rank, dtype) for shape in ((hidden, intermediate),) * 2 + ((intermediate, hidden),))


def mx_unsupported(hidden: int, intermediate: int, candidate: Candidate) -> str | None:
    """Why nmmc's MX MLP kernel does not take an MX ``candidate`` (its graph refuses the shapes: every contraction, the
    hidden and intermediate sizes and an SVD rank, a multiple of 512; ir/mx.py ``check_contraction``), else None."""
    rank, dtype = candidate
    if dtype not in MX_FORMATS:
        return None
    from ..model_tuning.formats import MlpFormat

    try:
        MlpFormat(rank is not None, dtype).workload(1, hidden, intermediate,
                                                    None if rank is None else (rank, rank, rank)).graph()
    except InputError as err:
        return str(err)
    return None


def supported(hidden: int, intermediate: int, options: Sequence[Candidate]) -> tuple[list[Candidate], list[dict]]:
    """The candidates nmmc's kernels take, and the MX ones dropped (``rank``, ``format``, ``reason``)."""
    kept, dropped = [], []
    for c in options:
        reason = mx_unsupported(hidden, intermediate, c)
        if reason is None:
            kept.append(c)
        else:
            dropped.append({"rank": c[0], "format": c[1], "reason": reason})
    return kept, dropped


def unsupported_notes(dropped: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per MX format of the candidates :func:`supported` dropped: which, and why."""
    by_format: dict[str, dict[str, list[str]]] = {}
    for d in dropped:
        name = "dense" if d["rank"] is None else f"rank {d['rank']}"
        by_format.setdefault(d["format"], {}).setdefault(d["reason"], []).append(name)
    return [f"{fmt} candidates dropped before measuring, nmmc's MX kernel does not take their shapes: " + "; ".join(
        f"{', '.join(names)} ({reason})" for reason, names in reasons.items()) for fmt, reasons in by_format.items()]


def at_least_as_accurate(a: Candidate, b: Candidate) -> bool:
    """Whether ``a`` is at least as accurate as ``b`` by construction (module docstring): at the same or more rank,
    the same format, bf16 over an MX format, or MXFP8 E4M3 over MXFP4."""
    rank_a, rank_b = math.inf if a[0] is None else a[0], math.inf if b[0] is None else b[0]
    return rank_a >= rank_b and (a[1] == b[1] or (a[1] == BF16 and b[1] in MX_FORMATS) or (a[1], b[1]) in _MX_REFINES)


def useful_candidates(options: list[Candidate], cost: Mapping[Candidate, float]) -> tuple[list[Candidate], dict]:
    """The candidates after the first (the original layer) that cost less than it and are not dominated (another
    candidate at least as accurate by construction costs no more), in ``options``' order; and why each other one
    was dropped (candidate -> the candidate dominating it, or the original layer)."""
    kept, dropped = [], {}
    for b in options[1:]:
        if cost[options[0]] <= cost[b]:
            dropped[b] = options[0]
            continue
        better = next((a for a in options if a != b and at_least_as_accurate(a, b) and cost[a] <= cost[b]), None)
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


def bytes_costs(arch, fmt: str | Sequence[str], align: int = 128) -> dict:
    """One layer's cost of each supported candidate without ``--tokens``: its weight bytes."""
    options, dropped = supported(arch.hidden_size, arch.intermediate_size,
                                 candidates(arch.hidden_size, arch.intermediate_size, align, fmt))
    return {**cost_record(options, {c: float(layer_bytes(arch.hidden_size, arch.intermediate_size, c))
                                    for c in options}, "weight bytes"),
            "formats": list(allowed_formats(fmt)), "unsupported": dropped}


def measured_format_choice(model, ids: np.ndarray, budget: float, factor: Callable[[int, str, int], tuple],
                           fmt: str | Sequence[str], *, length: int = 512, align: int = 128, costs: dict | None = None,
                           progress: Callable[[int, int], None] | None = None) -> MeasuredChoice:
    """The choice of the module docstring within ``budget`` (relative perplexity increase) measured on ``ids``;
    ``factor(layer, projection, rank)`` gives that projection's ``(u, v)``; ``fmt``: the allowed formats
    (:func:`allowed_formats`). ``costs``: one layer's cost of each candidate (:func:`candidates`), as
    :func:`cost_record` records it (:func:`latency_costs`: predicted latency); default its weight bytes
    (:func:`bytes_costs`). The result's ``choice`` holds the ranks (None: dense), ``formats`` the kernel dtype of each
    layer."""
    from .mx_layers import mx_layer

    a = model.arch
    layers = a.num_hidden_layers
    chunks = sequences(np.asarray(ids), length)
    if costs is None:
        costs = bytes_costs(a, fmt, align)
    cost = {(c["rank"], c["format"]): c["cost"] for c in costs["candidates"]}
    start = (None, BF16)
    rest = [(c["rank"], c["format"]) for c in costs["candidates"][1:] if "dropped" not in c]
    full = layer_bytes(a.hidden_size, a.intermediate_size, start)
    cache: dict[tuple[int, Candidate], Callable] = {}
    factored: dict[tuple[int, int | None], dict[str, Any]] = {}  # one factorization per rank, whatever the format

    def prepare(layer: int, cand: Candidate, states) -> None:
        if cand == start or (layer, cand) in cache:
            return
        rank, dtype = cand
        if (layer, rank) not in factored:
            factored[(layer, rank)] = {p: model.mlp_weight(layer, p) if rank is None else tuple(
                np.asarray(t, np.float32) for t in factor(layer, p, rank)) for p in PROJECTIONS}
        f = factored[(layer, rank)]
        if dtype == BF16:
            cache[(layer, cand)] = emulated_mlp({layer: f})
            return
        if dtype in MX_FORMATS:  # scales from the values themselves, as the MX kernel computes them
            cache[(layer, cand)] = emulated_mlp({layer: f}, mx={layer: mx_layer(f, dtype)})
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
        if saved[cand] <= saved.get(choice[layer], 0) or any(at_least_as_accurate(r, cand) for r in refused[layer]):
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


def latency_costs(arch, fmt: str | Sequence[str], buckets, target, align: int = 128,
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """One layer's cost of each candidate for :func:`measured_format_choice` with ``--tokens`` (its ``costs``): its
    fused kernel's predicted latency summed over ``buckets`` on ``target`` (nmmc's cost model), MX candidates' the MX
    kernel's (tuned as ``nmmc tune --mlp --dtype mxfp4`` tunes it); an MX candidate whose shapes the MX kernel does
    not take is dropped first (``unsupported``)."""
    from ..cost_model.trust import trust_note
    from ..tuning.speedups import context_note
    from .latency import predict_candidate_latencies

    options, dropped = supported(arch.hidden_size, arch.intermediate_size,
                                 candidates(arch.hidden_size, arch.intermediate_size, align, fmt))
    per_bucket = predict_candidate_latencies(arch.hidden_size, arch.intermediate_size, buckets, options, target=target,
                                             progress=progress)
    cost = {c: float(sum(v)) for c, v in per_bucket.items()}
    where = f"token bucket{'s' if len(buckets) > 1 else ''} {','.join(map(str, buckets))}"
    return cost_record(options, cost, f"us of one layer's MLP kernel, cost-model prediction summed over {where} "
                             f"on {target.name} (LNC={target.lnc})", per_bucket, buckets=list(buckets),
                             target=target.name, lnc=target.lnc, trust=trust_note(target, fused=True),
                             context=context_note(target), baseline="the original layer: nmmc's fused dense bf16 MLP",
                             formats=list(allowed_formats(fmt)), unsupported=dropped)


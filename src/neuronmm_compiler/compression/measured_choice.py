"""Per-layer ranks chosen from *measured* perplexity within an accuracy budget (``--choose-ranks`` without
``--tokens``).

Every layer starts dense (exact). The candidates of a layer are dense and the block-aligned ranks that
store fewer parameters than dense, used for gate, up and down alike, tried from the largest down. The
greedy search:

1. measures each layer's *sensitivity*: the increase of the mean next-token negative log-likelihood
   (NLL) on the selection tokens with that layer alone compressed at the largest candidate rank;
2. for each rank from the largest to the smallest, visits the layers from least to most sensitive
   and moves a layer one step down (dense -> largest rank -> next rank ...) only if the whole model,
   with every change accepted so far and this one, measures a perplexity increase within the budget.
   Every step is a real forward pass of the model over the selection tokens, never an additive proxy:
   errors that compound between layers are in the number. A layer refused at a rank keeps its last
   accepted choice (dense stays a choice for every layer).

The accepted steps trace the front of measured perplexity increase against kept MLP parameters; it is
printed by ``nmmc compress`` and plotted (matplotlib) next to the factors. The search reuses the
residual stream of the current choice at every layer's input, so a step re-runs only the layers from
the changed one on. Cost: (layers x (1 + ranks)) forward passes over the selection tokens at most.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checkpoints.config import PROJECTIONS
from .calibration import sequences
from .forward import log_softmax, rms_norm, silu
from .rank_choice import candidate_ranks

__all__ = ["SELECTION_SHARE", "SELECTION_TOKENS", "MeasuredChoice", "Ticker", "chosen_lines", "cost_lines",
           "front_lines", "measured_choice", "plot_front", "selection_tokens"]

#: Calibration tokens the measured rank choice (--choose-ranks without --tokens) measures perplexity on,
#: taken as whole sequences spread evenly over the calibration set (so every source is represented).
SELECTION_TOKENS = 1024
#: The measured rank choice spends this fraction of --max-ppl-increase on the selection tokens: they are
#: calibration text, and on SmolLM2-135M text of other domains lost 2-3x more perplexity than the
#: calibration's own (benchmarks/results/compression-runs.md), so the whole budget there overshoots it
#: elsewhere. With --eval the budget is then checked on the eval files, and the choice backed off until it holds
#: there (:mod:`.eval_budget`).
SELECTION_SHARE = 0.5


def selection_tokens(ids: np.ndarray, length: int, total: int = SELECTION_TOKENS) -> np.ndarray:
    """``total`` tokens of ``ids`` as whole sequences of ``length`` at evenly spaced positions."""
    chunks = sequences(ids, length)
    count = max(1, min(len(chunks), -(-total // length)))
    picks = np.unique(np.linspace(0, len(chunks) - 1, count).round().astype(int))
    return np.concatenate([chunks[i] for i in picks])



@dataclass
class MeasuredChoice:
    """The chosen rank per layer (None: dense), the budget, and every measured step."""

    choice: list[int | None]
    budget: float
    base_ppl: float
    sensitivity: list
    steps: list[dict] = field(default_factory=list)
    formats: list[str] | None = None  # per layer the kernel dtype, when formats were chosen too (.format_choice)
    eval_check: dict | None = None  # the budget held on the --eval files (.eval_budget), when it was checked
    cost: dict | None = None  # a format choice's per-candidate cost (.format_choice.cost_record)
    candidates: list | None = None  # a format choice's candidates measured ([rank, format]; sensitivity's columns)

    def to_dict(self) -> dict:
        check = {} if self.eval_check is None else {"eval_check": self.eval_check}
        if self.formats is not None:
            return {"mode": "measured greedy over {dense, SVD ranks} x formats within an accuracy budget",
                    "budget_ppl_increase": self.budget, "selection_ppl": self.base_ppl, "choice": self.choice,
                    "formats": self.formats, "cost": self.cost, "candidates": self.candidates,
                    "layer_nll_increase": self.sensitivity, "steps": self.steps, **check}
        return {"mode": "measured greedy within an accuracy budget", "budget_ppl_increase": self.budget,
                "selection_ppl": self.base_ppl, "choice": self.choice,
                "layer_nll_increase_at_largest_rank": self.sensitivity, "steps": self.steps, **check}


def _kept(hidden: int, intermediate: int, choice: Sequence[int | None]) -> float:
    dense = 3 * hidden * intermediate
    return sum(dense if r is None else 3 * r * (hidden + intermediate) for r in choice) / (dense * len(choice))


class Ticker:
    """A step counter reporting ``progress(done, total)`` (capped at ``total``) after each step, and the total once
    :meth:`finish` is called (a greedy may stop short of its bound)."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None):
        self.total, self.done, self.progress = total, 0, progress

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress(self.total, self.total)


def measured_choice(model, ids: np.ndarray, budget: float, factor: Callable[[int, str, int], tuple], *,
                    length: int = 512, align: int = 128,
                    progress: Callable[[int, int], None] | None = None) -> MeasuredChoice:
    """Greedy per-layer ranks within ``budget`` (relative perplexity increase, 0.1 = +10%) measured on
    ``ids``; ``factor(layer, projection, rank)`` gives that projection's ``(u, v)`` (e.g. whitened SVD)."""
    a = model.arch
    layers = a.num_hidden_layers
    chunks = sequences(np.asarray(ids), length)
    ranks = sorted(set(candidate_ranks(a.hidden_size, a.intermediate_size, align)), reverse=True)
    cache: dict[tuple[int, int], dict] = {}

    def mlp(layer: int, rank: int | None, x: np.ndarray) -> np.ndarray:
        if rank is None:
            return model.mlp(layer, x)[0]
        if (layer, rank) not in cache:
            cache[(layer, rank)] = {p: tuple(np.asarray(t, dtype=np.float32) for t in factor(layer, p, rank))
                                    for p in PROJECTIONS}
        f = cache[(layer, rank)]
        return (silu((x @ f["gate"][0]) @ f["gate"][1]) * ((x @ f["up"][0]) @ f["up"][1])) @ f["down"][0] \
            @ f["down"][1]

    def run(choice: Sequence[int | None], start: int, states: list[list[np.ndarray]]):
        return run_from(model, chunks, mlp, choice, start, states)

    ticker = Ticker(layers * (1 + len(ranks)), progress)

    dense: list[int | None] = [None] * layers
    base, states = run(dense, 0, initial_states(model, chunks))
    base_ppl = math.exp(base)
    sensitivity = []
    for layer in range(layers):
        trial = list(dense)
        trial[layer] = ranks[0] if ranks else None
        nll, _ = run(trial, layer, states) if ranks else (base, None)
        sensitivity.append(nll - base)
        ticker.tick()
    order = sorted(range(layers), key=lambda i: (sensitivity[i], i))
    choice = list(dense)
    result = MeasuredChoice(choice, budget, base_ppl, sensitivity)
    for rank in ranks:
        for layer in order:
            previous = choice[layer]
            if previous is not None and previous <= rank:
                continue
            if previous is None and rank != ranks[0]:
                continue  # refused at a larger rank: a smaller one measures worse
            trial = list(choice)
            trial[layer] = rank
            nll, new_states = run(trial, layer, states)
            increase = math.exp(nll) / base_ppl - 1.0
            accepted = increase <= budget
            result.steps.append({"layer": layer, "rank": rank, "ppl_increase": increase,
                                 "kept": _kept(a.hidden_size, a.intermediate_size, trial), "accepted": accepted})
            if accepted:
                choice[layer] = rank
                states = new_states
            ticker.tick()
    result.choice = choice
    ticker.finish()
    return result


def initial_states(model, chunks: Sequence[np.ndarray]) -> list[list[np.ndarray | None]]:
    """Per layer and chunk the residual stream entering the layer: the embeddings for layer 0, None (not yet run)
    for the others (:func:`run_from` from layer 0 fills them)."""
    layers = model.arch.num_hidden_layers
    return [[model.embed[c].astype(np.float32) for c in chunks]] + [[None] * len(chunks) for _ in range(layers - 1)]


def run_from(model, chunks: Sequence[np.ndarray], mlp: Callable, choice: Sequence, start: int,
             states: list[list[np.ndarray]]) -> tuple[float, list[list[np.ndarray]]]:
    """Mean next-token NLL over ``chunks`` with layer ``i``'s MLP ``mlp(i, choice[i], x)``, run from layer ``start``
    on (``states[start]`` are its inputs, the layers before are as ``states`` says); the new states."""
    a = model.arch
    new = [list(s) for s in states]
    nll, count = 0.0, 0
    for c, chunk in enumerate(chunks):
        h = states[start][c].copy()
        for index in range(start, a.num_hidden_layers):
            new[index][c] = h
            layer = model.layers[index]
            h = h + model._attention(layer, rms_norm(h, layer["input_norm"], a.rms_norm_eps))
            h = h + mlp(index, choice[index], rms_norm(h, layer["post_norm"], a.rms_norm_eps))
        logp = log_softmax(rms_norm(h, model.norm, a.rms_norm_eps) @ model.lm_head)
        nll -= float(logp[np.arange(len(chunk) - 1), chunk[1:]].astype(np.float64).sum())
        count += len(chunk) - 1
    return nll / count, new


def _latency_mode(result: MeasuredChoice) -> bool:
    return result.cost is not None and result.cost["unit"] != "weight bytes"


def front_lines(result: MeasuredChoice) -> list[str]:
    """The accepted steps (kept fraction, measured increase) and the refusals, for the terminal."""
    latency = _latency_mode(result)
    what = "predicted latency saved" if latency else "weight byte saved"
    lines = [f"  measured rank choice within +{result.budget:.1%} perplexity on calibration tokens (base perplexity "
             f"{result.base_ppl:.2f}; half of --max-ppl-increase, the rest is margin for other text); greedy "
             + ("steps, least sensitive layer first:" if result.formats is None else
                f"moves over {{dense, SVD}} x {{{_formats(result)}}}, least measured NLL increase per {what} first:")]
    if latency:
        assert result.cost is not None
        lines[0:0] = cost_lines(result.cost)
    for s in result.steps:
        mark = "accepted" if s["accepted"] else "refused "
        if "format" in s:
            what = f"{'dense' if s['rank'] is None else 'rank ' + str(s['rank']):>9} {s['format']:<11}"
            spent = (f"predicted latency {s['cost']:.3f} of bf16 dense" if latency else
                     f"weight bytes {s['bytes']:.3f} of bf16 dense")
            lines.append(f"    {mark} layer {s['layer']:>2} -> {what}: {spent}, measured {s['ppl_increase']:+.2%}")
            continue
        lines.append(f"    {mark} layer {s['layer']:>2} -> rank {s['rank']:>4}: kept {s['kept']:.3f}, measured "
                     f"{s['ppl_increase']:+.2%}")
    if result.eval_check is not None:
        from .eval_budget import check_lines

        lines += check_lines(result.eval_check)
    if result.formats is not None and result.cost is not None:
        lines += chosen_lines(result)
    return lines


def _formats(result: MeasuredChoice) -> str:
    """The weight formats a format choice took (``bf16, FP8`` before they were recorded)."""
    short = {"bfloat16": "bf16"}
    return ", ".join(short.get(f, f) for f in (result.cost or {}).get("formats", ["bf16", "FP8"]))


def _name(c: tuple[int | None, str]) -> str:
    return f"{'dense' if c[0] is None else 'rank ' + str(c[0])} {c[1]}"


def _spans(layers: Sequence[int]) -> str:
    """``0-3, 7``."""
    out: list[list[int]] = []
    for i in layers:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def layer_savings(result: MeasuredChoice) -> list[dict]:
    """Per layer of a format choice: its rank, format and the cost it saves against the original layer (dense bf16),
    in the choice's cost unit (predicted us summed over the buckets, or weight bytes)."""
    assert result.cost is not None and result.formats is not None
    cost = {(c["rank"], c["format"]): c["cost"] for c in result.cost["candidates"]}
    start = cost[(None, "bfloat16")]
    return [{"layer": i, "rank": r, "format": f, "saved": start - cost[(r, f)]}
            for i, (r, f) in enumerate(zip(result.choice, result.formats, strict=True))]


def chosen_lines(result: MeasuredChoice) -> list[str]:
    """What a format choice gave each layer (layers of one candidate together) and what it saves, with how far to
    trust a predicted latency."""
    assert result.cost is not None
    latency = result.cost["unit"] != "weight bytes"
    saves = layer_savings(result)
    start = next(c["cost"] for c in result.cost["candidates"] if (c["rank"], c["format"]) == (None, "bfloat16"))
    groups: dict[tuple[int | None, str], list[int]] = {}
    for s in saves:
        groups.setdefault((s["rank"], s["format"]), []).append(s["layer"])

    def amount(v: float) -> str:
        return f"{v:.1f} us" if latency else f"{v / 1024:.0f} KiB"

    what = "predicted latency of one layer's MLP kernel" if latency else "weight bytes"
    lines = [f"  chosen per layer ({what} saved against dense bf16, per layer):"]
    for cand, layers in groups.items():
        lines.append(f"    {_name(cand):<22} layers {_spans(layers)}: saves {amount(start - cost_of(result, cand))}")
    total, saved = start * len(saves), sum(s["saved"] for s in saves)
    lines.append(f"    all {len(saves)} layers: {amount(total)} -> {amount(total - saved)} ({saved / total:.1%} saved)"
                 + (f"; cost-model predictions over token buckets {','.join(map(str, result.cost['buckets']))} on "
                    f"{result.cost['target']}, not measurements ({result.cost['trust']}; {result.cost['context']})"
                    if latency else "; what a memory-bound decode MLP streams, not a latency"))
    return lines


def cost_of(result: MeasuredChoice, cand: tuple[int | None, str]) -> float:
    """The recorded cost of ``cand`` in ``result``'s choice."""
    assert result.cost is not None
    return next(c["cost"] for c in result.cost["candidates"] if (c["rank"], c["format"]) == cand)


def cost_lines(cost: dict) -> list[str]:
    """A format choice's candidates by predicted latency (one layer's MLP, summed over the buckets), which were
    dropped before measuring and why; what the figures are and how far to trust them."""
    lines = [f"  per-layer candidates, {cost['unit']}; against {cost['baseline']}:",
             f"    (cost model: {cost['trust']}; {cost['context']})"]
    for c in cost["candidates"]:
        name = f"{'dense' if c['rank'] is None else 'rank ' + str(c['rank'])} {c['format']}"
        buckets = "" if len(c["per_bucket"]) < 2 else " = " + " + ".join(f"{v:.1f}" for v in c["per_bucket"])
        dropped = f"  dropped: {c['dropped']}" if "dropped" in c else ""
        lines.append(f"    {name:<22} {c['cost']:9.1f} us{buckets}{dropped}")
    return lines


def plot_front(result: MeasuredChoice, path: str | Path) -> Path:
    """Write the measured front (kept MLP parameters against measured perplexity increase) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    accepted = [s for s in result.steps if s["accepted"]]
    refused = [s for s in result.steps if not s["accepted"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    x = "cost" if _latency_mode(result) else "kept"
    ax.plot([1.0] + [s[x] for s in accepted], [0.0] + [100 * s["ppl_increase"] for s in accepted],
            "o-", label="accepted steps (the front)")
    if refused:
        ax.plot([s[x] for s in refused], [100 * s["ppl_increase"] for s in refused], "x", color="grey",
                label="refused steps")
    ax.axhline(100 * result.budget, color="red", linestyle="--", label=f"budget +{result.budget:.0%}")
    ax.set_xlabel("kept fraction of MLP parameters" if result.formats is None else
                  "predicted MLP latency, fraction of bf16 dense (cost model)" if _latency_mode(result) else
                  "MLP weight bytes, fraction of bf16 dense")
    ax.set_ylabel("measured perplexity increase (%)")
    ax.invert_xaxis()
    ax.set_title("nmmc compress --choose-ranks: measured greedy front")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

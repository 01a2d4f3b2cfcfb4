"""Tensor-parallel factor-shard blocks: whitened (:func:`whitened_shards`) and healed like the unsharded
factors (:func:`.heal.closed_form_heal` calls :func:`shard_gate_up` and :func:`shard_down`), and the
deployment's MLP (:func:`sharded_mlp`) that measures them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .forward import silu
from .heal_solve import Accumulator, project, rank_constrained_lstsq

__all__ = ["shard_down", "shard_gate_up", "sharded_mlp", "whitened_shards"]


def shard_gate_up(model, index: int, acc: Mapping[str, Accumulator], given, shards, shard_rank, damping,
                   metrics: Mapping[str, np.ndarray]) -> dict:
    """Each rank's gate/up block (columns ``[a, b)``) fitted to the same targets' columns (weighed by the
    block of the output metric: rank i's MLP reads only its own columns)."""
    out: dict = {}
    for p in ("gate", "up"):
        if p not in acc:
            out[p] = None
            continue
        k = model.mlp_weight(index, p).shape[0]
        full = given[p][0].shape[1]
        blocks = []
        q = metrics.get(p)
        for a, b in shards:
            r = shard_rank(k, b - a, full)
            blocks.append(None if r is None else tuple(t.astype(np.float32) for t in rank_constrained_lstsq(
                acc[p].gram, acc[p].cross[:, a:b], r, damping, None if q is None else q[a:b, a:b])))
        out[p] = None if any(f is None for f in blocks) else blocks
    return out


def shard_down(model, index: int, xs, shard_layer: Mapping, shards, shard_rank, damping, full: int,
                stream_q: np.ndarray | None):
    """Each rank's down block (rows ``[a, b)``), on that rank's own inner activations from its gate/up
    blocks (the dense columns where those are not factored), against the original partial sum
    ``h(x~)[:, a:b] Wd[a:b]``."""
    w_down = model.mlp_weight(index, "down")
    weights = {p: model.mlp_weight(index, p) for p in ("gate", "up")}
    ranks = [shard_rank(b - a, w_down.shape[1], full) for a, b in shards]
    if any(r is None for r in ranks):
        return None
    accs = [Accumulator(b - a, w_down.shape[1]) for a, b in shards]
    for x in xs:
        original = model.mlp(index, x)[1]  # the original MLP's inner activations, once per input for every rank
        for i, (a, b) in enumerate(shards):
            parts = {p: (project(x, shard_layer[p][i]) if shard_layer.get(p) else x @ weights[p][:, a:b])
                     for p in ("gate", "up")}
            accs[i].add(silu(parts["gate"]) * parts["up"], original[:, a:b] @ w_down[a:b])
    return [tuple(t.astype(np.float32) for t in rank_constrained_lstsq(acc.gram, acc.cross, r, damping, stream_q))
            for acc, r in zip(accs, ranks, strict=True)]


def sharded_mlp(model, shard_factors: Mapping[int, Mapping[str, Any]], shards: Sequence[tuple[int, int]]
                ) -> Callable[[int, np.ndarray], np.ndarray]:
    """``mlp(layer, x)`` of a tensor-parallel deployment with factor-shard blocks: the sum over ranks of
    ``down_i(silu(gate_i(x)) * up_i(x))``, each projection from its rank's block factors (the original
    weight's block where the block is not factored)."""

    def mlp(layer: int, x: np.ndarray) -> np.ndarray:
        f = shard_factors.get(layer) or {}
        total = None
        for i, (a, b) in enumerate(shards):
            def part(p: str, inp: np.ndarray, i=i, a=a, b=b) -> np.ndarray:
                blocks = f.get(p)
                if blocks:
                    return project(inp, blocks[i])
                w = model.mlp_weight(layer, p)
                return inp @ (w[a:b] if p == "down" else w[:, a:b])
            y = part("down", silu(part("gate", x)) * part("up", x))
            total = y if total is None else total + y
        return total

    return mlp


def whitened_shards(model, grams: Sequence[Mapping[str, np.ndarray]], plans: Sequence[Mapping[str, int | None]],
                    shards: Sequence[tuple[int, int]], shard_rank: Callable[[int, int, int], int | None],
                    damping: float) -> dict[int, dict[str, Any]]:
    """Factor-shard blocks by whitened SVD on the calibration activations (no healing): gate/up blocks
    whitened by the MLP input's Gram, each down block by its rows' block of the inner Gram."""
    out: dict[int, dict[str, Any]] = {}
    for layer, ranks in enumerate(plans):
        out[layer] = {}
        for proj, full in ranks.items():
            if full is None:
                out[layer][proj] = None
                continue
            w = model.mlp_weight(layer, proj)
            blocks = []
            for a, b in shards:
                if proj == "down":
                    block, gram = w[a:b], grams[layer]["inner"][a:b, a:b]
                else:
                    block, gram = w[:, a:b], grams[layer]["input"]
                r = shard_rank(block.shape[0], block.shape[1], full)
                if r is None:
                    blocks = None
                    break
                gram = np.asarray(gram, dtype=np.float64)
                blocks.append(tuple(t.astype(np.float32) for t in rank_constrained_lstsq(
                    gram, gram @ block.astype(np.float64), r, damping)))
            out[layer][proj] = blocks
    return out

"""``nmmc tune --model`` on an ``nmmc compress`` output whose layers differ in ranks or format (``--choose-ranks``,
``--choose-ranks --dtype fp8``): one kernel set per layer group (:mod:`..compression.layer_groups`, the grouping ``nmmc
export`` uses), and the model's total predicted MLP latency per token bucket (docs/quantization.md, "Choosing a
format").

Each group's kernels go to ``<group>/`` in the output (``svd-bf16-r128-128-128/mlp_t1.py``, ``dense-fp8/mlp_t1.py``):
the file names inside are a uniform output's. A group's kernel is in the format the manifest records for its layers
(its ranks or dense, ``layers[i].fp8``), chosen there under the accuracy budget, so ``chosen_by`` is ``manifest`` in
every bucket; the other ``--dtype`` formats are tuned for comparison only. A bucket's total is the sum over layers
of their group's kernel; its baseline is nmmc's fused dense MLP in bf16 for every layer (the uncompressed,
unquantized model), tuned the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..compression.layer_groups import LayerGroup, group_names
from ..driver import Tuned
from ..errors import InputError
from .entries import BucketResult, bucket_entry, dense_bucket_entry
from .formats import FormatRequest, MlpFormat

#: What the per-bucket totals are compared with.
BASELINE = "nmmc's fused dense MLP in bf16 for every layer"


def group_formats(group: LayerGroup, formats: FormatRequest) -> tuple[tuple[MlpFormat, ...], MlpFormat]:
    """(the formats ``tune --model`` tunes for ``group``, the one its layers record): the recorded weight format
    first (its kernel is the group's ``mlp_t{T}.py``), then the other ``--dtype`` formats for comparison; a
    ``--dtype`` that excludes the recorded format is refused."""
    recorded = MlpFormat(group.ranks is not None, group.weights, formats.format_scale(group.weights))
    default = formats.weights == FormatRequest().weights  # no --dtype (or bf16 alone): the recorded format alone
    if not default and group.weights not in formats.weights:
        raise InputError(f"the compress output's layers {_layers(group.layers)} are {group.weights} (manifest "
                         "layers[i].fp8), which tune --model uses: add it to --dtype or drop --dtype")
    weights = (group.weights,) if default else (group.weights, *(w for w in formats.weights if w != group.weights))
    return FormatRequest(weights, formats.act_scale).candidates(group.ranks is not None), recorded


def group_index(groups: Sequence[LayerGroup], results: Sequence[Sequence[BucketResult]],
                baseline: Sequence[Tuned]) -> dict[str, Any]:
    """The index fields of a grouped ``tune --model`` output: per layer its group (``layer_groups``), per group its
    layers, ranks, format and buckets (each a uniform output's bucket entry, files under the group's directory), and
    per bucket the model's total (``buckets``). ``results[g][b]``: group g's bucket b; ``baseline[b]``: nmmc's
    fused dense bf16 MLP at bucket b."""
    entries = []
    for group, per_bucket in zip(groups, results, strict=True):
        buckets = [bucket_entry(r) if group.ranks is not None else dense_bucket_entry(r) for r in per_bucket]
        for entry in buckets:
            entry["chosen_by"] = "manifest"
        entries.append({"name": group.name, "dir": group.name, "layers": list(group.layers),
                        "mlp": "dense" if group.ranks is None else "svd",
                        "ranks": None if group.ranks is None else dict(zip(("gate", "up", "down"), group.ranks,
                                                                           strict=True)),
                        "weights": group.weights, "format": per_bucket[0].chosen.name if per_bucket else None,
                        "formats_allowed": [f.name for f in per_bucket[0].formats] if per_bucket else [],
                        "buckets": buckets})
    allowed = list(dict.fromkeys(name for e in entries for name in e["formats_allowed"]))
    layers = sum(len(g.layers) for g in groups)
    totals = []
    for b, dense in enumerate(baseline):
        parts = []
        for group, entry, per_bucket in zip(groups, entries, results, strict=True):
            r = per_bucket[b]
            us = r.formats[r.chosen].compiled.cost.latency_us
            parts.append({"group": group.name, "layers": len(group.layers), "format": r.chosen.name,
                          "file": next(f["file"] for f in entry["buckets"][b]["formats"] if f["chosen"]),
                          "predicted_us": us, "total_us": us * len(group.layers)})
        total = sum(p["total_us"] for p in parts)
        dense_us = dense.compiled.cost.latency_us * layers
        nkilib = dense.baselines.get("nkilib-mlp")
        nkilib_us = nkilib.cost.latency_us * layers if nkilib is not None and nkilib.cost is not None \
            and nkilib.cost.feasible else None
        runs = nkilib is not None and nkilib.runnable  # else a reference: no speedup over it
        totals.append({"tokens": results[0][b].tokens, "layers": layers, "predicted_us": total,
                       "baseline": BASELINE, "dense_bf16_us": dense_us, "speedup_vs_dense_bf16": dense_us / total,
                       "nkilib_us": nkilib_us, "nkilib_runnable": runs,
                       **({} if runs or nkilib is None else {"nkilib_not_runnable": nkilib.not_runnable}),
                       "speedup_vs_nkilib": None if nkilib_us is None or not runs else nkilib_us / total,
                       "groups": parts, "chosen_by": "manifest"})
    return {"ranks": "per layer (see groups)", "formats_allowed": allowed, "layer_groups": group_names(groups),
            "groups": entries, "buckets": totals}


def _layers(layers: Sequence[int]) -> str:
    return ("layer " if len(layers) == 1 else "layers ") + ",".join(str(i) for i in layers)

"""The index entries of ``nmmc tune --model``: per token bucket, its tuned kernels (each allowed format's search), the
chosen format and the baselines it is compared with (:mod:`.model_tuning` writes them into index.json)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..cost_model import CostReport
from ..driver import Tuned
from ..frontends.workloads import GemmWorkload, MlpWorkload, Workload, mlp_workload
from ..lowerings.base import Baseline, ordered_baselines
from .formats import MlpFormat


@dataclass
class BucketResult:
    tokens: int
    file: str
    workload: Workload
    tuned: Tuned
    dense: Tuned  # nmmc's own best dense alternative: the fused dense gated MLP, tuned the same way
    formats: dict[MlpFormat, Tuned]  # every allowed format's search (the primary and its dense MLP among them)
    chosen: MlpFormat  # the fastest predicted (model_formats.choose), or the format a compress output records
    prefix: str = ""  # the directory of the bucket's files in the output ("" or a layer group's "<name>/")


def kernel_entries(tuned: Tuned) -> list[dict[str, Any]]:
    """Each kernel of a compiled workload in call order: its name, its arguments and results by name (``inputs``,
    ``outputs``) and with their shapes, dtypes and HBM layout (``arguments``, ``results``)."""
    def described(buffers: Any) -> list[dict[str, Any]]:
        return [{"name": b.name, "shape": list(b.shape), "dtype": b.dtype, "layout": "row_major"} for b in buffers]

    return [{"name": p.name, "inputs": [b.name for b in p.params], "outputs": [b.name for b in p.outputs],
             "arguments": described(p.params), "results": described(p.outputs)} for p in tuned.compiled.programs]


#: The name of nmmc's own fused dense MLP among a tuned SVD MLP's baselines (lowerings/base.py, BASELINE_ORDER).
NMMC_DENSE = "nmmc-dense"


def dense_counterpart(workload: Workload) -> Workload | None:
    """What nmmc's own dense baseline tunes (None for anything else): the dense MLP an SVD-compressed MLP replaces,
    in the same weight format; for an FP8 dense MLP, the unquantized dense MLP it quantizes (what the user runs
    without FP8)."""
    if isinstance(workload, GemmWorkload) and workload.mx is not None:  # an MX GEMM: the bf16 GEMM it quantizes
        return replace(workload, mx=None)
    if not isinstance(workload, MlpWorkload) or not (workload.svd or workload.fp8 or workload.mx):
        return None
    return mlp_workload(workload.tokens, workload.hidden, workload.intermediate, dense=True, dtype=workload.dtype,
                        fp8=workload.fp8 if workload.svd else None, mx=workload.mx if workload.svd else None)


def with_dense_baseline(tuned: Tuned, dense: Tuned, *, unquantized: bool = False) -> Tuned:
    """``tuned`` with nmmc's own fused dense MLP (``dense``, tuned the same way, on the same target and launch
    context) among its baselines, in the order a user meets them (:func:`~.lowerings.base.ordered_baselines`);
    ``unquantized``: ``dense`` is the bf16 MLP an FP8 one quantizes, and its label says so (an MX MLP's or GEMM's:
    docs/mx.md)."""
    workload = tuned.compiled.workload
    if unquantized and getattr(workload, "mx", None) is not None:
        kind, kernel = ("GEMM", "kernel") if isinstance(workload, GemmWorkload) else ("dense MLP", "fused kernel")
        label = f"{kind} without MX (nmmc's {kernel}, tuned)"
        name = f"nmmc's {kind} without MX (MX's accuracy cost: nmmc verify, docs/mx.md)"
    elif unquantized:
        label = "dense MLP without FP8 (nmmc's fused kernel, tuned)"
        name = ("nmmc's fused dense MLP without FP8 (FP8's accuracy cost: nmmc verify, nmmc compress --eval, "
                "docs/quantization.md)")
    else:
        label, name = "dense MLP (nmmc's fused kernel, tuned)", "nmmc's fused dense MLP"
    baseline = Baseline(label, name, dense.compiled.cost, one_core=False)
    return replace(tuned, baselines=ordered_baselines({**tuned.baselines, NMMC_DENSE: baseline}))


def _latency(cost: CostReport | None) -> float | None:
    return None if cost is None else cost.latency_us


def dense_bucket_entry(result: BucketResult) -> dict[str, Any]:
    """A bucket of ``tune --model --dense``: nmmc's fused dense MLP against AWS's kernel per matmul."""
    compiled = result.tuned.compiled
    speedups = result.tuned.speedups()
    nkilib = result.tuned.baselines.get("nkilib-mlp")
    nkilib_us = _latency(nkilib.cost) if nkilib is not None and nkilib.cost is not None and nkilib.cost.feasible \
        else None
    # nki-library's MLP where it runs here and beats nmmc's dense kernel: keep what the serving stack runs
    best = result.formats[result.chosen].compiled.cost.latency_us
    runs = nkilib is not None and nkilib.runnable
    recommended = "nkilib" if runs and nkilib_us is not None and nkilib_us < best else "dense"
    return {"tokens": result.tokens, "file": result.file, "kernels": kernel_entries(result.tuned),
            "schedule": compiled.schedule.as_dict(), "predicted_us": compiled.cost.latency_us,
            "nkilib_us": nkilib_us, "speedup_vs_nkilib": speedups.get("nkilib-mlp"),
            "baseline_us": _latency(result.tuned.baselines["dense"].cost), "speedup_vs_baseline": speedups["dense"],
            "baselines": _baselines(result.tuned), "recommended": recommended,
            "recommended_file": None if recommended == "nkilib" else _chosen_file(result),
            **_format_fields(result)}


def bucket_entry(result: BucketResult) -> dict[str, Any]:
    compiled = result.tuned.compiled
    tuned = with_dense_baseline(result.tuned, result.dense)
    speedups = tuned.speedups()
    fused_dense = result.dense.compiled.cost.latency_us
    nkilib = _latency(result.tuned.baselines["nkilib-mlp"].cost) if "nkilib-mlp" in result.tuned.baselines else None
    best_nmmc = result.formats[result.chosen].compiled.cost.latency_us
    # nki-library's MLP where it runs here and beats every kernel nmmc wrote for the bucket: keep what the serving
    # stack runs
    runs = "nkilib-mlp" in result.tuned.baselines and result.tuned.baselines["nkilib-mlp"].runnable
    nkilib_best = runs and nkilib is not None and result.tuned.baselines["nkilib-mlp"].cost.feasible \
        and nkilib < best_nmmc
    recommended = "nkilib" if nkilib_best else "svd" if result.chosen.svd else "dense"
    return {
        "tokens": result.tokens,
        "file": result.file,
        "kernels": kernel_entries(result.tuned),
        "schedule": compiled.schedule.as_dict(),
        "predicted_us": compiled.cost.latency_us,
        # the honest comparison: the best dense MLP nmmc itself emits (one fused kernel), tuned alike
        "fused_dense_us": fused_dense,
        "speedup_vs_fused_dense": fused_dense / compiled.cost.latency_us,
        # what NxD Inference runs today: nki-library's fused MLP (None where it does not run this shape)
        "nkilib_us": nkilib,
        "speedup_vs_nkilib": speedups.get("nkilib-mlp"),
        "baseline_us": _latency(result.tuned.baselines["dense"].cost),
        "unfused_baseline_us": _latency(result.tuned.baselines["unfused"].cost),
        "speedup_vs_baseline": speedups["dense"],
        "speedup_vs_unfused": speedups["unfused"],
        # every baseline in the order a user meets them (lowerings/base.py, BASELINE_ORDER)
        "baselines": _baselines(tuned),
        "recommended": recommended,
        "recommended_file": None if recommended == "nkilib" else _chosen_file(result),
        **_format_fields(result),
    }


def _baselines(tuned: Tuned) -> list[dict[str, Any]]:
    """Every baseline of a bucket: what it computes, its latency, the speedup over it (None where it is not modelled,
    does not fit or cannot run in the launch context) and whether it can run there, and why not."""
    speedups = tuned.speedups()
    return [{"name": name, "computation": b.label, "latency_us": _latency(b.cost), "speedup": speedups[name],
             **b.context_dict()} for name, b in tuned.baselines.items()]


def runnable(entry: dict[str, Any], name: str) -> bool:
    """Whether the bucket ``entry``'s baseline ``name`` can run in the launch context (an index written before this
    was recorded: True)."""
    return next((b.get("runnable", True) for b in entry.get("baselines", []) if b["name"] == name), True)


def _chosen_file(result: BucketResult) -> str:
    primary = next(iter(result.formats))
    return result.prefix + result.chosen.file(result.tokens, primary)


def _format_fields(result: BucketResult) -> dict[str, Any]:
    """A bucket's format choice: the primary kernel's format, the chosen one, and the front (every allowed format's
    predicted latency, its workload and, where written, its file)."""
    primary = next(iter(result.formats))
    written = {primary, result.chosen}
    return {"format": primary.name, "chosen_format": result.chosen.name,
            "formats": [{"name": f.name, "structure": "svd" if f.svd else "dense", "weights": f.weights,
                         "predicted_us": t.compiled.cost.latency_us, "workload": t.compiled.workload.to_dict(),
                         "file": result.prefix + f.file(result.tokens, primary) if f in written else None,
                         "chosen": f == result.chosen} for f, t in result.formats.items()]}

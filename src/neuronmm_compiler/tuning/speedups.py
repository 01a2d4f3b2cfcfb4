"""How nmmc states a speedup: in which launch context it was predicted, a speedup below 1 as a slowdown, and how
far it moves with the assumed in-graph cost per kernel.

The launch context is a field of the target (:attr:`~neuronmm_compiler.targets.Target.launch`, resolved once by the
CLI into the target spec, e.g. ``trn2:lnc=2:launch=in-graph``). Standalone, a workload pays one measured launch
(45.3 us on trn2); in-graph, every kernel pays :attr:`~neuronmm_compiler.targets.Target.in_graph_kernel_us`, for
which no published figure exists (docs/cost_model.md, section 2a). A report records how many launches it pays
(``values["n_launch"]``) and at what cost each (``values["t_launch"]``), so the same prediction can be re-read at
another per-kernel cost without costing anything again: :func:`latency_at`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..targets import IN_GRAPH, Target

if TYPE_CHECKING:
    from ..cost_model import CostReport

#: The other in-graph per-kernel costs (us) every in-graph speedup is also shown at: none at all, and more than
#: twice the assumed 2 us (a kernel boundary costing a few DMA fixed costs).
SENSITIVITY_US: tuple[float, ...] = (0.0, 5.0)

#: Why MLP, model and tensor-parallel workloads default to in-graph (README, docs/cost_model.md 2a).
IN_GRAPH_WHY = "an MLP runs inside a model's compiled graph"


def launches(cost: CostReport) -> float:
    """How many launch costs ``cost`` pays: 1 standalone, one per kernel in-graph."""
    return cost.values.get("n_launch", 1.0)


def latency_at(cost: CostReport, per_kernel_us: float) -> float:
    """``cost``'s latency had every launch it pays cost ``per_kernel_us`` instead."""
    n = launches(cost)
    return cost.latency_us - n * cost.values.get("t_launch", 0.0) + n * per_kernel_us


def speedup_text(speedup: float) -> str:
    """``1.84x``; a speedup below 1 as the slowdown it is: ``0.83x (slower)``."""
    return f"{speedup:.2f}x" + (" (slower)" if speedup < 1 else "")


def context_note(target: Target) -> str:
    """The launch context a prediction was made in, for the line under a table of latencies."""
    if target.launch == IN_GRAPH:
        return (f"launch context: in-graph: every kernel pays {target.in_graph_kernel_us:g} us (an assumption: no "
                "published figure; docs/cost_model.md 2a), a baseline of several kernels once per kernel; "
                "--launch standalone for a kernel run on its own")
    return (f"launch context: standalone: the workload pays one {target.launch_overhead_us:g} us launch (as "
            "nki.benchmark measures a kernel run on its own); --launch in-graph for a kernel inside a model graph")


def sensitivity(baseline: CostReport, cost: CostReport, target: Target) -> str:
    """How an in-graph speedup of ``cost`` over ``baseline`` reads at the other per-kernel costs (empty when
    standalone): ``1.52x at 0 us, 1.60x at 5 us per kernel``."""
    if target.launch != IN_GRAPH:
        return ""
    parts = [f"{latency_at(baseline, us) / latency_at(cost, us):.2f}x at {us:g} us" for us in SENSITIVITY_US]
    return ", ".join(parts) + " per kernel"


def launch_dict(target: Target) -> dict[str, Any]:
    """The launch context as JSON (``tune --json``, index.json, plan.json)."""
    data: dict[str, Any] = {"context": target.launch, "standalone_launch_us": target.launch_overhead_us}
    if target.launch == IN_GRAPH:
        data.update(per_kernel_us=target.in_graph_kernel_us, per_kernel_source="assumption (no published figure)",
                    sensitivity_us=list(SENSITIVITY_US))
    return data

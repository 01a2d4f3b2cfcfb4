"""Choose a tensor-parallel strategy: compile (or tune) every rank's kernels of every strategy, add the
collectives' cost, and compare with the alternatives a user has (docs/tensor-parallel.md, "Costing").

A rank's kernels and the collectives run in lockstep stages: the group waits for its slowest rank
before a collective (the reduced tensor is a kernel's last output, so nothing overlaps it), so

    total = sum over stages of (max over ranks of the stage's kernel latencies) + collective costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..cost_model.collectives import UNVALIDATED, CollectiveCost, check_group, collective_cost
from ..driver import Compiled
from ..errors import InputError
from ..frontends.workloads import MlpWorkload, Workload
from ..targets import Target
from .sharding import CollectiveStep, KernelStep, ShardedMlp, Strategy, check_tp, shard_mlp, strategies

#: Compiles (or tunes) one per-rank workload.
KernelFn = Callable[[Workload], Compiled]
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
#: Kept fractions closer than this are equal (they are ratios of parameter counts, exact up to rounding).
KEPT_TOLERANCE = 1e-12


@dataclass
class StrategyResult:
    """One strategy's per-rank kernels and predicted time (``error`` says why it does not apply)."""

    strategy: Strategy
    sharded: ShardedMlp | None = None
    kernels: dict[str, Compiled] = field(default_factory=dict)
    kernel_us: float = 0.0
    collectives: list[CollectiveCost] = field(default_factory=list)
    error: str | None = None

    @property
    def comm_us(self) -> float:
        return sum(c.total_us for c in self.collectives)

    @property
    def total_us(self) -> float:
        return self.kernel_us + self.comm_us

    @property
    def comm_bytes(self) -> float:
        """Bytes one rank sends in the strategy's collectives."""
        return sum(c.bytes_sent_per_rank for c in self.collectives)

    @property
    def kept(self) -> float:
        """The fraction of the dense MLP's parameters the strategy's weights hold (:attr:`.ShardedMlp.kept`)."""
        assert self.sharded is not None
        return self.sharded.kept

    def as_dict(self) -> dict[str, Any]:
        if self.error is not None:
            return {"strategy": self.strategy.name, "applies": False, "reason": self.error}
        return {"strategy": self.strategy.name, "applies": True, "kernel_us": self.kernel_us,
                "comm_us": self.comm_us, "total_us": self.total_us, "comm_bytes_per_rank": self.comm_bytes,
                "kept_fraction": self.kept,
                "collectives": [c.as_dict() for c in self.collectives],
                "kernels": {key: c.cost.latency_us for key, c in sorted(self.kernels.items())}}


@dataclass
class TpResult:
    """Every strategy of one workload at one group size, the choice, and the alternatives."""

    workload: MlpWorkload
    tp: int
    target: Target
    results: list[StrategyResult]
    alternatives: dict[str, dict[str, float] | None]  # label -> kernel_us, comm_us, total_us (None: not modelled)

    @property
    def applicable(self) -> list[StrategyResult]:
        return [r for r in self.results if r.error is None]

    @property
    def chosen(self) -> StrategyResult:
        return min(self.applicable, key=lambda r: r.total_us)

    @property
    def most_accurate(self) -> StrategyResult:
        """The fastest strategy among those keeping the most parameters (the unsharded factors' accuracy when a
        slice-based strategy applies and factor-shard's blocks keep fewer)."""
        kept = max(r.kept for r in self.applicable)
        return min((r for r in self.applicable if r.kept >= kept - KEPT_TOLERANCE), key=lambda r: r.total_us)

    @property
    def more_accurate(self) -> StrategyResult | None:
        """:attr:`most_accurate` when the latency-only choice keeps fewer parameters than it, else None."""
        best = self.most_accurate
        return best if self.chosen.kept < best.kept - KEPT_TOLERANCE else None


def stage_time(sharded: ShardedMlp, kernels: dict[str, Compiled], target: Target
               ) -> tuple[float, list[CollectiveCost]]:
    """(kernel time summed over lockstep stages, the collectives' costs) of one sharded MLP."""
    steps = len(sharded.ranks[0].steps)
    kernel_us, collectives, pending = 0.0, [], [0.0] * len(sharded.ranks)
    for index in range(steps):
        first = sharded.ranks[0].steps[index]
        if isinstance(first, CollectiveStep):
            kernel_us += max(pending)
            pending = [0.0] * len(sharded.ranks)
            size = DTYPE_BYTES[first.dtype]
            for dim in first.shape:
                size *= dim
            collectives.append(collective_cost(first.op, size, len(first.group), target))
            continue
        for rank, program in enumerate(sharded.ranks):
            step = program.steps[index]
            assert isinstance(step, KernelStep)
            pending[rank] += kernels[step.key].cost.latency_us
    return kernel_us + max(pending), collectives


def evaluate_strategy(workload: MlpWorkload, tp: int, strategy: Strategy, target: Target,
                      kernel_fn: KernelFn) -> StrategyResult:
    """Shard under ``strategy``, compile each distinct per-rank workload once, cost the stages."""
    result = StrategyResult(strategy)
    try:
        result.sharded = shard_mlp(workload, tp, strategy)
    except InputError as exc:
        result.error = str(exc)
        return result
    for program in result.sharded.ranks:
        for step in program.steps:
            if isinstance(step, KernelStep) and step.key not in result.kernels:
                result.kernels[step.key] = kernel_fn(step.workload)
    result.kernel_us, result.collectives = stage_time(result.sharded, result.kernels, target)
    return result


#: The alternatives' kinds, in the order a user meets them (lowerings/base.py, BASELINE_ORDER): nki-library's MLP per
#: rank (what NxD Inference runs), nmmc's own fused dense MLP, for FP8 weights also nmmc's dense MLP without FP8,
#: then AWS's kernel per projection.
ALTERNATIVES = ("nkilib-mlp", "nmmc-dense", "nmmc-dense-unquantized", "dense")


def alternative_label(kind: str, workload: MlpWorkload) -> str:
    """How tables and plan.json name an alternative (the labels of a bf16 MLP are unchanged since version 1). For FP8
    weights each label says its format: nki-library's MLP runs its FP8 path as NxD Inference calls it (FP8 weights;
    at decode bf16 activations), AWS's tutorial matmul has no FP8 (as ``nmmc tune`` labels them for one kernel,
    docs/quantization.md "Baselines")."""
    fp8 = workload.fp8
    if fp8 is None:
        return {"nkilib-mlp": "dense, nki-library MLP + all-reduce", "nmmc-dense": "dense, nmmc fused MLP + all-reduce",
                "dense": "dense, AWS kernel per projection + all-reduce"}[kind]
    fmt = fp8.format.replace("float8_", "fp8_")
    return {"nkilib-mlp": f"dense {fmt} weights, nki-library MLP (its FP8 path) + all-reduce",
            "nmmc-dense": f"dense {fmt}, nmmc fused MLP + all-reduce",
            "nmmc-dense-unquantized": f"dense without FP8 ({workload.dtype}), nmmc fused MLP + all-reduce",
            "dense": f"dense {workload.dtype}, AWS kernel per projection (no FP8) + all-reduce"}[kind]


def dense_alternatives(workload: MlpWorkload, tp: int, target: Target, dialect: str,
                       kernel_fn: KernelFn) -> dict[str, dict[str, float] | None]:
    """The dense MLP at the same group size (see :data:`ALTERNATIVES`): nki-library's MLP on each rank's shard plus
    the all-reduce (what NxD Inference runs), nmmc's own fused dense MLP in the workload's weight format plus it
    (for FP8 weights also the one without FP8, tuned alike, as ``nmmc tune`` of one FP8 MLP compares with its bf16
    twin), then AWS's kernel per projection (SiLU and multiply as their own kernels, as nmmc's ``dense`` baseline)
    plus it."""
    from ..lowerings import lowering_for
    from ..lowerings.base import dma_transpose_ok

    dense = MlpWorkload(workload.tokens, workload.hidden, workload.intermediate, None, workload.dtype, fp8=workload.fp8)
    megatron = evaluate_strategy(dense, tp, Strategy("dense", "dense"), target, kernel_fn)
    assert megatron.sharded is not None
    slowest: dict[str, float | None] = {"nkilib-mlp": 0.0, "dense": 0.0}  # the slowest rank's kernel of each
    for compiled in megatron.kernels.values():
        shard = compiled.workload
        # an FP8 shard's baselines: nki-library's FP8 path (nkilib_mlp.py), AWS's the bf16 computation (fused.py)
        baselines = lowering_for(shard).baselines(shard, target, dma_transpose_ok(shard, target, dialect))
        for name, latency in slowest.items():
            # a baseline that cannot run in the launch context (lowerings/base.py, Baseline.runnable) is no
            # alternative: nobody can run it there
            cost = baselines[name].cost if name in baselines and baselines[name].runnable else None
            slowest[name] = (None if latency is None or cost is None or not cost.feasible
                             else max(latency, cost.latency_us))
    comm = megatron.comm_us

    def total(kernel: float | None) -> dict[str, float] | None:
        return None if kernel is None else {"kernel_us": kernel, "comm_us": comm, "total_us": kernel + comm}

    out = {"nkilib-mlp": total(slowest["nkilib-mlp"]), "nmmc-dense": total(megatron.kernel_us)}
    if workload.fp8 is not None:
        plain = replace(dense, fp8=None)
        unquantized = evaluate_strategy(plain, tp, Strategy("dense", "dense"), target, kernel_fn)
        out["nmmc-dense-unquantized"] = {"kernel_us": unquantized.kernel_us, "comm_us": unquantized.comm_us,
                                         "total_us": unquantized.total_us}
    out["dense"] = total(slowest["dense"])
    return {alternative_label(kind, workload): figures for kind, figures in out.items()}


def plan_tp(workload: Workload, tp: int, target: Target, dialect: str, kernel_fn: KernelFn,
            only: str | None = None) -> TpResult:
    """Evaluate every strategy (or ``only`` the named one) of an MLP over ``tp`` ranks."""
    if not isinstance(workload, MlpWorkload):
        raise InputError("--tp shards a gated MLP (--mlp): Megatron-style sharding splits an MLP's intermediate "
                         "dimension; a GEMM, an SVD chain or a graph file has none nmmc knows how to split")
    check_tp(tp, workload.intermediate)
    check_group(target, tp)
    chosen = strategies(workload)
    if only is not None:
        from .sharding import parse_strategy

        chosen = [parse_strategy(only, workload)]
    results = [evaluate_strategy(workload, tp, s, target, kernel_fn) for s in chosen]
    if not any(r.error is None for r in results):
        reasons = "; ".join(f"{r.strategy.name}: {r.error}" for r in results)
        raise InputError(f"no tensor-parallel strategy applies at --tp {tp}: {reasons}")
    return TpResult(workload, tp, target, results, dense_alternatives(workload, tp, target, dialect, kernel_fn))


def collectives_note() -> str:
    return UNVALIDATED

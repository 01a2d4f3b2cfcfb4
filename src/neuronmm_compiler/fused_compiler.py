"""The compiler driver for fused graphs (SVD chains, gated MLPs): passes, kernels, search, baselines.

``compile_graph`` runs the fusion pipeline (implicit transposition, fusion, placement), splits the
graph into kernels, lowers each with one :class:`FusedSchedule`, costs and prints them into one file.
``tune_graph`` searches the fused schedule space (the MLP's one-or-two-kernel choice included) and
reports two baselines at the same shape, as the NeuronMM paper does: the dense computation with
AWS's fully optimized kernel per projection (SiLU and multiply as their own kernels), and the SVD
factors as separate AWS-kernel GEMMs with every intermediate through HBM.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from .codegen import DEFAULT_DIALECT, KernelFile, check_dialect, emit_kernel
from .cost_model import COST_MODEL_VERSION, CostReport, combine_reports, estimate
from .cost_model.footprint import FUSED_ADVICE, Footprint, check_fits
from .errors import ScheduleError
from .ir import Graph
from .passes import run_pipeline, split_kernels
from .schedule import PRESETS, GemmProblem, lower_gemm, preset
from .schedule.fused import FusedSchedule, check_fused, normalize_fused
from .schedule.lower_elementwise import lower_elementwise
from .schedule.lower_fused import lower_fused_kernel
from .schedule.program import Program
from .search import DEFAULT_EXHAUSTIVE_THRESHOLD, DEFAULT_TRIALS, SearchSpace, TuneResult
from .search import space as search_space
from .search.tuner import Evaluator, SpaceSpec, search
from .targets import Target
from .workloads import Workload

FUSION_PIPELINE = "canonicalize,fold-transposes,canonicalize,implicit-transpose,fuse{{mlp={mlp}}},place,group-epilogues"


@dataclass
class GraphLowered:
    """A graph after the fusion passes, split into kernels."""

    source_graph: Graph
    graph: Graph
    pipeline_steps: list
    kernels: list[Graph]


def lower_graph(graph: Graph, mlp: str = "whole") -> GraphLowered:
    result = run_pipeline(graph, FUSION_PIPELINE.format(mlp=mlp))
    if not result.graph.compute_nodes():
        raise ScheduleError(f"graph {graph.name} computes nothing: every output returns an input (transposes of "
                            "inputs become input layouts); nmmc compiles computations")
    return GraphLowered(graph, result.graph, list(result.steps), split_kernels(result.graph))


def graph_programs(lowered: GraphLowered, schedule: FusedSchedule, target: Target) -> list[Program]:
    return [lower_fused_kernel(kernel, schedule, target, kernel.name) for kernel in lowered.kernels]


def check_hbm(programs: list[Program], target: Target) -> None:
    """ScheduleError when the HBM tensors of all kernels (graph inputs and outputs, and the values
    kernels hand each other) do not fit the target's HBM per core at once."""
    arrays = {b.name: b for p in programs for b in (*p.params, *p.outputs)}
    needed = sum(b.itemsize * math.prod(b.shape) for b in arrays.values())
    if needed > target.hbm_bytes_per_core:
        raise ScheduleError(f"the kernels' HBM tensors (inputs, outputs and values handed between kernels) need "
                            f"{needed / 2**30:.1f} GiB; a {target.name} NeuronCore has "
                            f"{target.hbm_bytes_per_core / 2**30:.1f} GiB")


@dataclass
class CompiledGraph:
    """Everything one fused compilation produced."""

    workload: Workload
    lowered: GraphLowered
    schedule_name: str
    schedule: FusedSchedule
    programs: list[Program]
    footprints: list[Footprint]
    kernel_costs: list[CostReport]
    cost: CostReport
    kernel: KernelFile
    target: Target
    dialect: str


def splittable(workload: Workload) -> bool:
    """True when ``mlp=split`` changes anything: a matmul reads an elementwise result (the MLP's h)."""
    if workload.kind in ("mlp", "gemm", "chain"):
        return workload.kind == "mlp"
    graph = workload.graph()
    return any(n.kind == "matmul" and graph.node(n.operands[0]).kind == "elementwise" for n in graph.nodes())


def row_major_activations(workload: Workload) -> bool:
    """True when some activation is row-major in HBM, so how X^T is made (x_transpose) matters."""
    if workload.kind == "mlp":
        return True
    if workload.kind != "graph":
        return workload.a_layout == "mk"
    graph = workload.graph()
    lhs = {n.operands[0] for n in graph.nodes() if n.kind == "matmul"}
    return any(n.layout == "row_major" for n in graph.inputs() if n.id in lhs)


def resolve_fused(workload: Workload, schedule: FusedSchedule | None, params: Mapping[str, str | int] | None,
                  target: Target) -> FusedSchedule:
    chosen = (schedule or FusedSchedule()).with_params(dict(params or {}))
    check_fused(chosen, target.gemm_moving_fmax, target.gemm_stationary_fmax)
    if chosen.mlp == "split" and not splittable(workload):
        raise ScheduleError("mlp=split applies to graphs where a matmul reads an elementwise result "
                            "(the gated MLP's h)")
    return normalize_fused(chosen, workload.token_count)


def compile_graph(workload: Workload, *, target: Target, dialect: str = DEFAULT_DIALECT,
                  schedule: FusedSchedule | None = None, params: Mapping[str, str | int] | None = None,
                  schedule_name: str | None = None) -> CompiledGraph:
    """Compile a chain or MLP workload into one file of fused kernels."""
    check_dialect(dialect)
    chosen = resolve_fused(workload, schedule, params, target)
    lowered = lower_graph(workload.graph(), chosen.mlp)
    programs = graph_programs(lowered, chosen, target)
    check_hbm(programs, target)
    footprints = [check_fits(p, target, FUSED_ADVICE) for p in programs]
    costs = [estimate(p, target) for p in programs]
    total = combine_reports(costs)
    name = schedule_name or ("default" if schedule is None else "custom")
    if params:
        name += " + " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))
    summary = [
        ("workload", workload.describe()),
        ("schedule", name),
        ("parameters", chosen.describe()),
        ("footprint", "; ".join(f"{p.name}: {fp.describe()}" for p, fp in zip(programs, footprints, strict=True))),
        ("predicted", f"{total.latency_us:.1f} us on {target.label} (cost model v{COST_MODEL_VERSION}, "
                      f"{len(programs)} kernel{'s' if len(programs) > 1 else ''})"),
    ]
    kernel = emit_kernel(programs, lowered.graph, target=target, dialect=dialect, summary=summary,
                         schedule={"name": name, "params": chosen.as_dict()})
    return CompiledGraph(workload, lowered, name, chosen, programs, footprints, costs, total, kernel, target, dialect)


# ----------------------------------------------------------------------------- baselines


def _gemm_cost(problem: GemmProblem, target: Target) -> CostReport:
    """AWS's fully optimized kernel; where it does not fit the shape, the first AWS preset that does."""
    for name in ("aws-fully-optimized", *[p for p in PRESETS if p != "aws-fully-optimized"]):
        report = estimate(lower_gemm(problem, preset(name, problem), target), target)
        if report.feasible:
            return report
    return report


def unfused_cost(graph: Graph, target: Target, *, lhs_layout: str = "mk") -> CostReport:
    """Every matmul as its own AWS-kernel GEMM, every elementwise op as its own HBM-to-HBM kernel.

    ``lhs_layout="mk"``: activations are row-major in HBM, so each GEMM transposes its left operand
    on load (the unfused SVD baseline: "whatever transposes the layouts need"). ``"km"``: every left
    operand is assumed already transposed, as AWS's kernel takes it (the dense baseline, given the
    benefit of the doubt)."""
    reports = []
    for node in graph.nodes():
        if node.kind == "matmul":
            lhs = graph.node(node.operands[0])
            m, k = lhs.shape
            layout = "km" if lhs.kind == "input" and lhs.layout == "transposed" else lhs_layout
            problem = GemmProblem(m, node.shape[1], k, dtype=node.dtype, a_layout=layout)
            reports.append(_gemm_cost(problem, target))
        elif node.kind == "elementwise":
            reports.append(estimate(lower_elementwise(node.attrs["op"], node.shape, node.dtype, target), target))
        elif node.kind == "transpose":
            raise ScheduleError("baselines of graphs with explicit transposes are not modelled")
    return combine_reports(reports)


# ----------------------------------------------------------------------------- search


def fused_space(workload: Workload) -> SearchSpace:
    return search_space.fused_space(row_major_activations(workload), splittable(workload))


@dataclass
class TunedGraph:
    compiled: CompiledGraph
    search: TuneResult
    baseline: CostReport | None  # dense, AWS kernel per projection (None: not modelled for this graph)
    unfused_baseline: CostReport | None  # SVD factors (every op) as separate AWS-kernel GEMMs

    @property
    def _user_graph(self) -> bool:
        return self.compiled.workload.kind == "graph"

    @property
    def baseline_label(self) -> str:
        return "per-op kernels, lhs pre-transposed" if self._user_graph else "dense (AWS kernels)"

    @property
    def unfused_label(self) -> str:
        return "per-op kernels (AWS GEMMs)" if self._user_graph else "SVD factors unfused (AWS kernels)"

    @property
    def speedup_labels(self) -> tuple[str, str]:
        """How the two speedups are named: (vs the baseline, vs the unfused baseline)."""
        if self._user_graph:
            return "pre-transposed per-op kernels", "per-op kernels"
        return "dense", "unfused SVD"

    @property
    def speedup_vs_baseline(self) -> float | None:
        return _speedup(self.baseline, self.compiled.cost)

    @property
    def speedup_vs_unfused(self) -> float | None:
        return _speedup(self.unfused_baseline, self.compiled.cost)


def _speedup(baseline: CostReport | None, cost: CostReport) -> float | None:
    if baseline is None or not baseline.feasible:
        return None
    return baseline.latency_us / cost.latency_us


def baselines(workload: Workload, target: Target) -> tuple[CostReport | None, CostReport | None]:
    """(dense baseline, unfused baseline) of a fused workload, as the NeuronMM paper measures them.

    A user's graph is its own dense graph: its baselines run every op as its own kernel, AWS's GEMM
    per matmul, with left operands given pre-transposed (the favourable case) or row-major. Graphs
    the baselines cannot model (a transpose of a computed value) get None."""
    if workload.kind == "graph":
        graph = run_pipeline(workload.graph(), "canonicalize,fold-transposes,canonicalize").graph
        try:
            return unfused_cost(graph, target, lhs_layout="km"), unfused_cost(graph, target, lhs_layout="mk")
        except ScheduleError:
            return None, None
    return (unfused_cost(workload.dense_graph(), target, lhs_layout="km"),
            unfused_cost(workload.graph(), target, lhs_layout="mk"))


def _fused_setup(workload: Workload, target: Target) -> tuple[SpaceSpec, Evaluator]:
    """The fused search's space and evaluator (module-level and picklable, for worker processes)."""
    graph = workload.graph()
    tokens = workload.token_count
    lowered_by_mode: dict[str, GraphLowered] = {}

    def cost(schedule: FusedSchedule) -> CostReport:
        if schedule.mlp not in lowered_by_mode:
            lowered_by_mode[schedule.mlp] = lower_graph(graph, schedule.mlp)
        return combine_reports([estimate(p, target) for p in graph_programs(lowered_by_mode[schedule.mlp],
                                                                             schedule, target)])

    space = fused_space(workload)

    def distinct() -> list[FusedSchedule]:
        seen: dict[FusedSchedule, None] = {}
        for point in space.points():
            seen.setdefault(normalize_fused(space.decode(point), tokens), None)
        return list(seen)

    everything = distinct()
    base = FusedSchedule()
    guesses = [replace(base, x_transpose="pe" if tokens < 128 and "pe" in space.candidates["x_transpose"] else "dma"),
               replace(base, cache_weights="stage1", tokens_per_block=512)]
    if "split" in space.candidates["mlp"]:
        guesses.append(replace(base, mlp="split"))
    spec = SpaceSpec(space=space, guesses=guesses, size=len(everything), distinct=lambda: everything)
    return spec, Evaluator(cost, lambda s: normalize_fused(s, tokens))


def tune_graph(workload: Workload, *, target: Target, dialect: str = DEFAULT_DIALECT,
               trials: int = DEFAULT_TRIALS, seed: int = 0, timeout: float | None = None, top_k: int = 5,
               exhaustive_threshold: int = DEFAULT_EXHAUSTIVE_THRESHOLD, method: str | None = None,
               progress: Callable[[int, int, float], None] | None = None, storage: str | None = None,
               study_name: str | None = None, workers: int = 1) -> TunedGraph:
    """Search the fused schedule space with the cost model; compile the winner; cost the baselines.
    ``storage``, ``study_name``, ``workers``: a resumable, shareable search (see :func:`search`)."""
    check_dialect(dialect)
    setup = functools.partial(_fused_setup, workload, target)
    spec, evaluate = setup()
    result = search(spec, evaluate, what=f"{workload.describe()} on {target.label}", trials=trials, seed=seed,
                    timeout=timeout, exhaustive_threshold=exhaustive_threshold, top_k=top_k, force=method,
                    progress=progress, storage=storage, study_name=study_name, workers=workers, setup=setup)
    compiled = compile_graph(workload, target=target, dialect=dialect, schedule=result.best.schedule,
                             schedule_name=f"tuned ({result.method}, seed {seed})")
    return TunedGraph(compiled, result, *baselines(workload, target))



def cost_graph(workload: Workload, *, target: Target, params: Mapping[str, str | int] | None = None
               ) -> tuple[FusedSchedule, list[Program], list[CostReport], CostReport]:
    """The model's figures for one fused schedule, feasible or not (nothing is emitted)."""
    chosen = resolve_fused(workload, None, params, target)
    programs = graph_programs(lower_graph(workload.graph(), chosen.mlp), chosen, target)
    costs = [estimate(p, target) for p in programs]
    return chosen, programs, costs, combine_reports(costs)

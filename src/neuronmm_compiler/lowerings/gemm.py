"""The ``gemm`` lowering: one GEMM kernel ``C[M,N] = A[M,K] @ B[K,N]`` under a :class:`GemmSchedule`.

The canonical graph (after canonicalize and fold-transposes) is recognized as a :class:`GemmProblem`
and lowered by :func:`~neuronmm_compiler.schedule.lower_gemm.lower_gemm`. The four kernels of AWS's
NKI matmul tutorial are presets; a tuned kernel is compared with AWS's fully optimized kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..cost_model import COST_MODEL_VERSION, CostReport, estimate
from ..cost_model.footprint import GEMM_ADVICE
from ..errors import ScheduleError
from ..ir import Graph
from ..passes import DEFAULT_PIPELINE, Pass, parse_pipeline
from ..schedule import DEFAULT_PRESET, PRESETS, GemmProblem, GemmSchedule, Program, lower_gemm, normalize, preset
from ..schedule.gemm import check_ranges, preset_doc
from ..targets import Target
from ..workloads import GemmWorkload, Workload
from .base import Baseline, Lowering

if TYPE_CHECKING:
    from ..cost_model.footprint import Footprint
    from ..search import SearchSpace
    from ..search.tuner import Evaluator, SpaceSpec

#: The tuned GEMM's baseline: AWS's tutorial kernel a user would otherwise run.
BASELINE_PRESET = "aws-fully-optimized"


def gemm_problem_from_graph(graph: Graph) -> GemmProblem:
    """Recognize a single GEMM ``output(matmul(input, input))`` in a canonicalized graph."""
    nodes = graph.nodes()
    matmuls = [n for n in nodes if n.kind == "matmul"]
    others = [n for n in nodes if n.kind not in ("input", "output", "matmul")]
    outputs = graph.outputs()
    if len(matmuls) != 1 or others or len(outputs) != 1 or outputs[0].operands[0] != matmuls[0].id:
        raise ScheduleError(
            f"graph {graph.name!r} is not a single GEMM (one matmul of two inputs into one output); "
            "only GEMM graphs can be lowered so far"
        )
    mm = matmuls[0]
    lhs, rhs = (graph.node(o) for o in mm.operands)
    if lhs.kind != "input" or rhs.kind != "input":
        raise ScheduleError("the GEMM's operands must be kernel inputs after the pass pipeline")
    if rhs.attrs.get("layout", "row_major") != "row_major":
        raise ScheduleError("B must be stored row-major [K, N]")
    (m, k), n = lhs.shape, rhs.shape[1]
    layout = "km" if lhs.attrs.get("layout") == "transposed" else "mk"
    return GemmProblem(m, n, k, dtype=lhs.dtype, a_layout=layout)


def _problem(workload: Workload) -> GemmProblem:
    assert isinstance(workload, GemmWorkload), workload
    return workload.problem()


class GemmLowering(Lowering):
    kind: ClassVar[str] = "gemm"
    schedule_class: ClassVar[type] = GemmSchedule
    default_schedule_name: ClassVar[str] = DEFAULT_PRESET
    exhaustive_threshold: ClassVar[int] = 1000
    fit_advice: ClassVar[tuple[str, str]] = GEMM_ADVICE

    def accepts(self, workload: Workload) -> bool:
        return isinstance(workload, GemmWorkload)

    def presets(self, workload: Workload) -> Mapping[str, str]:
        return {name: preset_doc(name) for name in PRESETS}

    def resolve(self, workload: Workload, schedule: Any | None, preset_name: str | None,
                params: Mapping[str, str | int], target: Target) -> GemmSchedule:
        problem = _problem(workload)
        base = schedule if schedule is not None else preset(preset_name or DEFAULT_PRESET, problem)
        chosen = base.with_params(dict(params))
        check_ranges(chosen, target.pmax, target.gemm_stationary_fmax, target.gemm_moving_fmax)
        return normalize(problem, chosen)

    def pipeline(self, schedule: Any) -> list[Pass]:
        return parse_pipeline(DEFAULT_PIPELINE)

    def kernels(self, graph: Graph) -> list[Graph]:
        return [graph]

    def lower(self, kernel: Graph, schedule: Any, target: Target) -> Program:
        return lower_gemm(gemm_problem_from_graph(kernel), schedule, target)

    def summary(self, workload: Workload, schedule_name: str, schedule: Any, programs: list[Program],
                footprints: list[Footprint], cost: CostReport, target: Target) -> list[tuple[str, str]]:
        return [
            ("problem", workload.describe()),
            ("schedule", schedule_name),
            ("parameters", schedule.describe()),
            ("footprint", footprints[0].describe()),
            ("predicted", f"{cost.latency_us:.1f} us on {target.label} ({cost.bound}-bound; cost model "
                          f"v{COST_MODEL_VERSION}, lower bound {cost.lower_bound_us:.1f} us)"),
        ]

    def space(self, workload: Workload) -> SearchSpace:
        from ..search.space import gemm_space

        return gemm_space(_problem(workload))

    def search_setup(self, workload: Workload, target: Target,
                     exhaustive_threshold: int) -> tuple[SpaceSpec, Evaluator]:
        from ..search import tuner

        return tuner._gemm_setup(_problem(workload), target, None, None, exhaustive_threshold)

    def baselines(self, workload: Workload, target: Target) -> dict[str, Baseline]:
        problem = _problem(workload)
        cost = estimate(lower_gemm(problem, preset(BASELINE_PRESET, problem), target), target)
        return {BASELINE_PRESET: Baseline(BASELINE_PRESET, BASELINE_PRESET, cost)}


def aws_gemm_cost(problem: GemmProblem, target: Target) -> CostReport:
    """AWS's fully optimized kernel; where it does not fit the shape, the first AWS preset that does
    (the per-matmul kernel of the fused workloads' baselines)."""
    for name in (BASELINE_PRESET, *[p for p in PRESETS if p != BASELINE_PRESET]):
        report = estimate(lower_gemm(problem, preset(name, problem), target), target)
        if report.feasible:
            return report
    return report

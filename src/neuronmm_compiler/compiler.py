"""The compiler driver: shape -> graph -> passes -> schedule -> loop nest -> NKI source.

One straight function of named steps (:func:`compile_gemm`), so ``nmmc emit`` and the tests run
exactly the same pipeline, and each intermediate stays inspectable on the result object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .codegen import DEFAULT_DIALECT, KernelFile, check_dialect, emit_kernel
from .cost_model.footprint import Footprint, check_fits
from .errors import ScheduleError
from .ir import Graph, gemm_graph
from .passes import DEFAULT_PIPELINE, parse_pipeline, run_pipeline
from .schedule import DEFAULT_PRESET, GemmProblem, GemmSchedule, Program, lower_gemm, normalize, preset
from .schedule.gemm import check_ranges
from .targets import DEFAULT_TARGET, Target, get_target


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


def resolve_schedule(problem: GemmProblem, schedule_name: str | None,
                     params: Mapping[str, str | int] | None, target: Target) -> GemmSchedule:
    """The preset (default ``aws-fully-optimized``) with ``params`` applied, checked and normalized."""
    base = preset(schedule_name or DEFAULT_PRESET, problem)
    chosen = base.with_params(dict(params or {}))
    check_ranges(chosen, target.pmax, target.gemm_stationary_fmax, target.gemm_moving_fmax)
    return normalize(problem, chosen)


@dataclass
class CompiledKernel:
    """Everything one compilation produced, for printing, emitting and testing."""

    source_graph: Graph
    graph: Graph
    pipeline_steps: list
    problem: GemmProblem
    schedule_name: str
    schedule: GemmSchedule
    program: Program
    footprint: Footprint
    kernel: KernelFile
    target: Target
    dialect: str


def compile_gemm(m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = "mk",
                 target: str | Target = DEFAULT_TARGET, dialect: str = DEFAULT_DIALECT,
                 schedule: str | None = None, params: Mapping[str, str | int] | None = None,
                 pipeline: str = DEFAULT_PIPELINE) -> CompiledKernel:
    """Compile ``C[M,N] = A[M,K] @ B[K,N]`` to an NKI kernel file."""
    tgt = target if isinstance(target, Target) else get_target(target)
    check_dialect(dialect)
    source_graph = gemm_graph(m, n, k, dtype=dtype, a_layout=a_layout)
    result = run_pipeline(source_graph, parse_pipeline(pipeline))
    problem = gemm_problem_from_graph(result.graph)
    schedule_name = schedule or DEFAULT_PRESET
    chosen = resolve_schedule(problem, schedule_name, params, tgt)
    program = lower_gemm(problem, chosen)
    fp = check_fits(program, tgt)
    if params:
        schedule_name += " + " + " ".join(f"{key}={value}" for key, value in sorted(params.items()))
    summary = [
        ("problem", problem.describe()),
        ("schedule", schedule_name),
        ("parameters", chosen.describe()),
        ("footprint", fp.describe()),
    ]
    kernel = emit_kernel(program, result.graph, target=tgt, dialect=dialect, summary=summary,
                         schedule={"name": schedule_name, "params": chosen.as_dict()})
    return CompiledKernel(source_graph, result.graph, list(result.steps), problem, schedule_name, chosen,
                          program, fp, kernel, tgt, dialect)

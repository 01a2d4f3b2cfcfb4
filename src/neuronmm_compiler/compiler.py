"""The compiler driver: shape -> graph -> passes -> schedule -> loop nest -> NKI source.

One straight function of named steps (:func:`compile_gemm`), so ``nmmc emit`` and the tests run
exactly the same pipeline, and each intermediate stays inspectable on the result object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .codegen import DEFAULT_DIALECT, KernelFile, check_dialect, emit_kernel
from .cost_model import COST_MODEL_VERSION, CostReport, estimate
from .cost_model.footprint import Footprint, check_fits
from .errors import ScheduleError
from .ir import Graph, gemm_graph
from .passes import DEFAULT_PIPELINE, parse_pipeline, run_pipeline
from .schedule import DEFAULT_PRESET, GemmProblem, GemmSchedule, Program, lower_gemm, normalize, preset
from .schedule.gemm import check_ranges
from .search import DEFAULT_EXHAUSTIVE_THRESHOLD, DEFAULT_TRIALS, TuneResult, tune_gemm
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


def resolve_schedule(problem: GemmProblem, schedule: str | GemmSchedule | None,
                     params: Mapping[str, str | int] | None, target: Target) -> GemmSchedule:
    """A preset (default ``aws-fully-optimized``) or a given schedule, with ``params`` applied,
    checked against the target's tile limits and normalized to the problem."""
    base = schedule if isinstance(schedule, GemmSchedule) else preset(schedule or DEFAULT_PRESET, problem)
    chosen = base.with_params(dict(params or {}))
    check_ranges(chosen, target.pmax, target.gemm_stationary_fmax, target.gemm_moving_fmax)
    return normalize(problem, chosen)


@dataclass
class Lowered:
    """A GEMM after the frontend and the pass pipeline."""

    source_graph: Graph
    graph: Graph
    pipeline_steps: list
    problem: GemmProblem


def lower_frontend(m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = "mk",
                   pipeline: str = DEFAULT_PIPELINE) -> Lowered:
    """Frontend and passes: ``--shape MxNxK`` to a canonical graph and its GEMM problem."""
    source_graph = gemm_graph(m, n, k, dtype=dtype, a_layout=a_layout)
    result = run_pipeline(source_graph, parse_pipeline(pipeline))
    return Lowered(source_graph, result.graph, list(result.steps), gemm_problem_from_graph(result.graph))


@dataclass
class CompiledKernel:
    """Everything one compilation produced, for printing, emitting and testing."""

    lowered: Lowered
    schedule_name: str
    schedule: GemmSchedule
    program: Program
    footprint: Footprint
    cost: CostReport
    kernel: KernelFile
    target: Target
    dialect: str

    @property
    def problem(self) -> GemmProblem:
        return self.lowered.problem


def compile_lowered(lowered: Lowered, *, target: Target, dialect: str = DEFAULT_DIALECT,
                    schedule: str | GemmSchedule | None = None, params: Mapping[str, str | int] | None = None,
                    schedule_name: str | None = None) -> CompiledKernel:
    """Schedule, lower, cost and print a lowered GEMM."""
    check_dialect(dialect)
    problem = lowered.problem
    chosen = resolve_schedule(problem, schedule, params, target)
    name = schedule_name or (schedule if isinstance(schedule, str) else None) or (
        "custom" if isinstance(schedule, GemmSchedule) else DEFAULT_PRESET)
    if params:
        name += " + " + " ".join(f"{key}={value}" for key, value in sorted(params.items()))
    program = lower_gemm(problem, chosen, target)
    fp = check_fits(program, target)
    cost = estimate(program, target)
    summary = [
        ("problem", problem.describe()),
        ("schedule", name),
        ("parameters", chosen.describe()),
        ("footprint", fp.describe()),
        ("predicted", f"{cost.latency_us:.1f} us on {target.label} ({cost.bound}-bound; cost model "
                      f"v{COST_MODEL_VERSION}, lower bound {cost.lower_bound_us:.1f} us)"),
    ]
    kernel = emit_kernel(program, lowered.graph, target=target, dialect=dialect, summary=summary,
                         schedule={"name": name, "params": chosen.as_dict()})
    return CompiledKernel(lowered, name, chosen, program, fp, cost, kernel, target, dialect)


def compile_gemm(m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = "mk",
                 target: str | Target = DEFAULT_TARGET, dialect: str = DEFAULT_DIALECT,
                 schedule: str | GemmSchedule | None = None, params: Mapping[str, str | int] | None = None,
                 pipeline: str = DEFAULT_PIPELINE) -> CompiledKernel:
    """Compile ``C[M,N] = A[M,K] @ B[K,N]`` to an NKI kernel file under a preset or schedule."""
    tgt = target if isinstance(target, Target) else get_target(target)
    check_dialect(dialect)
    lowered = lower_frontend(m, n, k, dtype=dtype, a_layout=a_layout, pipeline=pipeline)
    return compile_lowered(lowered, target=tgt, dialect=dialect, schedule=schedule, params=params)


@dataclass
class Tuned:
    """A tuned kernel and how it compares with AWS's fully optimized kernel at the same shape."""

    compiled: CompiledKernel
    search: TuneResult
    baseline: CostReport

    @property
    def speedup_vs_baseline(self) -> float | None:
        if not self.baseline.feasible:
            return None
        return self.baseline.latency_us / self.compiled.cost.latency_us


def tune(m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = "mk",
         target: str | Target = DEFAULT_TARGET, dialect: str = DEFAULT_DIALECT, trials: int = DEFAULT_TRIALS,
         seed: int = 0, timeout: float | None = None, top_k: int = 5,
         exhaustive_threshold: int = DEFAULT_EXHAUSTIVE_THRESHOLD, method: str | None = None,
         progress: Callable[[int, int, float], None] | None = None, storage: str | None = None,
         study_name: str | None = None, workers: int = 1) -> Tuned:
    """Search the schedule space with the cost model and compile the winner (``storage``,
    ``study_name``, ``workers``: a resumable, shareable search, see :func:`search.tuner.search`)."""
    tgt = target if isinstance(target, Target) else get_target(target)
    check_dialect(dialect)
    lowered = lower_frontend(m, n, k, dtype=dtype, a_layout=a_layout)
    problem = lowered.problem
    result = tune_gemm(problem, tgt, trials=trials, seed=seed, timeout=timeout, top_k=top_k,
                       exhaustive_threshold=exhaustive_threshold, force=method, progress=progress,
                       storage=storage, study_name=study_name, workers=workers)
    compiled = compile_lowered(lowered, target=tgt, dialect=dialect, schedule=result.best.schedule,
                               schedule_name=f"tuned ({result.method}, seed {seed})")
    baseline = estimate(lower_gemm(problem, preset("aws-fully-optimized", problem), tgt), tgt)
    return Tuned(compiled, result, baseline)

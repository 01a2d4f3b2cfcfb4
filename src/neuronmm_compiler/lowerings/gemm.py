"""The ``gemm`` lowering: one GEMM kernel ``C[M,N] = A[M,K] @ B[K,N]`` under a :class:`GemmSchedule`.

The canonical graph (after canonicalize and fold-transposes) is recognized as a :class:`GemmProblem`
and lowered by :func:`~neuronmm_compiler.lowerings.lower_gemm.lower_gemm`. The four kernels of AWS's
NKI matmul tutorial are presets; a tuned kernel is compared with AWS's fully optimized kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..cost_model import COST_MODEL_VERSION, CostReport, estimate
from ..cost_model.footprint import GEMM_ADVICE
from ..errors import ScheduleError
from ..frontends.workloads import GemmWorkload, Workload
from ..ir import Graph
from ..kernel_ir.program import Program
from ..passes import DEFAULT_PIPELINE, Pass, parse_pipeline
from ..schedule import DEFAULT_PRESET, PRESETS, GemmProblem, GemmSchedule, preset
from ..schedule.gemm import NORMALIZED_PARAMS, normalize_on, preset_doc
from ..schedule.params import check_column_tiles, check_schedule, column_tile_candidates
from ..search import DEFAULT_EXHAUSTIVE_THRESHOLD, Evaluator, SearchSpace, SpaceSpec, TuneResult, search
from ..targets import ModelParams, Target, with_lnc
from ..vocab import ALayout, Dialect, Layout, NodeKind
from .base import Baseline, Lowering, aws_baseline, resolve_split, split_restriction, transpose_choice
from .lower_gemm import lower_gemm

if TYPE_CHECKING:
    from ..cost_model.footprint import Footprint

#: The tuned GEMM's baseline: AWS's tutorial kernel a user would otherwise run.
BASELINE_PRESET = "aws-fully-optimized"


def gemm_problem_from_graph(graph: Graph) -> GemmProblem:
    """Recognize a single GEMM ``output(matmul(input, input))`` in a canonicalized graph."""
    nodes = graph.nodes()
    matmuls = [n for n in nodes if n.kind == NodeKind.MATMUL]
    others = [n for n in nodes if n.kind not in (NodeKind.INPUT, NodeKind.OUTPUT, NodeKind.MATMUL)]
    outputs = graph.outputs()
    if len(matmuls) != 1 or others or len(outputs) != 1 or outputs[0].operands[0] != matmuls[0].id:
        raise ScheduleError(
            f"graph {graph.name!r} is not a single GEMM (one matmul of two inputs into one output); "
            "only GEMM graphs can be lowered so far"
        )
    mm = matmuls[0]
    lhs, rhs = (graph.node(o) for o in mm.operands)
    if lhs.kind != NodeKind.INPUT or rhs.kind != NodeKind.INPUT:
        raise ScheduleError("the GEMM's operands must be kernel inputs after the pass pipeline")
    if rhs.layout != Layout.ROW_MAJOR:
        raise ScheduleError("B must be stored row-major [K, N]")
    (m, k), n = lhs.shape, rhs.shape[1]
    return GemmProblem(m, n, k, dtype=lhs.dtype, a_layout=ALayout.of(lhs.layout or Layout.ROW_MAJOR))


def _problem(workload: Workload) -> GemmProblem:
    assert isinstance(workload, GemmWorkload), workload
    return workload.problem()


#: A GEMM search's default Optuna trials (nmmc tune --trials; a fused search keeps search.DEFAULT_TRIALS, 150): the
#: polish from the best schedule of each of eight structural classes mostly ends where it ends after 150 trials, in 30%
#: less search time. Measured over the GEMMs of benchmarks/search_quality.py and benchmarks/tune_speed.py on trn1,
#: trn2 and trn3 (LNC 1 and 2): the same schedule at 102 of 104 points, 0.2% slower at two; 75 trials missed by up to
#: 2.3% (benchmarks/results/gemm-trials-2026-12-07.txt; against exhaustive enumeration: search-quality-2026-12-07.txt)
GEMM_TRIALS = 100


class GemmLowering(Lowering):
    kind: ClassVar[str] = "gemm"
    schedule_class: ClassVar[type] = GemmSchedule
    default_schedule_name: ClassVar[str] = DEFAULT_PRESET
    exhaustive_threshold: ClassVar[int] = 1000
    default_trials: ClassVar[int] = GEMM_TRIALS
    fit_advice: ClassVar[tuple[str, str]] = GEMM_ADVICE

    def accepts(self, workload: Workload) -> bool:
        return isinstance(workload, GemmWorkload) and workload.mx is None  # an MX GEMM is a fused kernel (docs/mx.md)

    def presets(self, workload: Workload) -> Mapping[str, str]:
        return {name: preset_doc(name) for name in PRESETS}

    def resolve(self, workload: Workload, schedule: Any | None, preset_name: str | None,
                params: Mapping[str, str | int], target: Target, dialect: Dialect) -> GemmSchedule:
        problem = _problem(workload)
        base = schedule if schedule is not None else preset(preset_name or DEFAULT_PRESET, problem)
        if problem.a_layout == ALayout.MK:
            base = base.with_params(transpose_choice("a_transpose", schedule, params, workload, target, dialect))
        chosen = base.with_params(dict(params))
        check_schedule(chosen, target)
        check_column_tiles(chosen.column_tiles, target)
        normalized = normalize_on(problem, chosen, target)
        return resolve_split(normalized, params, target, lambda s: [lower_gemm(problem, s, target)])

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
                          f"v{COST_MODEL_VERSION}, lower bound {cost.lower_bound_us:.1f} us; {target.launch_summary})"),
        ]

    def space(self, workload: Workload, dma_transpose: bool = True, lnc: int = 1, exchange: bool = True) -> SearchSpace:
        return gemm_space(_problem(workload), dma_transpose, lnc)

    def search_setup(self, workload: Workload, target: Target, exhaustive_threshold: int,
                     dma_transpose: bool = True, exchange: bool = True) -> tuple[SpaceSpec, Evaluator]:
        problem = _problem(workload)
        return gemm_search_setup(problem, target, exhaustive_threshold,
                                 space=gemm_space(problem, dma_transpose, target.lnc, target.max_column_tiles))

    def baselines(self, workload: Workload, target: Target, dma_transpose: bool = True) -> dict[str, Baseline]:
        problem = _problem(workload)
        one_core = with_lnc(target, 1)  # AWS's tutorial kernel runs on one physical core
        cost = estimate(lower_gemm(problem, aws_preset(BASELINE_PRESET, problem, dma_transpose), one_core), one_core)
        return {BASELINE_PRESET: aws_baseline(BASELINE_PRESET, BASELINE_PRESET, cost, target)}


def aws_preset(name: str, problem: GemmProblem, dma_transpose: bool = True) -> GemmSchedule:
    """An AWS preset for ``problem``, making A^T on the TensorEngine where a transposing DMA load is not
    documented (``dma_transpose`` False and A stored [M, K])."""
    schedule = preset(name, problem)
    if not dma_transpose and problem.a_layout == ALayout.MK:
        schedule = schedule.with_params({"a_transpose": "pe"})
    return schedule


def aws_gemm_cost(problem: GemmProblem, target: Target, dma_transpose: bool = True) -> CostReport:
    """AWS's fully optimized kernel; where it does not fit the shape, the first AWS preset that does
    (the per-matmul kernel of the fused workloads' baselines). On one physical core, as AWS publishes it."""
    target = with_lnc(target, 1)
    for name in (BASELINE_PRESET, *[p for p in PRESETS if p != BASELINE_PRESET]):
        report = estimate(lower_gemm(problem, aws_preset(name, problem, dma_transpose), target), target)
        if report.feasible:
            return report
    return report


# ----------------------------------------------------------------------------- the GEMM search space


def gemm_space(problem: GemmProblem, dma_transpose: bool = True, lnc: int = 1, max_column_tiles: int = 4
               ) -> SearchSpace:
    """The GEMM search space of a problem: A^T made only by DMA when A is stored [K, M] (a plain load), only on
    the TensorEngine when a transposing DMA load is not documented (``dma_transpose`` False); the M or N split
    on an LNC=2 target (``lnc``); PE column tiles where M is at most half the array, up to ``max_column_tiles``
    (the target's)."""
    restrict: dict[str, tuple] = split_restriction(GemmSchedule, lnc)
    restrict["column_tiles"] = column_tile_candidates(problem.m, max_column_tiles)
    if problem.a_layout != ALayout.MK:
        restrict["a_transpose"] = ("dma",)
    elif not dma_transpose:
        restrict["a_transpose"] = ("pe",)
    return SearchSpace.for_schedule(GemmSchedule, restrict)


#: The parameters that collapse together when the space's distinct schedules are counted
#: (``SearchSpace.distinct_size``): the numeric ones, ``accumulate`` (PE column tiles apply only to output tiles
#: accumulated in PSUM) and ``lnc_split`` (the divided dimension's tiles and blocks). The other categorical ones never
#: collapse (``loop_order`` changes only ``operand_buffers``, which is not searched); tests/test_schedule_space.py
#: checks the count against the walk.
COUNTED_PARAMS = ("tile_m", "tile_n", "tile_k", "tiles_in_block_m", "tiles_in_block_n", "tiles_in_block_k",
                  "operand_buffers", "psum_buffers", "column_tiles", "accumulate", "lnc_split")


def heuristic_guesses(problem: GemmProblem, space: SearchSpace) -> list[GemmSchedule]:
    """Closed-form starting points, enqueued as the first trials.

    NeuronMM's rule for a cached strip: make the stationary block (M) large so the moving operand
    (B) is streamed from HBM once, with K blocked to bound SBUF and rows coalesced into long DMAs;
    for decode-sized M, transpose A on the TensorEngine from one long row load rather than with
    many 2-byte-per-partition DMAs. Around that rule, a small grid of the structures that win in
    practice (PSUM accumulation with K inside, SBUF partial sums with K outside M; moderate and
    large M blocks; both A^T strategies), then AWS's fully optimized parameters. The grid costs a
    few dozen evaluations and keeps TPE from settling in a poor basin on large shapes.
    """
    transposes = [t for t in ("pe", "dma") if t in space.candidates["a_transpose"]]
    grid = [
        GemmSchedule(tiles_in_block_m=bm, tiles_in_block_n=bn, tiles_in_block_k=bk, loop_order=order,
                     accumulate=acc, dma="row", a_transpose=a_t)
        for a_t in transposes
        for order, acc in (("kmn", "psum"), ("mnk", "psum"), ("nkm", "sbuf"))
        for bm, bn, bk in ((4, 4, 16), (16, 2, 8), (4, 2, 8))
    ]
    guesses = []
    splits = space.candidates["lnc_split"]
    for sched in (replace(g, lnc_split=split) for g in (*grid, preset("aws-fully-optimized", problem))
                  for split in splits):
        point = space.point_of(sched)
        if point is not None:
            decoded = space.decode(point)
            if decoded not in guesses:
                guesses.append(decoded)
    return guesses


def gemm_search_setup(problem: GemmProblem, target: Target, exhaustive_threshold: int = DEFAULT_EXHAUSTIVE_THRESHOLD,
                      *, params: ModelParams | None = None,
                      space: SearchSpace | None = None) -> tuple[SpaceSpec, Evaluator]:
    """The GEMM search's space and evaluator (module-level and picklable, for worker processes);
    ``params`` overrides the target's cost-model parameters, ``space`` the default space."""
    space = space or gemm_space(problem, max_column_tiles=target.max_column_tiles)

    def normalized(schedule: GemmSchedule) -> GemmSchedule:  # as the evaluator compares schedules, on the target
        return normalize_on(problem, schedule, target)

    size = space.distinct_size(normalized, COUNTED_PARAMS)
    spec = SpaceSpec(
        space=space, guesses=heuristic_guesses(problem, space), size=size,
        distinct=lambda: (space.distinct(normalized, NORMALIZED_PARAMS) if size <= 20 * exhaustive_threshold
                          else (space.decode(p) for p in space.points())),
    )
    evaluate = Evaluator(lambda s: estimate(lower_gemm(problem, s, target), target, params), normalized)
    return spec, evaluate


def tune_gemm(problem: GemmProblem, target: Target, *, exhaustive_threshold: int = DEFAULT_EXHAUSTIVE_THRESHOLD,
              params: ModelParams | None = None, space: SearchSpace | None = None,
              **search_options: Any) -> TuneResult:
    """Only the search of a GEMM's schedule (no kernel, no baselines; :func:`driver.tune` does the
    whole): ``search_options`` as :func:`search.tuner.search` takes them."""
    setup = functools.partial(gemm_search_setup, problem, target, exhaustive_threshold, params=params, space=space)
    spec, evaluate = setup()
    return search(spec, evaluate, what=f"{problem.describe()} on {target.label}",
                  exhaustive_threshold=exhaustive_threshold, setup=setup, **search_options)

"""The compiler driver: one path from a workload to a kernel file, for every kind of workload.

    workload ──> lowering entry (lowerings.lowering_for) ──> schedule (preset / given / tuned)
             ──> pass pipeline (the entry's, or --pipeline) ──> kernel split ──> one program per kernel
             ──> footprint check, cost ──> NKI source (codegen.emit_kernel)

:func:`compile_workload` runs it for one schedule, :func:`tune` searches the entry's schedule space
first, :func:`recompile` rebuilds a stored decision (a cache hit, a lock entry), and
:func:`cost_workload` stops before the footprint check and codegen. Nothing here knows what kind
of workload it compiles: the entry (:class:`~.lowerings.base.Lowering`) supplies the pipeline, the
lowering of a kernel, the header, the search space and the baselines.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .codegen import KernelFile, emit_kernel
from .cost_model import CostReport, combine_reports, estimate
from .cost_model.footprint import Footprint, check_fits
from .errors import InputError, NmmcError, ScheduleError
from .frontends.workloads import Workload
from .ir import Graph
from .jobs import Job, SearchSettings, platform_dialect, resolve
from .kernel_ir.program import DmaCopy, Program, walk
from .lowerings import Baseline, Lowering, lowering_for, lowering_named
from .lowerings.base import undocumented_dma_transpose
from .passes import Pass, PipelineStep, parse_pipeline, run_pipeline
from .schedule.params import check_schedule
from .search import Candidate, TuneResult, search
from .targets import Target
from .vocab import Dialect

if TYPE_CHECKING:
    from .artifacts.cache import ResultCache



@dataclass
class Lowered:
    """A workload's graph after the pass pipeline, cut into kernels."""

    workload: Workload
    source_graph: Graph
    graph: Graph
    pipeline_steps: list[PipelineStep]
    kernels: list[Graph]


def lower_graph(workload: Workload, lowering: Lowering, schedule: Any,
                pipeline: Sequence[Pass] | str | None = None) -> Lowered:
    """Run the pipeline (the entry's for ``schedule`` unless one is given) and split into kernels."""
    source = workload.graph()
    passes = lowering.pipeline(schedule) if pipeline is None else pipeline
    result = run_pipeline(source, parse_pipeline(passes) if isinstance(passes, str) else passes)
    return Lowered(workload, source, result.graph, list(result.steps), lowering.kernels(result.graph))


def lower_programs(lowering: Lowering, lowered: Lowered, schedule: Any, target: Target) -> list[Program]:
    """Every kernel of ``lowered`` as a loop-nest program under ``schedule``."""
    return [lowering.lower(kernel, schedule, target) for kernel in lowered.kernels]


def check_transposing_loads(programs: list[Program], workload: Workload, target: Target, dialect: Dialect) -> None:
    """ScheduleError when a program loads with a transposing DMA where the dialect does not document one
    (a weight or an operand stored transposed in HBM; A^T / X^T are the schedule's own choice and are
    already made on the TensorEngine there): the rule, the tensor and what to do instead."""
    rule = undocumented_dma_transpose(workload, target, dialect)
    if rule is None:
        return
    for program in programs:
        for stmt, _ in walk(program.body):
            if isinstance(stmt, DmaCopy) and stmt.transpose:
                raise ScheduleError(
                    f"{stmt.src.buffer.name!r} is stored transposed in HBM and is read with a transposing DMA load, "
                    f"which the {dialect} dialect does not document for {workload.dtype} on {target.name} ({rule}, "
                    "docs/nki-rules.md); store it row-major, or use --dialect neuronxcc (nl.load_transpose2d)")


def check_hbm(programs: list[Program], target: Target) -> None:
    """ScheduleError when the HBM tensors of all kernels (graph inputs and outputs, and the values
    kernels hand each other) do not fit the target's HBM per core at once."""
    arrays = {b.name: b for p in programs for b in (*p.params, *p.outputs)}
    needed = sum(b.itemsize * math.prod(b.shape) for b in arrays.values())
    if needed > target.hbm_bytes_per_launch:
        raise ScheduleError(f"the kernels' HBM tensors (inputs, outputs and values handed between kernels) need "
                            f"{needed / 2**30:.1f} GiB; {target.core_label} has "
                            f"{target.hbm_bytes_per_launch / 2**30:.1f} GiB")


@dataclass
class Compiled:
    """Everything one compilation produced, for printing, emitting and testing."""

    workload: Workload
    lowering: Lowering
    lowered: Lowered
    schedule_name: str
    schedule: Any
    programs: list[Program]
    footprints: list[Footprint]
    kernel_costs: list[CostReport]
    cost: CostReport
    kernel: KernelFile
    target: Target
    dialect: str
    sdk: str  # the Neuron SDK release the kernel was emitted for (the job's)

    @property
    def kind(self) -> str:
        """The lowering entry's name (recorded with stored schedules)."""
        return self.lowering.kind

    @property
    def program(self) -> Program:
        """The program of a one-kernel compilation."""
        if len(self.programs) != 1:
            raise ValueError(f"{len(self.programs)} kernels; use .programs")
        return self.programs[0]


def _name(lowering: Lowering, schedule: Any | None, preset: str | None, params: Mapping[str, Any],
          schedule_name: str | None) -> str:
    name = schedule_name or preset or ("custom" if schedule is not None else lowering.default_schedule_name)
    if params:
        name += " + " + " ".join(f"{key}={value}" for key, value in sorted(params.items()))
    return name


def compile_workload(workload: Workload, *, target: Target, dialect: str | None = None, sdk: str | None = None,
                     schedule: Any | None = None, preset: str | None = None,
                     params: Mapping[str, str | int] | None = None, schedule_name: str | None = None,
                     pipeline: Sequence[Pass] | str | None = None) -> Compiled:
    """Compile ``workload`` under a schedule (a given one, a preset, or the entry's default) with
    ``params`` overrides, for Neuron SDK release ``sdk`` (None: the newest of the dialect on the target): lower, check
    it fits on chip and in HBM, cost and print it."""
    return compile_job(resolve(workload, target, dialect, sdk), schedule=schedule, preset=preset, params=params,
                       schedule_name=schedule_name, pipeline=pipeline)


def compile_job(job: Job, *, schedule: Any | None = None, preset: str | None = None,
                params: Mapping[str, str | int] | None = None, schedule_name: str | None = None,
                pipeline: Sequence[Pass] | str | None = None) -> Compiled:
    """:func:`compile_workload` of a resolved job."""
    workload, target, dialect, lowering = job.workload, job.target, job.dialect, job.lowering
    params = dict(params or {})
    chosen = lowering.resolve(workload, schedule, preset, params, target, dialect)
    lowered = lower_graph(workload, lowering, chosen, pipeline)
    programs = lower_programs(lowering, lowered, chosen, target)
    check_transposing_loads(programs, workload, target, dialect)
    check_hbm(programs, target)
    footprints = [check_fits(p, target, lowering.fit_advice) for p in programs]
    costs = [estimate(p, target) for p in programs]
    total = combine_reports(costs)
    name = _name(lowering, schedule, preset, params, schedule_name)
    summary = lowering.summary(workload, name, chosen, programs, footprints, total, target)
    kernel = emit_kernel(programs, lowered.graph, target=target, dialect=dialect, sdk=job.sdk, summary=summary,
                         schedule={"kind": lowering.kind, "name": name, "params": chosen.as_dict()})
    return Compiled(workload, lowering, lowered, name, chosen, programs, footprints, costs, total, kernel, target,
                    dialect, job.sdk)


@dataclass
class Costed:
    """The model's figures for one schedule, feasible or not (nothing checked, nothing emitted)."""

    schedule_name: str
    schedule: Any
    programs: list[Program]
    kernel_costs: list[CostReport]
    cost: CostReport


def cost_workload(workload: Workload, *, target: Target, preset: str | None = None,
                  params: Mapping[str, str | int] | None = None,
                  pipeline: Sequence[Pass] | str | None = None, dialect: str | None = None) -> Costed:
    """What ``nmmc cost`` prints: the schedule's programs and costs, whether or not it fits (``dialect``
    decides only what the schedule may emit, e.g. whether A^T may be a transposing DMA load)."""
    lowering = lowering_for(workload)
    chosen = lowering.resolve(workload, None, preset, dict(params or {}), target, platform_dialect(dialect, target))
    programs = lower_programs(lowering, lower_graph(workload, lowering, chosen, pipeline), chosen, target)
    costs = [estimate(p, target) for p in programs]
    return Costed(preset or lowering.default_schedule_name, chosen, programs, costs, combine_reports(costs))


# ----------------------------------------------------------------------------- stored schedules


def stored_schedule(kind: str, params: Mapping[str, Any], target: Target) -> tuple[Lowering, Any]:
    """The schedule a stored decision (cache record, lock entry, kernel metadata) names: its
    lowering entry and the schedule, every parameter checked against its domain and the target
    (InputError when a parameter is unknown, mistyped or out of range)."""
    lowering = lowering_named(kind)
    try:
        schedule = lowering.schedule_class().with_params(dict(params))
        check_schedule(schedule, target)
    except NmmcError as exc:
        raise InputError(f"stored {kind} schedule: {exc}") from None
    return lowering, schedule


def recompile(job: Job, kind: str, params: Mapping[str, Any], *, schedule_name: str) -> Compiled:
    """Rebuild a stored decision for the job's workload: the same schedule under the same name compiles
    to the byte-identical file the search wrote (codegen is cheap; only decisions are stored)."""
    lowering, schedule = stored_schedule(kind, params, job.target)
    if lowering is not job.lowering:
        raise InputError(f"a {kind} schedule does not apply to a {job.workload.kind} workload")
    return compile_job(job, schedule=schedule, schedule_name=schedule_name)


def relower(graph: Graph, kind: str, params: Mapping[str, Any], target: Target) -> list[Program]:
    """The programs of an emitted file: its post-pipeline graph (from the metadata) lowered under
    its stored schedule, as :func:`compile_workload` lowered it."""
    lowering, schedule = stored_schedule(kind, params, target)
    return [lowering.lower(kernel, schedule, target) for kernel in lowering.kernels(graph)]


# ----------------------------------------------------------------------------- tuning


@dataclass
class Tuned:
    """A tuned kernel, its search, and the alternatives it is compared with (by name)."""

    compiled: Compiled
    search: TuneResult
    baselines: dict[str, Baseline]

    def speedups(self) -> dict[str, float | None]:
        """Speedup over each baseline (None where it is not modelled or does not fit)."""
        return {name: b.speedup(self.compiled.cost) for name, b in self.baselines.items()}


def tune(workload: Workload, *, target: Target, dialect: str | None = None, sdk: str | None = None,
         **settings: Any) -> Tuned:
    """:func:`tune_job` of ``workload`` resolved for ``target``, ``dialect`` and Neuron SDK release ``sdk``, with
    :class:`SearchSettings` ``settings`` (trials, seed, method, ...)."""
    return tune_job(resolve(workload, target, dialect, sdk), SearchSettings(**settings))


def tune_job(job: Job, settings: SearchSettings) -> Tuned:
    """Search the workload's schedule space with the cost model, compile the winner, cost the baselines."""
    workload, target, lowering = job.workload, job.target, job.lowering
    if not job.dma_transpose:  # fail before the search when no schedule can be emitted in this dialect
        default = lowering.resolve(workload, None, None, {}, target, job.dialect)
        check_transposing_loads(lower_programs(lowering, lower_graph(workload, lowering, default), default, target),
                                workload, target, job.dialect)
    threshold = settings.threshold(lowering)
    setup = functools.partial(lowering.search_setup, workload, target, threshold, job.dma_transpose,
                              exchange=job.dialect == Dialect.NKI)
    spec, evaluate = setup()
    result = search(spec, evaluate, what=f"{workload.describe()} on {target.label}",
                    trials=settings.trials_for(lowering), seed=settings.seed, timeout=settings.timeout,
                    exhaustive_threshold=threshold, top_k=settings.top_k, force=settings.method,
                    progress=settings.progress, storage=settings.storage, study_name=settings.study_name,
                    workers=settings.workers, setup=setup, processes=settings.processes)
    compiled = compile_job(job, schedule=result.best.schedule,
                           schedule_name=f"tuned ({result.method}, seed {settings.seed})")
    return Tuned(compiled, result, lowering.baselines(workload, target, job.dma_transpose))


def _cache_key(job: Job, settings: SearchSettings) -> str:
    """The result-cache key of a search request (see :func:`search_fingerprint`)."""
    from .artifacts.cache import cache_key

    return cache_key(job.graph, target=job.target, dialect=job.dialect, kind=job.lowering.kind,
                     search=search_fingerprint(job, settings), sdk=job.sdk)


def search_fingerprint(job: Job, settings: SearchSettings) -> dict[str, str]:
    """What a search's outcome depends on besides the graph, target, dialect and SDK release: the request
    (method, trials, seed, exhaustive threshold) and a fingerprint of the schedule space."""
    lowering = job.lowering
    space = lowering.space(job.workload, job.dma_transpose)
    text = json.dumps({"schedule": lowering.schedule_class.__name__,
                       "candidates": {name: list(values) for name, values in space.candidates.items()}},
                      sort_keys=True, default=str)
    return {"method": settings.method or "auto", "trials": str(settings.trials_for(lowering)),
            "seed": str(settings.seed),
            "exhaustive_threshold": str(settings.threshold(lowering)),
            "space": hashlib.sha256(text.encode()).hexdigest()[:16]}


def tune_cached(job: Job, settings: SearchSettings, cache: ResultCache | None, *,
                store: bool = True) -> tuple[Tuned, bool]:
    """(tuned, answered_from_cache): :func:`tune_job`, answered from the result cache when the same
    request (graph, target, dialect, SDK release, search settings, schedule space) was tuned before.

    A search cut short by a ``timeout`` depends on the machine's speed, so it is neither answered
    from nor stored in the cache. With a ``storage`` the cache is not read (the caller asked for
    that study to be run or resumed, and its result is the whole study's), but the outcome is
    still written to it. With ``store=False`` a search's outcome is not written: the caller writes
    it with :func:`store_tuned` once everything else it makes has succeeded (``nmmc tune`` does, so
    a command that fails leaves no cache entry behind)."""
    started = time.perf_counter()
    use_cache = cache is not None and settings.timeout is None
    if use_cache:
        key = _cache_key(job, settings)
        record = cache.get(key) if settings.storage is None else None  # type: ignore[union-attr]
        if record is not None:
            try:
                compiled = recompile(job, record.kind, record.params, schedule_name=record.schedule_name)
            except NmmcError as exc:  # a hand-edited or stale entry: ignored like any unusable one
                cache.warnings.append(f"ignoring cache file {cache.path(key)}: {exc}")  # type: ignore[union-attr]
                record = None
        if record is not None:
            best = Candidate(compiled.schedule, compiled.cost)
            result = TuneResult(best=best, top=[best], method="cache", trials=0, evaluated=0, feasible=0,
                                space_size=int(record.search.get("space_size", 0)),
                                seconds=time.perf_counter() - started)
            return Tuned(compiled, result, job.lowering.baselines(job.workload, job.target, job.dma_transpose)), True
    tuned = tune_job(job, settings)
    if use_cache and store:
        store_tuned(job, tuned, settings, cache)  # type: ignore[arg-type]
    return tuned, False


def store_tuned(job: Job, tuned: Tuned, settings: SearchSettings, cache: ResultCache, *,
                keep_existing: bool = False) -> bool:
    """Write the decision of a search :func:`tune_cached` ran (with the same job and settings) to
    ``cache``; False when it was not written (a ``timeout`` search is never cached, ``keep_existing`` and the
    cache holds a record of the key already (the search was answered from it), or the cache
    directory cannot be written: then ``cache.warnings`` says why)."""
    from .artifacts.cache import new_record

    if settings.timeout is not None:
        return False
    key = _cache_key(job, settings)
    if keep_existing and cache.get(key) is not None:
        return False
    return cache.put(new_record(job.graph, key=key, target=job.target, dialect=job.dialect, sdk=job.sdk,
                                kind=job.lowering.kind,
                                schedule=tuned.compiled.schedule, schedule_name=tuned.compiled.schedule_name,
                                latency_us=tuned.compiled.cost.latency_us, search=tuned.search.search_summary(),
                                workload=job.workload.describe()))


def named_schedules(workload: Workload, target: Target) -> tuple[list[dict[str, Any]], tuple[Any, ...]]:
    """What ``nmmc schedules`` lists: every named schedule of the workload's lowering (its presets,
    and its default when that is not one of them) with parameters and on-chip footprint, and the
    parameter specs ``--param`` accepts."""
    from .cost_model.footprint import footprint

    lowering = lowering_for(workload)
    presets = lowering.presets(workload)
    named = dict(presets)
    named.setdefault(lowering.default_schedule_name, f"the {lowering.kind} schedule 'nmmc emit' uses without "
                                                     "--schedule or --param")
    rows = []
    for name, description in named.items():
        preset = name if name in presets else None
        costed = cost_workload(workload, target=target, preset=preset)
        fps = [footprint(p, target) for p in costed.programs]
        rows.append({"name": name, "description": description, "params": costed.schedule.as_dict(),
                     "sbuf_bytes_per_partition": max(fp.sbuf_bytes_per_partition for fp in fps),
                     "psum_banks": max(fp.psum_banks for fp in fps), "fits": all(fp.fits for fp in fps)})
    return rows, lowering.schedule_class.SPECS

"""``nmmc tune`` with its result cache: answer a repeated request from the cache, else search and
remember the decision (the schedule, never generated code)."""

from __future__ import annotations

import time
from typing import Any

from .artifacts.cache import CacheRecord, ResultCache, cache_key, cached_schedule, new_record
from .compiler import Tuned, compile_lowered, lower_frontend
from .compiler import tune as tune_gemm_workload
from .cost_model import estimate
from .fused_compiler import TunedGraph, baselines, compile_graph, tune_graph
from .schedule import lower_gemm, preset
from .search import Candidate, TuneResult
from .targets import Target
from .workloads import Workload


def _kind(workload: Workload) -> str:
    return "fused" if workload.fused else "gemm"


def _from_record(workload: Workload, record: CacheRecord, *, target: Target, dialect: str,
                 started: float) -> Tuned | TunedGraph:
    """Recompile the cached schedule (codegen is cheap; only the decision is cached)."""
    schedule = cached_schedule(record)
    # Same schedule, same name: the file is byte-identical to the one the search wrote.
    if workload.fused:
        compiled: Any = compile_graph(workload, target=target, dialect=dialect, schedule=schedule,  # type: ignore[arg-type]
                                      schedule_name=record.schedule_name)
    else:
        lowered = lower_frontend(workload.m, workload.n, workload.k, dtype=workload.dtype, a_layout=workload.a_layout)
        compiled = compile_lowered(lowered, target=target, dialect=dialect, schedule=schedule,  # type: ignore[arg-type]
                                   schedule_name=record.schedule_name)
    best = Candidate(compiled.schedule, compiled.cost)
    search = TuneResult(best=best, top=[best], method="cache", trials=0, evaluated=0, feasible=0,
                        space_size=int(record.search.get("space_size", 0)), seconds=time.perf_counter() - started)
    if workload.fused:
        return TunedGraph(compiled, search, *baselines(workload, target))
    problem = compiled.problem
    baseline = estimate(lower_gemm(problem, preset("aws-fully-optimized", problem), target), target)
    return Tuned(compiled, search, baseline)


def tune_workload(workload: Workload, *, target: Target, dialect: str, cache: ResultCache | None,
                  exhaustive_threshold: int, **search: Any) -> tuple[Tuned | TunedGraph, bool]:
    """(tuned, answered_from_cache). ``search``: trials, seed, timeout, top_k, method, progress, storage,
    study_name, workers.

    With a ``storage`` the cache is not read (the caller asked for that study to be run or resumed,
    and its result is the whole study's), but the outcome is still written to it."""
    started = time.perf_counter()
    graph = workload.graph()
    key = cache_key(graph, target=target, dialect=dialect, kind=_kind(workload))
    if cache is not None and search.get("storage") is None:
        record = cache.get(key)
        if record is not None:
            return _from_record(workload, record, target=target, dialect=dialect, started=started), True
    tuned: Tuned | TunedGraph
    if workload.fused:
        tuned = tune_graph(workload, target=target, dialect=dialect, exhaustive_threshold=exhaustive_threshold,
                           **search)
    else:
        tuned = tune_gemm_workload(workload.m, workload.n, workload.k, dtype=workload.dtype,
                                   a_layout=workload.a_layout, target=target, dialect=dialect,
                                   exhaustive_threshold=exhaustive_threshold, **search)
    if cache is not None:
        cache.put(new_record(graph, target=target, dialect=dialect, kind=_kind(workload),
                             schedule=tuned.compiled.schedule, schedule_name=tuned.compiled.schedule_name,
                             latency_us=tuned.compiled.cost.latency_us, search=tuned.search.search_summary(),
                             workload=workload.describe()))
    return tuned, False


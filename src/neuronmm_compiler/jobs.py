"""What one compile or tune request is, resolved once: :class:`Job` (a workload on a target, in a dialect, for a
Neuron SDK release, with its lowering entry) and :class:`SearchSettings` (how a schedule search runs). The driver
(:mod:`.driver`) takes these instead of loose arguments, so nothing in a request is resolved twice."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from .frontends.workloads import Workload
from .ir import Graph
from .lowerings import Lowering, lowering_for
from .lowerings.base import dma_transpose_ok
from .support import AUTO, check_sdk, newest_sdk, resolve_dialect
from .targets import Target
from .vocab import Dialect

__all__ = ["Job", "ProgressFn", "SearchSettings", "platform_dialect", "resolve"]

#: ``progress(done, total, best_latency_us)`` of a search.
ProgressFn = Callable[[int, int, float], None]


@dataclass(frozen=True)
class Job:
    """One workload resolved once for a target: the concrete dialect, the Neuron SDK release its kernel is for (the
    spelling of an exchange between the programs of a logical core depends on it, :func:`~.support.uses_nki_lnc`), the
    lowering entry that compiles it, whether its A^T / X^T may be a transposing DMA load there, and (built on first
    use) its graph. Every step of a request (search, cache key, compile, baselines, cache record) reads these from here
    instead of resolving them again."""

    workload: Workload
    target: Target
    dialect: Dialect
    lowering: Lowering
    dma_transpose: bool
    sdk: str

    @functools.cached_property
    def graph(self) -> Graph:
        """The workload's graph before the pipeline (what the result cache keys on)."""
        return self.workload.graph()


def resolve(workload: Workload, target: Target, dialect: str | None = None, sdk: str | None = None) -> Job:
    """``workload`` on ``target`` in ``dialect`` (None or ``auto``: the one the target's support picks for ``sdk``) for
    Neuron SDK release ``sdk`` (None: the newest supporting the dialect on the target; InputError for a release the
    dialect cannot run on, :func:`~.support.check_sdk`)."""
    concrete = platform_dialect(dialect, target, sdk)
    release = check_sdk(sdk, concrete) if sdk is not None else newest_sdk(concrete, target.name)
    return Job(workload, target, concrete, lowering_for(workload), dma_transpose_ok(workload, target, concrete),
               release)


@dataclass(frozen=True)
class SearchSettings:
    """How a schedule search runs (``nmmc tune``'s search options). ``trials`` and ``exhaustive_threshold`` None: the
    lowering entry's; ``storage``, ``study_name``, ``workers``: a resumable, shareable Optuna study
    (:func:`search.tuner.search`); ``timeout``: a search cut short, never cached; ``processes``: 2 or more costs the
    polish's schedules in two processes (the same result, :mod:`.search.prefetch`)."""

    trials: int | None = None
    seed: int = 0
    timeout: float | None = None
    method: str | None = None
    exhaustive_threshold: int | None = None
    top_k: int = 5
    storage: str | None = None
    study_name: str | None = None
    workers: int = 1
    progress: ProgressFn | None = field(default=None, compare=False)
    processes: int = field(default=1, compare=False)

    def trials_for(self, lowering: Lowering) -> int:
        """The trials asked for, else the lowering entry's default (:attr:`.lowerings.base.Lowering.default_trials`)."""
        return lowering.default_trials if self.trials is None else self.trials

    def threshold(self, lowering: Lowering) -> int:
        """The exhaustive threshold asked for, else the lowering entry's default."""
        return lowering.exhaustive_threshold if self.exhaustive_threshold is None else self.exhaustive_threshold


def platform_dialect(dialect: str | None, target: Target, sdk: str | None = None) -> Dialect:
    """The concrete dialect of ``--dialect`` (None or ``auto``: the one :mod:`~neuronmm_compiler.support` picks
    for the target and SDK release)."""
    return resolve_dialect(dialect or AUTO, target.name, sdk)

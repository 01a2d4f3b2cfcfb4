"""What a search works with: a costed schedule (:class:`Candidate`), the memo that costs each
distinct schedule once (:class:`Evaluator`), what the search needs to know about a space
(:class:`SpaceSpec`), and its outcome (:class:`TuneResult`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..cost_model import CostReport
from .prefetch import CostWorker, Outcome
from .space import SearchSpace


@dataclass(frozen=True)
class Candidate:
    """A costed schedule."""

    schedule: Any  # GemmSchedule or FusedSchedule
    cost: CostReport

    @property
    def latency_us(self) -> float:
        return self.cost.latency_us

    @property
    def order(self) -> tuple:
        """How candidates rank: latency, then the schedule's parameters (a deterministic tie-break)."""
        return (self.cost.latency_us, schedule_key(self.schedule))


@dataclass
class TuneResult:
    """The outcome of a search."""

    best: Candidate
    top: list[Candidate]
    method: str  # "optuna" or "exhaustive"
    trials: int  # Optuna trials run (0 for exhaustive)
    evaluated: int  # distinct schedules costed
    feasible: int  # of which fit on chip
    space_size: int  # distinct schedules in the space
    seconds: float
    history: list[float] = field(default_factory=list)  # best feasible latency after each evaluation
    trial_history: list[float] = field(default_factory=list)  # best feasible latency after each Optuna trial
    candidates: list[Candidate] = field(default_factory=list, repr=False)  # every schedule costed, in order
    # With a persistent storage: name, storage kind, trials_in_study (COMPLETE), trials_run (by this call), workers.
    study: dict[str, object] | None = None

    def time_note(self) -> str:
        """The search's wall time as reports state it: this run's, or for a result rebuilt from a stored
        study (``nmmc report``) the wall time ``nmmc tune`` recorded in the study (summed over the runs
        that filled it), never the seconds the rebuild took."""
        if self.study is None or "rebuilt_seconds" not in self.study:
            return f"{self.seconds:.2f} s"
        recorded = self.study.get("search_seconds")
        rebuilt = f"rebuilt from the study in {float(self.study['rebuilt_seconds']):.2f} s"  # type: ignore[arg-type]
        if recorded is None:
            return f"not recorded in the study (written by an older nmmc); {rebuilt}"
        return (f"{float(recorded):.2f} s (wall time of the 'nmmc tune' runs that filled the study, "  # type: ignore[arg-type]
                f"summed); {rebuilt}")

    def search_summary(self) -> dict[str, object]:
        summary: dict[str, object] = {
            "method": self.method, "trials": self.trials, "evaluated": self.evaluated, "feasible": self.feasible,
            "space_size": self.space_size, "seconds": round(self.seconds, 3)}
        if self.study is not None:
            summary["study"] = dict(self.study)
        return summary


class Evaluator:
    """Costs schedules once each (normalized schedules are the memo key). ``variants``: schedules outside the
    sampled space that a sampled one stands for (a fused schedule's weight blocks in one DMA instead of one per
    slab): each is costed too and the best is returned, so the search sees a point's best form while sampling the
    space it had, and the polish moves from the sampled point (:attr:`raw`). ``late_variants``: more such forms,
    costed only once :attr:`late` is set (the search's last descent, search/tuner.py): a form that pays off near
    the optimum, whose cost on every trial would slow the whole search (a fused group with the activations
    stationary)."""

    def __init__(self, cost: Callable[[Any], CostReport], normalize: Callable[[Any], Any],
                 variants: Callable[[Any], list[Any]] | None = None,
                 late_variants: Callable[[Any], list[Any]] | None = None):
        self.cost, self.normalize, self.variants, self.late_variants = cost, normalize, variants, late_variants
        self.late = False
        self.memo: dict[Any, Candidate] = {}
        self.raw: dict[Any, Any] = {}  # normalized -> first raw schedule seen (for a variant: the one it stands for)
        self.history: list[float] = []
        self.trial_history: list[float] = []
        self.best: float = math.inf
        #: a second process costing batches (:meth:`prefetch`), and the outcomes it costed ahead of their turn
        self.worker: CostWorker | None = None
        self._ready: dict[Any, Outcome] = {}

    def fresh(self) -> Evaluator:
        """An empty evaluator costing the same way (the same cost, normalization and variants)."""
        return Evaluator(self.cost, self.normalize, self.variants, self.late_variants)

    def __call__(self, schedule: Any) -> Candidate:
        best = self._costed(schedule, schedule)
        for variant in self._forms(best.schedule):
            cand = self._costed(variant, self.raw[best.schedule])
            if cand.cost.feasible and (not best.cost.feasible or cand.order < best.order):
                best = cand
        return best

    def _forms(self, schedule: Any) -> list[Any]:
        """The other forms :meth:`__call__` costs beside a normalized schedule: its variants, then (once :attr:`late`
        is set) the late variants of it and of them."""
        forms = list(self.variants(schedule)) if self.variants is not None else []
        if self.late and self.late_variants is not None:
            forms += [late for form in (schedule, *forms) for late in self.late_variants(form)]
        return forms

    def prefetch(self, schedules: list[Any]) -> None:
        """Cost ahead, in two processes (:attr:`worker`, when there is one), the schedules that calling this
        evaluator on each of ``schedules`` in turn would cost: the same reports, taken in the same order when the
        calls come (the cost function is pure, see :mod:`.prefetch`). Without a worker, nothing."""
        if self.worker is None:
            return
        groups: list[list[Any]] = []
        seen: set[Any] = set()
        for schedule in schedules:
            sched = self.normalize(schedule)
            forms = [sched, *(self.normalize(form) for form in self._forms(sched))]
            group = [form for form in forms if form not in self.memo and form not in self._ready and form not in seen]
            seen.update(group)
            if group:
                groups.append(group)
        if sum(len(group) for group in groups) >= 2:  # one schedule is not worth a round trip
            self._ready.update(self.worker.cost(groups))

    def _costed(self, schedule: Any, raw: Any) -> Candidate:
        sched = self.normalize(schedule)
        self.raw.setdefault(sched, raw)
        hit = self.memo.get(sched)
        if hit is not None:
            return hit
        ready = self._ready.pop(sched, None)
        if ready is not None and not ready[0]:
            raise ready[1]
        cand = Candidate(sched, ready[1] if ready is not None else self.cost(sched))
        self.memo[sched] = cand
        if cand.cost.feasible:
            self.best = min(self.best, cand.latency_us)
        self.history.append(self.best)
        return cand

    def ranked(self) -> list[Candidate]:
        feasible = [c for c in self.memo.values() if c.cost.feasible]
        return sorted(feasible, key=lambda c: c.order)


def schedule_key(schedule: Any) -> tuple:
    """The tie-break between schedules of equal latency: their (name, value) pairs in field order, parameters at a
    quiet default left out (``ScheduleParams.QUIET``), so a schedule that leaves a later parameter at its default
    ranks first, and values of different parameters are never compared."""
    return tuple(schedule.as_dict().items())


@dataclass(frozen=True)
class SpaceSpec:
    """What the search needs to know about a schedule space (the parameters' roles: ``space``)."""

    space: SearchSpace
    guesses: list[Any]  # schedules enqueued as the first trials
    size: int  # distinct (normalized) schedules in the space
    distinct: Callable[[], Iterable[Any]]  # every distinct schedule, for exhaustive search

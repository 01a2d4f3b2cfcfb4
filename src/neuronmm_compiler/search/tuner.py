"""Pick the best GEMM schedule: Optuna TPE over the candidate lists, or exhaustive enumeration
when the space of distinct schedules is small, then a local polish.

Every candidate is lowered to its loop-nest program and costed by the analytic model, the same
program codegen would print. Schedules over the target's SBUF or PSUM are infeasible: Optuna sees
the overflow as a constraint (TPE's ``constraints_func``) and they never win.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna

from ..cost_model import DEFAULT_PARAMS, CostReport, ModelParams, estimate
from ..errors import ScheduleError
from ..schedule.gemm import GemmProblem, GemmSchedule, normalize
from ..schedule.lower_gemm import lower_gemm
from ..targets import Target
from .space import SearchSpace, gemm_space, heuristic_guesses

DEFAULT_TRIALS = 150
DEFAULT_EXHAUSTIVE_THRESHOLD = 1000
ORDINAL = ("tile_m", "tile_n", "tile_k", "tiles_in_block_m", "tiles_in_block_n", "tiles_in_block_k")


@dataclass(frozen=True)
class Candidate:
    """A costed schedule."""

    schedule: Any  # GemmSchedule or FusedSchedule
    cost: CostReport

    @property
    def latency_us(self) -> float:
        return self.cost.latency_us


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

    def search_summary(self) -> dict[str, object]:
        return {"method": self.method, "trials": self.trials, "evaluated": self.evaluated,
                "feasible": self.feasible, "space_size": self.space_size, "seconds": round(self.seconds, 3)}


class Evaluator:
    """Costs schedules once each (normalized schedules are the memo key)."""

    def __init__(self, cost: Callable[[Any], CostReport], normalize: Callable[[Any], Any]):
        self.cost, self.normalize = cost, normalize
        self.memo: dict[Any, Candidate] = {}
        self.raw: dict[Any, Any] = {}  # normalized -> first raw schedule seen
        self.history: list[float] = []
        self.trial_history: list[float] = []
        self.best: float = math.inf

    def __call__(self, schedule: Any) -> Candidate:
        sched = self.normalize(schedule)
        self.raw.setdefault(sched, schedule)
        hit = self.memo.get(sched)
        if hit is not None:
            return hit
        cand = Candidate(sched, self.cost(sched))
        self.memo[sched] = cand
        if cand.cost.feasible:
            self.best = min(self.best, cand.latency_us)
        self.history.append(self.best)
        return cand

    def ranked(self) -> list[Candidate]:
        feasible = [c for c in self.memo.values() if c.cost.feasible]
        return sorted(feasible, key=lambda c: (c.latency_us, _key(c.schedule)))


def _key(schedule: Any) -> tuple:
    return tuple(schedule.as_dict().values())


def distinct_size(problem: GemmProblem, space: SearchSpace) -> int:
    """Number of distinct normalized schedules in the space (numeric parts collapse; the
    categorical parameters never do)."""
    numeric = {name: space.candidates[name] for name in ORDINAL}
    categorical = math.prod(len(v) for k, v in space.candidates.items() if k not in ORDINAL)
    seen = set()
    names = list(numeric)
    for values in itertools.product(*numeric.values()):
        sched = normalize(problem, GemmSchedule(**dict(zip(names, values, strict=True))))
        seen.add(tuple(getattr(sched, n) for n in names))
    return len(seen) * categorical


def _neighbours(space: SearchSpace, point: dict, exchange: tuple[str, ...]) -> list[dict]:
    """Every point one parameter away, plus 'exchange' moves that grow one block dimension by a
    step of its list while shrinking another (about the same SBUF footprint, a different reuse
    pattern), which single-parameter moves cannot reach when the footprint is tight."""
    out = []
    for name, values in space.candidates.items():
        out += [{**point, name: value} for value in values if value != point[name]]
    for grow, shrink in itertools.permutations(exchange, 2):
        g_vals, s_vals = space.candidates[grow], space.candidates[shrink]
        g, s = g_vals.index(point[grow]), s_vals.index(point[shrink])
        if g + 1 < len(g_vals) and s >= 1:
            out.append({**point, grow: g_vals[g + 1], shrink: s_vals[s - 1]})
    return out


def _polish(evaluate: Evaluator, spec: SpaceSpec, start: Candidate) -> Candidate:
    """Descent over :func:`_neighbours` until no neighbour is better."""
    best = start
    improved = True
    while improved:
        improved = False
        # The raw point (tiles before clipping to the problem) is what lies in the candidate lists.
        point = spec.space.point_of(evaluate.raw.get(best.schedule, best.schedule))
        if point is None:
            break
        for neighbour in _neighbours(spec.space, point, spec.exchange):
            cand = evaluate(spec.space.decode(neighbour))
            better = (cand.latency_us, _key(cand.schedule)) < (best.latency_us, _key(best.schedule))
            if cand.cost.feasible and better:
                best, improved = cand, True
    return best


POLISH_STARTS = 4


def _polish_starts(ranked: list[Candidate], classes: tuple[str, ...]) -> list[Candidate]:
    """The best schedule of each structural class (where partial sums live, DMA grouping, A^T
    strategy), for the best few classes: coordinate descent cannot cross between classes (moving
    one parameter at a time out of a class's optimum usually makes things worse), so each
    promising class gets its own descent."""
    starts: dict[tuple, Candidate] = {}
    for cand in ranked:
        key = tuple(getattr(cand.schedule, name) for name in classes)
        starts.setdefault(key, cand)
    return list(starts.values())[:POLISH_STARTS]


@dataclass(frozen=True)
class SpaceSpec:
    """What the search needs to know about a schedule space."""

    space: SearchSpace
    ordinal: tuple[str, ...]  # parameters Optuna samples as ordered indices (the rest: categorical)
    exchange: tuple[str, ...]  # block-size parameters the polish trades against each other
    classes: tuple[str, ...]  # structural parameters: the polish starts once per class
    guesses: list[Any]  # schedules enqueued as the first trials
    size: int  # distinct (normalized) schedules in the space
    distinct: Callable[[], Iterable[Any]]  # every distinct schedule, for exhaustive search


def search(spec: SpaceSpec, evaluate: Evaluator, *, what: str, trials: int = DEFAULT_TRIALS, seed: int = 0,
           timeout: float | None = None, exhaustive_threshold: int = DEFAULT_EXHAUSTIVE_THRESHOLD,
           top_k: int = 5, force: str | None = None,
           progress: Callable[[int, int, float], None] | None = None) -> TuneResult:
    """Optuna TPE (or exhaustive enumeration of a small space), then the polish.

    ``force`` = "optuna" or "exhaustive" overrides the automatic choice (exhaustive when the space
    has at most ``exhaustive_threshold`` distinct schedules). ``progress(done, total, best_us)`` is
    called after each trial.
    """
    start = time.perf_counter()
    method = force or ("exhaustive" if spec.size <= exhaustive_threshold else "optuna")
    if method not in ("optuna", "exhaustive"):
        raise ValueError(f"unknown search method {method!r}")
    n_trials = 0
    if method == "exhaustive":
        for i, sched in enumerate(spec.distinct()):
            evaluate(sched)
            if progress:
                progress(i + 1, spec.size, evaluate.best)
    else:
        n_trials = _run_optuna(evaluate, spec, trials, seed, timeout, progress)
    ranked = evaluate.ranked()
    if not ranked:
        raise ScheduleError(f"no schedule of the search space fits on chip for {what}")
    best = ranked[0]
    if method == "optuna":
        best = min((_polish(evaluate, spec, s) for s in _polish_starts(ranked, spec.classes)),
                   key=lambda c: (c.latency_us, _key(c.schedule)))
        ranked = evaluate.ranked()
    return TuneResult(best=best, top=ranked[:top_k], method=method, trials=n_trials, evaluated=len(evaluate.memo),
                      feasible=sum(c.cost.feasible for c in evaluate.memo.values()), space_size=spec.size,
                      seconds=time.perf_counter() - start, history=list(evaluate.history),
                      trial_history=list(evaluate.trial_history))


def tune_gemm(problem: GemmProblem, target: Target, *, trials: int = DEFAULT_TRIALS, seed: int = 0,
              timeout: float | None = None, exhaustive_threshold: int = DEFAULT_EXHAUSTIVE_THRESHOLD,
              top_k: int = 5, params: ModelParams = DEFAULT_PARAMS, space: SearchSpace | None = None,
              force: str | None = None, progress: Callable[[int, int, float], None] | None = None) -> TuneResult:
    """Search the GEMM schedule space of ``problem`` on ``target`` (see :func:`search`)."""
    space = space or gemm_space(problem)
    size = distinct_size(problem, space)
    spec = SpaceSpec(
        space=space, ordinal=ORDINAL, exchange=("tiles_in_block_m", "tiles_in_block_n", "tiles_in_block_k"),
        classes=("accumulate", "dma", "a_transpose"), guesses=heuristic_guesses(problem, space), size=size,
        distinct=lambda: (space.distinct(problem) if size <= 20 * exhaustive_threshold
                          else (space.decode(p) for p in space.points())),
    )
    evaluate = Evaluator(lambda s: estimate(lower_gemm(problem, s), target, params),
                         lambda s: normalize(problem, s))
    return search(spec, evaluate, what=f"{problem.describe()} on {target.name}", trials=trials, seed=seed,
                  timeout=timeout, exhaustive_threshold=exhaustive_threshold, top_k=top_k, force=force,
                  progress=progress)


def _run_optuna(evaluate: Evaluator, spec: SpaceSpec, trials: int, seed: int,
                timeout: float | None, progress: Callable[[int, int, float], None] | None) -> int:
    optuna.logging.set_verbosity(logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(20, max(trials // 5, 1)))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    space = spec.space
    for guess in spec.guesses:
        study.enqueue_trial(_params_of(space, guess, spec.ordinal))

    def objective(trial: optuna.Trial) -> float:
        point = {}
        for name, values in space.candidates.items():
            if name in spec.ordinal:
                point[name] = values[trial.suggest_int(name, 0, len(values) - 1)]
            else:
                point[name] = trial.suggest_categorical(name, list(values))
        cand = evaluate(space.decode(point))
        trial.set_constraint("on_chip_overflow", _overflow(cand))
        evaluate.trial_history.append(evaluate.best)
        if progress:
            progress(trial.number + 1, trials, evaluate.best)
        return cand.latency_us

    study.optimize(objective, n_trials=trials, timeout=timeout)
    return len(study.trials)


def _params_of(space: SearchSpace, schedule: Any, ordinal: tuple[str, ...]) -> dict[str, object]:
    point = space.point_of(schedule) or {}
    return {name: (space.candidates[name].index(value) if name in ordinal else value)
            for name, value in point.items()}


def _overflow(cand: Candidate) -> float:
    """How far the schedule is over SBUF or PSUM capacity (0 when it fits): TPE prefers smaller."""
    cost = cand.cost
    sbuf = cost.sbuf_bytes_per_partition / cost.sbuf_capacity - 1.0
    psum = cost.psum_banks / cost.psum_capacity - 1.0
    return max(sbuf, psum, 0.0)

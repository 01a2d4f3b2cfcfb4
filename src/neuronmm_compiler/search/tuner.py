"""Pick the best GEMM schedule: Optuna TPE over the candidate lists, or exhaustive enumeration
when the space of distinct schedules is small, then a local polish.

Every candidate is lowered to its loop-nest program and costed by the analytic model, the same
program codegen would print. Schedules over the target's SBUF or PSUM are infeasible: Optuna sees
the overflow as a constraint (TPE's ``constraints_func``) and they never win.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna

from ..cost_model import CostReport
from ..errors import InputError, ScheduleError
from .space import SearchSpace

DEFAULT_TRIALS = 150
DEFAULT_EXHAUSTIVE_THRESHOLD = 1000


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
    candidates: list[Candidate] = field(default_factory=list, repr=False)  # every schedule costed, in order
    # With a persistent storage: name, storage kind, trials_in_study (COMPLETE), trials_run (by this call), workers.
    study: dict[str, object] | None = None

    def search_summary(self) -> dict[str, object]:
        summary: dict[str, object] = {
            "method": self.method, "trials": self.trials, "evaluated": self.evaluated, "feasible": self.feasible,
            "space_size": self.space_size, "seconds": round(self.seconds, 3)}
        if self.study is not None:
            summary["study"] = dict(self.study)
        return summary


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
        for neighbour in _neighbours(spec.space, point, spec.space.exchange):
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
    """What the search needs to know about a schedule space (the parameters' roles: ``space``)."""

    space: SearchSpace
    guesses: list[Any]  # schedules enqueued as the first trials
    size: int  # distinct (normalized) schedules in the space
    distinct: Callable[[], Iterable[Any]]  # every distinct schedule, for exhaustive search


def search(spec: SpaceSpec, evaluate: Evaluator, *, what: str, trials: int = DEFAULT_TRIALS, seed: int = 0,
           timeout: float | None = None, exhaustive_threshold: int = DEFAULT_EXHAUSTIVE_THRESHOLD,
           top_k: int = 5, force: str | None = None,
           progress: Callable[[int, int, float], None] | None = None, storage: str | None = None,
           study_name: str | None = None, workers: int = 1,
           setup: Callable[[], tuple[SpaceSpec, Evaluator]] | None = None) -> TuneResult:
    """Optuna TPE (or exhaustive enumeration of a small space), then the polish.

    ``force`` = "optuna" or "exhaustive" overrides the automatic choice (exhaustive when the space
    has at most ``exhaustive_threshold`` distinct schedules). ``progress(done, total, best_us)`` is
    called after each trial.

    Each trial's sample depends only on (``seed``, number of COMPLETE trials, the stored history),
    so with ``storage`` (a URL, see :mod:`.storage`) a search killed part-way and rerun with the
    same arguments runs only the missing trials and returns what an uninterrupted run returns. The
    study (``study_name``, default derived from the workload) is created on first use and records
    the workload's fingerprint: reusing it for another workload is an :class:`InputError`. The
    evaluator is warmed from every stored trial, so the best, the top-k and the polish use the
    whole study.

    ``workers`` > 1 (needs ``storage``) runs the trials in that many spawned processes, each
    rebuilding the space and the evaluator with ``setup`` (picklable); each worker checks the
    number of COMPLETE trials before starting one, so the study can end up to ``workers - 1``
    trials over ``trials``. Worker runs are not bit-reproducible (the interleaving decides which
    history each trial sees). An exhaustive search never uses the storage.
    """
    start = time.perf_counter()
    method = force or ("exhaustive" if spec.size <= exhaustive_threshold else "optuna")
    if method not in ("optuna", "exhaustive"):
        raise ValueError(f"unknown search method {method!r}")
    if workers < 1:
        raise InputError(f"workers must be at least 1, got {workers}")
    if workers > 1 and storage is None:
        raise InputError("workers > 1 needs a storage (an in-memory study cannot be shared between processes)")
    if workers > 1 and setup is None:
        raise InputError(f"this search ({what}) cannot run in worker processes")
    n_trials = 0
    study_info = None
    if method == "exhaustive":
        for i, sched in enumerate(spec.distinct()):
            evaluate(sched)
            if progress:
                progress(i + 1, spec.size, evaluate.best)
    elif storage is None:
        n_trials = _run_optuna(evaluate, spec, trials, seed, timeout, progress)
    else:
        n_trials, study_info = _run_stored(evaluate, spec, what=what, trials=trials, seed=seed, timeout=timeout,
                                           progress=progress, storage=storage, study_name=study_name,
                                           workers=workers, setup=setup)
    return _result(evaluate, spec, what=what, method=method, trials=n_trials, top_k=top_k, started=start,
                   study=study_info)


def result_from_study(study: optuna.Study, spec: SpaceSpec, evaluate: Evaluator, *, what: str,
                      top_k: int = 5, storage: str | None = None) -> TuneResult:
    """The result of the Optuna search stored in ``study``, rebuilt without running a trial.

    Every COMPLETE trial's schedule is costed into ``evaluate`` in trial order (as a resumed
    :func:`search` warms its evaluator), then the polish runs from the best schedules exactly as
    at the end of :func:`search`, so ``best`` is the schedule that search chose; the polish costs
    neighbouring schedules but adds no trial to the study. ``spec`` and ``evaluate`` come from the
    workload's lowering (``search_setup``) and ``what`` names the workload as the search named it:
    a study recorded for another workload or space is an :class:`InputError`, and so is a study
    without a completed trial. ``storage`` (the study's URL) only names the storage kind in
    ``result.study``."""
    from .storage import storage_kind

    started = time.perf_counter()
    kind = storage_kind(storage) if storage else None
    _check_fingerprint(study, what, spec, kind=kind or "the")
    seen: set[int] = set()
    _warm(study, evaluate, spec, seen)
    if not seen:
        raise InputError(f"study {study.study_name!r} holds no completed trial")
    info: dict[str, object] = {"name": study.study_name, "storage": kind,
                               "trials_in_study": len(seen), "trials_run": 0, "workers": 1}
    return _result(evaluate, spec, what=what, method="optuna", trials=len(seen), top_k=top_k, started=started,
                   study=info)


def _result(evaluate: Evaluator, spec: SpaceSpec, *, what: str, method: str, trials: int, top_k: int,
            started: float, study: dict[str, object] | None) -> TuneResult:
    """The TuneResult of an evaluator holding a finished search: after an Optuna search, the best
    schedule polished from the best of each structural class."""
    ranked = evaluate.ranked()
    if not ranked:
        raise ScheduleError(f"no schedule of the search space fits on chip for {what}")
    best = ranked[0]
    if method == "optuna":
        best = min((_polish(evaluate, spec, s) for s in _polish_starts(ranked, spec.space.classes)),
                   key=lambda c: (c.latency_us, _key(c.schedule)))
        ranked = evaluate.ranked()
    return TuneResult(best=best, top=ranked[:top_k], method=method, trials=trials, evaluated=len(evaluate.memo),
                      feasible=sum(c.cost.feasible for c in evaluate.memo.values()), space_size=spec.size,
                      seconds=time.perf_counter() - started, history=list(evaluate.history),
                      trial_history=list(evaluate.trial_history), study=study,
                      candidates=list(evaluate.memo.values()))


# ----------------------------------------------------------------------------- the Optuna loop

_OWNER_ATTR = "nmmc_owner"  # "host:pid" of the process running a trial, to recognize trials of dead processes
_FINGERPRINT_ATTR = "nmmc_fingerprint"
_WORKLOAD_ATTR = "nmmc_workload"
_ORPHAN_GRACE_S = 120.0  # a RUNNING trial without owner (killed between ask and tagging) is dead after this


def _trial_seed(seed: int, done: int, worker: int = 0) -> int:
    """The sampler seed of the trial that starts when ``done`` trials are complete."""
    digest = hashlib.sha256(f"nmmc-trial:{seed}:{done}:{worker}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _guess_params(spec: SpaceSpec) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for guess in spec.guesses:
        params = _params_of(spec.space, guess)
        if params and params not in out:
            out.append(params)
    return out


def _point_of_params(spec: SpaceSpec, params: dict[str, Any]) -> dict[str, object]:
    space = spec.space
    return {name: (values[int(params[name])] if name in space.ordinal else params[name])
            for name, values in space.candidates.items()}


def _trial_loop(study: optuna.Study, evaluate: Evaluator, spec: SpaceSpec, trials: int, seed: int,
                timeout: float | None, progress: Callable[[int, int, float], None] | None, *,
                worker: int = 0, constant_liar: bool = False) -> int:
    """Run trials one at a time until the study holds ``trials`` COMPLETE trials (or ``timeout``).

    Before each trial the sampler is replaced by one seeded from (seed, COMPLETE trials, worker), so
    the sample depends only on those and the stored history, never on this process's past. The
    heuristic guesses are enqueued one at a time, each only if no waiting, running or complete
    trial holds it yet. Returns the trials this call ran."""
    started = time.perf_counter()
    space, state = spec.space, optuna.trial.TrialState
    ordinal = space.ordinal
    guesses = _guess_params(spec)
    n_startup = min(20, max(trials // 5, 1))
    owner = f"{socket.gethostname()}:{os.getpid()}"
    ran = 0
    while timeout is None or time.perf_counter() - started < timeout:
        existing = study.get_trials(deepcopy=False)
        done = sum(t.state == state.COMPLETE for t in existing)
        if done >= trials:
            break
        if guesses and not any(t.state == state.WAITING for t in existing):
            held = [_enqueued_params(t) for t in existing
                    if t.state in (state.COMPLETE, state.RUNNING, state.WAITING)]
            guesses = [g for g in guesses if g not in held]
            if guesses:
                study.enqueue_trial(guesses[0])
        study.sampler = optuna.samplers.TPESampler(seed=_trial_seed(seed, done, worker), n_startup_trials=n_startup,
                                                   constant_liar=constant_liar)
        trial = study.ask()
        trial.set_user_attr(_OWNER_ATTR, owner)
        point = {}
        for name, values in space.candidates.items():
            if name in ordinal:
                point[name] = values[trial.suggest_int(name, 0, len(values) - 1)]
            else:
                point[name] = trial.suggest_categorical(name, list(values))
        cand = evaluate(space.decode(point))
        trial.set_constraint("on_chip_overflow", _overflow(cand))
        study.tell(trial, cand.latency_us)
        ran += 1
        evaluate.trial_history.append(evaluate.best)
        if progress:
            progress(done + 1, trials, evaluate.best)
    return ran


def _run_optuna(evaluate: Evaluator, spec: SpaceSpec, trials: int, seed: int,
                timeout: float | None, progress: Callable[[int, int, float], None] | None) -> int:
    optuna.logging.set_verbosity(logging.WARNING)
    study = optuna.create_study(direction="minimize")
    return _trial_loop(study, evaluate, spec, trials, seed, timeout, progress)


def _fingerprint(what: str, spec: SpaceSpec) -> str:
    text = json.dumps({"workload": what, "space": {k: list(v) for k, v in spec.space.candidates.items()},
                       "ordinal": list(spec.space.ordinal)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_fingerprint(study: optuna.Study, what: str, spec: SpaceSpec, *, kind: str) -> None:
    """InputError when ``study`` records another workload or schedule space than (``what``, ``spec``)."""
    recorded = study.user_attrs.get(_FINGERPRINT_ATTR)
    if recorded is not None and recorded != _fingerprint(what, spec):
        raise InputError(f"study {study.study_name!r} in {kind} storage was created for "
                         f"{study.user_attrs.get(_WORKLOAD_ATTR, 'another workload')}, not {what}; "
                         "use another study name")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fail_dead_trials(study: optuna.Study) -> int:
    """Mark FAIL the RUNNING trials of processes on this host that no longer exist (a killed run),
    and RUNNING trials that never got an owner tag and started long ago. Trials of other hosts are
    left alone: they may be running. FAIL trials are never counted nor sampled from."""
    host = socket.gethostname()
    now = time.time()
    failed = 0
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = t.user_attrs.get(_OWNER_ATTR)
        if owner is None:
            started = t.datetime_start.timestamp() if t.datetime_start else now
            dead = now - started > _ORPHAN_GRACE_S
        else:
            owner_host, _, pid = str(owner).rpartition(":")
            dead = owner_host == host and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid))
        if dead:
            try:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
                failed += 1
            except Exception:  # finished meanwhile (it was not dead after all)
                continue
    return failed


def _open_study(storage: str, study_name: str) -> optuna.Study:
    from .storage import open_storage

    return optuna.create_study(storage=open_storage(storage), study_name=study_name, load_if_exists=True,
                               direction="minimize")


def _warm(study: optuna.Study, evaluate: Evaluator, spec: SpaceSpec, seen: set[int]) -> None:
    """Cost the schedules of the study's COMPLETE trials not in ``seen`` (trial numbers), in trial
    order, extending the per-trial history as if this process had run them."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    for t in sorted(complete, key=lambda t: t.number):
        if t.number in seen:
            continue
        seen.add(t.number)
        try:
            point = _point_of_params(spec, t.params)
        except (KeyError, IndexError, ValueError) as exc:
            raise InputError(f"study {study.study_name!r} holds a trial whose parameters are not in this "
                             f"search space ({exc}); use another study name") from exc
        evaluate(spec.space.decode(point))
        evaluate.trial_history.append(evaluate.best)


def _worker_main(setup: Callable[[], tuple[SpaceSpec, Evaluator]], storage: str, study_name: str, trials: int,
                 seed: int, timeout: float | None, worker: int) -> None:
    optuna.logging.set_verbosity(logging.WARNING)
    spec, evaluate = setup()
    for attempt in range(5):
        study = _open_study(storage, study_name)
        try:
            _trial_loop(study, evaluate, spec, trials, seed, timeout, None, worker=worker, constant_liar=True)
            return
        except Exception as exc:  # transient storage contention ("database is locked") under load: retry
            transient = "OperationalError" in type(exc).__name__ or "locked" in str(exc)
            if not transient or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def _run_stored(evaluate: Evaluator, spec: SpaceSpec, *, what: str, trials: int, seed: int,
                timeout: float | None, progress: Callable[[int, int, float], None] | None, storage: str,
                study_name: str | None, workers: int,
                setup: Callable[[], tuple[SpaceSpec, Evaluator]] | None) -> tuple[int, dict[str, object]]:
    from .storage import storage_kind

    optuna.logging.set_verbosity(logging.WARNING)
    kind = storage_kind(storage)
    fingerprint = _fingerprint(what, spec)
    name = study_name or f"nmmc-{fingerprint[:16]}"
    study = _open_study(storage, name)
    if study.user_attrs.get(_FINGERPRINT_ATTR) is None:
        study.set_user_attr(_FINGERPRINT_ATTR, fingerprint)
        study.set_user_attr(_WORKLOAD_ATTR, what)
    _check_fingerprint(study, what, spec, kind=kind)
    _fail_dead_trials(study)
    seen: set[int] = set()
    _warm(study, evaluate, spec, seen)
    done_before = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
    if workers == 1:
        _trial_loop(study, evaluate, spec, trials, seed, timeout, progress)
    else:
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_worker_main, args=(setup, storage, name, trials, seed, timeout, i + 1),
                             name=f"nmmc-tune-worker-{i + 1}") for i in range(workers)]
        for proc in procs:
            proc.start()
        try:
            while any(proc.is_alive() for proc in procs):
                for proc in procs:
                    proc.join(timeout=0.5)
                if progress:
                    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                    progress(min(len(complete), trials), trials, evaluate.best)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
        codes = [proc.exitcode for proc in procs]
        if any(code != 0 for code in codes):
            # A worker that died (e.g. storage contention on a loaded machine) loses no finished
            # trial: mark its interrupted ones failed and finish the study here.
            logging.getLogger(__name__).warning("tuning worker processes exited with codes %s; "
                                                "finishing the study in this process", codes)
            _fail_dead_trials(study)
            _trial_loop(study, evaluate, spec, trials, seed, timeout, progress)
        _warm(study, evaluate, spec, seen)
    total = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
    info: dict[str, object] = {"name": name, "storage": kind, "trials_in_study": total,
                               "trials_run": total - done_before, "workers": workers}
    return total, info


def _params_of(space: SearchSpace, schedule: Any) -> dict[str, object]:
    point = space.point_of(schedule) or {}
    return {name: (space.candidates[name].index(value) if name in space.ordinal else value)
            for name, value in point.items()}


def _enqueued_params(trial: optuna.trial.FrozenTrial) -> object:
    """The parameters ``study.enqueue_trial`` gave a trial (None for a sampled one). Optuna has no
    public accessor: ``enqueue_trial`` keeps them in the trial's system attribute "fixed_params"
    (optuna/study/study.py), which is what this reads. A trial's ``params`` would not do: those of a
    sampled trial that happens to equal a guess would withdraw the guess."""
    return trial.system_attrs.get("fixed_params")


def _overflow(cand: Candidate) -> float:
    """How far the schedule is over SBUF or PSUM capacity (0 when it fits): TPE prefers smaller."""
    cost = cand.cost
    sbuf = cost.sbuf_bytes_per_partition / cost.sbuf_capacity - 1.0
    psum = cost.psum_banks / cost.psum_capacity - 1.0
    return max(sbuf, psum, 0.0)

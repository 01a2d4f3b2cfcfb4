"""Pick the best schedule of a space: Optuna TPE over the candidate lists (:mod:`.trials`), or
exhaustive enumeration when the space of distinct schedules is small, then a local polish (and, where the evaluator
has late variants, a last descent that costs them: :func:`_late`).

Every candidate is lowered to its loop-nest program and costed by the analytic model, the same
program codegen would print. Schedules over the target's SBUF or PSUM are infeasible: Optuna sees
the overflow as a constraint (TPE's ``constraints_func``) and they never win.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import InputError, ScheduleError
from ..workers.cores import idle_core
from .candidates import Candidate, Evaluator, SpaceSpec, TuneResult
from .prefetch import CostWorker, can_fork

if TYPE_CHECKING:  # Optuna is imported by the searches that use it (.trials), not by importing this
    import optuna

DEFAULT_TRIALS = 150
DEFAULT_EXHAUSTIVE_THRESHOLD = 1000


def _neighbours(lists: dict[str, tuple], point: dict, exchange: tuple[str, ...]) -> list[dict]:
    """Every point one parameter away, plus 'exchange' moves that grow one block dimension by a
    step of its list while shrinking another (about the same SBUF footprint, a different reuse
    pattern), which single-parameter moves cannot reach when the footprint is tight. ``lists``: the values of
    each parameter (the sampled candidates, or :attr:`~.space.SearchSpace.fine`)."""
    out = []
    for name, values in lists.items():
        out += [{**point, name: value} for value in values if value != point[name]]
    for grow, shrink in itertools.permutations(exchange, 2):
        g_vals, s_vals = lists[grow], lists[shrink]
        g, s = g_vals.index(point[grow]), s_vals.index(point[shrink])
        if g + 1 < len(g_vals) and s >= 1:
            out.append({**point, grow: g_vals[g + 1], shrink: s_vals[s - 1]})
    return out


def _polish(evaluate: Evaluator, spec: SpaceSpec, start: Candidate) -> Candidate:
    """Descent over :func:`_neighbours` of the sampled candidates until no neighbour is better."""
    return _descend(evaluate, spec, start, spec.space.candidates, spec.space.exchange, fine=False)


def _refine(evaluate: Evaluator, spec: SpaceSpec, best: Candidate) -> Candidate:
    """From one start's coarse optimum, descent over the parameters with values only the polish visits
    (:attr:`~.space.SearchSpace.refine`), along their merged lists (:attr:`~.space.SearchSpace.fine`). After the
    coarse polish, not in it: a descent over more neighbours can take another first step and end in a worse basin
    (measured at 512 tokens), while this one only ever improves on the coarse optimum; and over those parameters
    only, so it adds a few schedules per polish start, not a third of the search. Where it moved, a descent over the
    other parameters' coarse lists follows, the refined values held."""
    refined = _refined_values(evaluate, spec, best)
    if refined is best:
        return best
    # the other parameters were chosen for the unrefined values: one more descent over their coarse lists, the refined
    # values held (Llama-3.1-8B's SVD MLP at keep 0.8, 1 token on LNC=2: 409.6 -> 408.0 us)
    others = {name: values for name, values in spec.space.candidates.items() if name not in spec.space.refine}
    return _descend(evaluate, spec, refined, others, (), fine=True)


def _refined_values(evaluate: Evaluator, spec: SpaceSpec, best: Candidate) -> Candidate:
    """:func:`_refine`'s first step: the descent over the refined parameters alone, along their merged lists."""
    if not spec.space.refine:
        return best
    lists = {name: spec.space.fine[name] for name in spec.space.refine}
    exchange = tuple(name for name in spec.space.exchange if name in lists)
    return _descend(evaluate, spec, best, lists, exchange, fine=True)


def _late(evaluate: Evaluator, spec: SpaceSpec, final: Candidate) -> Candidate:
    """From one start's optimum, the coarse descent again with the evaluator's late variants costed
    (:attr:`~.candidates.Evaluator.late_variants`): the optimum's own other forms first, then its neighbours'; then a
    descent over the structural parameters alone (:attr:`~.space.SearchSpace.classes`), which the coarse descent
    cannot take from a refined optimum (a 48 KiB block lies only in the merged lists): measured, Llama-3.2-3B's SVD
    MLP at 128 tokens on LNC=2 ended at lnc_split=hidden, 207.5 us, where intermediate costs 201.5. Only ever
    improves on ``final``; a few dozen schedules per start instead of a variant on every trial."""
    evaluate.late = True
    try:
        # the best form of the point ``final`` stands for: ``final`` itself or a late form of it (never worse: it
        # is one of the forms costed)
        best = _polish(evaluate, spec, evaluate(evaluate.raw.get(final.schedule, final.schedule)))
        classes = {name: spec.space.fine[name] for name in spec.space.classes}
        return _descend(evaluate, spec, best, classes, (), fine=True)
    finally:
        evaluate.late = False


def _descend(evaluate: Evaluator, spec: SpaceSpec, start: Candidate, lists: dict[str, tuple],
             exchange: tuple[str, ...], *, fine: bool) -> Candidate:
    """Best-improvement descent over :func:`_neighbours` in ``lists`` until no neighbour is better (``fine``: the
    points lie in :attr:`~.space.SearchSpace.fine`)."""
    best = start
    improved = True
    while improved:
        improved = False
        # The raw point (tiles before clipping to the problem) is what lies in the candidate lists.
        point = spec.space.point_of(evaluate.raw.get(best.schedule, best.schedule), fine=fine)
        if point is None:
            break
        neighbours = [spec.space.decode(neighbour) for neighbour in _neighbours(lists, point, exchange)]
        evaluate.prefetch(neighbours)  # the new ones costed at once, in two processes where the search has them
        for neighbour in neighbours:
            cand = evaluate(neighbour)
            if cand.cost.feasible and cand.order < best.order:
                best, improved = cand, True
    return best


POLISH_STARTS = 8
#: Schedules an exhaustive search costs at a time (shared between two processes with ``search(processes=2)``)
EXHAUSTIVE_SLICE = 64
#: A rival's optimum (:func:`_rivals`) takes the late descent only when it is within this factor of the best: the late
#: forms moved optima by up to ~1.5%, and the late descent from the rival's region cost most of the rival's schedules
#: (measured over vs_nkilib's 105 MLPs on LNC=2: every rival win kept, 9% more schedules costed instead of 17%)
RIVAL_LATE_MARGIN = 1.02
#: At most this many rival descents (:func:`_rivals`), one per value of the rival parameters, best starts first: every
#: rival win measured came from the first or the second (a third or fourth never won, at their cost)
RIVAL_DESCENTS = 2


def _polish_starts(ranked: list[Candidate], classes: tuple[str, ...]) -> list[Candidate]:
    """The best schedule of each structural class (where partial sums live, DMA grouping, A^T
    strategy), for the best few classes: coordinate descent cannot cross between classes (moving
    one parameter at a time out of a class's optimum usually makes things worse), so each
    promising class gets its own descent."""
    starts: dict[tuple, Candidate] = {}
    for cand in ranked:
        starts.setdefault(_class_key(cand, classes), cand)
    return list(starts.values())[:POLISH_STARTS]


def _class_key(cand: Candidate, classes: tuple[str, ...]) -> tuple:
    return tuple(getattr(cand.schedule, name) for name in classes)


def _rivals(evaluate: Evaluator, spec: SpaceSpec, starts: list[Candidate], finals: list[Candidate]) -> list[Candidate]:
    """For each value of the rival parameters (:attr:`~.space.SearchSpace.rivals`, ``lnc_split``) other than the
    winner's, the best polish start with that value in whose class no descent ended, polished within its class and
    refined (at most :data:`RIVAL_DESCENTS` of them, best starts first). The free descents cross classes one parameter
    at a time and tend to end in one class: a class whose optimum needs several parameters to move together is lost.
    Measured, Llama-3.1-8B's SVD MLP at keep 0.9 and 1 token on LNC=2: every descent ended at lnc_split=gather,
    454.6 us; the hidden split's start, held in its class, reaches 448.1 (192 KiB blocks of 2 K tiles, 2 PE column
    tiles). And Qwen3-4B's SVD MLP at keep 0.8 and 96 tokens on LNC=2 under an HBM share of 0.5 (benchmarks/lnc.py):
    every descent ended at hidden, 476.8 us; the intermediate split's start was already its class's optimum (490.1),
    the gather split's, held in its class, reaches 422.2. One descent per split value, not one per start: holding
    every start in its class cost 60% more search time and lost 3-5% at 512 tokens, where leaving a class paid."""
    if not spec.space.rivals:
        return []
    classes = spec.space.classes
    winner = min(finals, key=lambda c: c.order)
    reached = {_class_key(final, classes) for final in finals}
    taken = {tuple(getattr(winner.schedule, name) for name in spec.space.rivals)}
    lists = {name: values for name, values in spec.space.candidates.items() if name not in classes}
    exchange = tuple(name for name in spec.space.exchange if name in lists)
    out: list[Candidate] = []
    for start in starts:
        if len(out) == RIVAL_DESCENTS:
            break
        value = tuple(getattr(start.schedule, name) for name in spec.space.rivals)
        if _class_key(start, classes) in reached or value in taken:
            continue
        taken.add(value)
        out.append(_refine(evaluate, spec, _descend(evaluate, spec, start, lists, exchange, fine=False)))
    return out


def search(spec: SpaceSpec, evaluate: Evaluator, *, what: str, trials: int = DEFAULT_TRIALS, seed: int = 0,
           timeout: float | None = None, exhaustive_threshold: int = DEFAULT_EXHAUSTIVE_THRESHOLD,
           top_k: int = 5, force: str | None = None,
           progress: Callable[[int, int, float], None] | None = None, storage: str | None = None,
           study_name: str | None = None, workers: int = 1,
           setup: Callable[[], tuple[SpaceSpec, Evaluator]] | None = None, processes: int = 1) -> TuneResult:
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
    rebuilding the space and the evaluator with ``setup`` (picklable). Any number of processes
    (each with any number of workers) may search one study at once: the study ends with exactly
    ``trials`` COMPLETE trials (a trial asked when no slot is left is marked FAIL unrun, see
    :func:`~.trials._trial_loop`) and every process returns the result of the whole study.
    Concurrent runs are not bit-reproducible (the interleaving decides which history each trial
    sees). An exhaustive search never uses the storage.

    ``processes`` > 1: the polish's descent steps (and an exhaustive enumeration, a slice at a time) cost their new
    schedules in two processes (:mod:`.prefetch`, a worker forked when this process runs no other thread and a core
    is idle, :func:`~neuronmm_compiler.workers.cores.idle_core`), with the same result; the trials stay in this one
    (each depends on the last).
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
    if method != "exhaustive":
        from .trials import run_optuna, run_stored
    parallel = processes > 1 and can_fork() and idle_core()
    try:
        if method == "exhaustive":
            evaluate.worker = CostWorker(evaluate.cost) if parallel else None
            done, schedules = 0, iter(spec.distinct())
            while chunk := list(itertools.islice(schedules, EXHAUSTIVE_SLICE)):
                evaluate.prefetch(chunk)
                for sched in chunk:
                    evaluate(sched)
                    done += 1
                    if progress:
                        progress(done, spec.size, evaluate.best)
        elif storage is None:
            n_trials = run_optuna(evaluate, spec, trials, seed, timeout, progress)
        else:
            n_trials, study_info, evaluate = run_stored(evaluate, spec, what=what, trials=trials, seed=seed,
                                                         timeout=timeout, progress=progress, storage=storage,
                                                         study_name=study_name, workers=workers, setup=setup)
        if parallel and evaluate.worker is None:  # forked now, with what the trials built
            evaluate.worker = CostWorker(evaluate.cost)
        return _result(evaluate, spec, what=what, method=method, trials=n_trials, top_k=top_k, started=start,
                       study=study_info)
    finally:
        if evaluate.worker is not None:
            evaluate.worker.close()
            evaluate.worker = None


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
    from .trials import check_fingerprint, warm

    started = time.perf_counter()
    kind = storage_kind(storage) if storage else None
    check_fingerprint(study, what, spec, kind=kind or "the")
    seen: list[int | None] = []
    warm(study, evaluate, spec, seen)
    if not seen:
        raise InputError(f"study {study.study_name!r} holds no completed trial")
    info: dict[str, object] = {"name": study.study_name, "storage": kind,
                               "trials_in_study": len(seen), "trials_run": 0, "workers": 1,
                               "search_seconds": recorded_seconds(study)}
    result = _result(evaluate, spec, what=what, method="optuna", trials=len(seen), top_k=top_k, started=started,
                     study=info)
    info["rebuilt_seconds"] = result.seconds
    return result


#: Prefix of the study attributes in which each ``nmmc tune`` run records its search's wall time
#: (one attribute per run, so concurrent runs never overwrite each other's).
SECONDS_ATTR = "nmmc_seconds:"


def recorded_seconds(study: optuna.Study) -> float | None:
    """The wall time the ``nmmc tune`` runs on ``study`` recorded, summed (None: none recorded)."""
    times = [float(v) for k, v in study.user_attrs.items() if k.startswith(SECONDS_ATTR)]
    return sum(times) if times else None


def _result(evaluate: Evaluator, spec: SpaceSpec, *, what: str, method: str, trials: int, top_k: int,
            started: float, study: dict[str, object] | None) -> TuneResult:
    """The TuneResult of an evaluator holding a finished search: after an Optuna search, the best
    schedule polished from the best of each structural class and from rivals of the winner's split."""
    ranked = evaluate.ranked()
    if not ranked:
        raise ScheduleError(f"no schedule of the search space fits on chip for {what}")
    best = ranked[0]
    if method == "optuna":
        starts = _polish_starts(ranked, spec.space.classes)
        finals = [_refine(evaluate, spec, _polish(evaluate, spec, s)) for s in starts]
        rivals = _rivals(evaluate, spec, starts, finals)
        best = min([*finals, *rivals], key=lambda c: c.order)
        finals += [rival for rival in rivals if rival.latency_us <= RIVAL_LATE_MARGIN * best.latency_us]
        ranked = evaluate.ranked()
    else:
        finals = _polish_starts(ranked, spec.space.classes)
    if evaluate.late_variants is not None:
        best = min([best, *(_late(evaluate, spec, f) for f in finals)], key=lambda c: c.order)
        ranked = evaluate.ranked()
    return TuneResult(best=best, top=ranked[:top_k], method=method, trials=trials, evaluated=len(evaluate.memo),
                      feasible=sum(c.cost.feasible for c in evaluate.memo.values()), space_size=spec.size,
                      seconds=time.perf_counter() - started, history=list(evaluate.history),
                      trial_history=list(evaluate.trial_history), study=study,
                      candidates=list(evaluate.memo.values()))

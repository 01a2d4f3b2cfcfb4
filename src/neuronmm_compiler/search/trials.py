"""Optuna trials: the seeded trial loop (each trial's sample depends only on the seed, the number
of completed trials and the stored history), stored studies (resumable, fingerprinted by workload)
and worker processes sharing one study.

The module is longer than the project's 400-line guideline on purpose: it is one protocol. How a
process reserves a trial slot, tells a trial, recognizes a dead owner's trial and catches up with
other processes' trials only keeps "exactly --trials COMPLETE, every process the same result"
when read and changed together; split across modules, its invariants would be too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import random
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from ..errors import InputError
from .candidates import Candidate, Evaluator, SpaceSpec
from .space import SearchSpace

_OWNER_ATTR = "nmmc_owner"  # "host:pid" of the process running a trial, to recognize trials of dead processes
_FINGERPRINT_ATTR = "nmmc_fingerprint"
_WORKLOAD_ATTR = "nmmc_workload"  # the search's description of its workload ('nmmc tune' replaces it by the JSON form)
_WHAT_ATTR = "nmmc_what"  # the search's description of its workload, kept as written
_GUESS_ATTR = "nmmc_guess"  # the heuristic guess (parameters) a trial runs
_SURPLUS_ATTR = "nmmc_surplus"  # a trial asked when no slot was left, failed unrun
_STUCK_S = 120.0  # a live RUNNING trial holding a slot others wait for longer than this is failed
_OPEN_ATTEMPTS = 8
_POLL_S = 0.05  # how often a process waiting for other processes' last trials looks again


def _trial_seed(seed: int, done: int, worker: int | str = 0) -> int:
    """The sampler seed of the trial that starts when ``done`` trials are complete."""
    digest = hashlib.sha256(f"nmmc-trial:{seed}:{done}:{worker}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _seeded_tpe(seed: int, n_startup: int, constant_liar: bool, states: list[Any]) -> optuna.samplers.TPESampler:
    """``TPESampler(seed=seed, n_startup_trials=n_startup, constant_liar=constant_liar)``, its two random states (its
    own and its random sampler's, both seeded with ``seed``) taken from ``states`` and re-seeded: Optuna seeds a new
    state from the system's entropy before seeding it (~0.2 ms each, per trial); ``.seed`` on a kept one gives the
    same state in microseconds. ``states`` is filled on first use and shared by one trial loop's samplers (one trial
    at a time). An Optuna without these attributes is seeded its own way."""
    sampler = optuna.samplers.TPESampler(seed=None, n_startup_trials=n_startup, constant_liar=constant_liar)
    lazy = [getattr(sampler, "_rng", None), getattr(getattr(sampler, "_random_sampler", None), "_rng", None)]
    if not all(hasattr(state, "_rng") for state in lazy):
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup, constant_liar=constant_liar)
    if not states:
        states += [state.rng for state in lazy]  # created unseeded (lazily, by the property), seeded below
    for state, kept in zip(lazy, states, strict=True):
        kept.seed(seed=seed)
        state._rng = kept
    return sampler


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


class _TrialSampler(optuna.samplers.BaseSampler):
    """``base`` (a TPE sampler seeded for one trial) except that the parameters in ``fixed`` take
    those values (one heuristic guess run as a trial: ``Study.enqueue_trial`` would do the same
    through a WAITING trial, but on SQLite two processes can both pop one WAITING trial, then both
    run and tell it), and that the relative search space is taken from ``memo`` once known.

    The relative search space is the intersection of the distributions of the COMPLETE trials
    (Optuna's ``IntersectionSearchSpace``); every trial of an nmmc study suggests every parameter
    of one fixed space with the same distributions, so once non-empty it never changes. A fresh
    sampler per trial would recompute it over every stored trial each time (quadratic in the
    trials); ``memo``, shared by the trial loop's samplers, keeps the first non-empty one."""

    def __init__(self, base: optuna.samplers.BaseSampler, fixed: dict[str, object] | None,
                 memo: dict[str, dict[str, Any]]) -> None:
        self._base, self._fixed, self._memo = base, fixed or {}, memo

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        space = self._memo.get("space")
        if space is None:
            space = self._base.infer_relative_search_space(study, trial)
            if space:
                self._memo["space"] = space
        return {name: dist for name, dist in space.items() if name not in self._fixed}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]) -> dict[str, Any]:
        return self._base.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: Any) -> Any:
        if param_name in self._fixed:
            return self._fixed[param_name]
        return self._base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: optuna.trial.TrialState,
                    values: Any) -> None:
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()


def _owner_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _started(t: optuna.trial.FrozenTrial, now: float) -> float:
    return t.datetime_start.timestamp() if t.datetime_start else now


def _is_live(t: optuna.trial.FrozenTrial, me: str, host: str, now: float) -> bool:
    """Whether RUNNING trial ``t`` may still finish: its owner is another live process on this host,
    or a process on another host (which cannot be checked). A trial without owner tag is dead: this
    nmmc creates every trial already tagged (:func:`_ask_owned`), so one without a tag was left by
    an older nmmc killed between Optuna's ask and its tagging, or by another Optuna client. A
    trial tagged with this process is live only while this process runs it, which the caller
    knows: here it is a leftover."""
    owner = t.user_attrs.get(_OWNER_ATTR)
    if owner is None:
        return False
    if owner == me:
        return False
    owner_host, _, pid = str(owner).rpartition(":")
    if owner_host != host or not pid.isdigit():
        return True
    return _pid_alive(int(pid))


def _ask_owned(study: optuna.Study, user_attrs: dict[str, object]) -> optuna.Trial:
    """``study.ask()``, except that the trial is created holding ``user_attrs`` (its owner tag) in
    the same storage write. Tagging after ``ask`` left a window in which a killed process leaves a
    RUNNING trial without owner, which a resuming process could not tell from another process's
    trial being started: it counted it as live, salted its samples as a contended process does, and
    so resumed to a different search than the uninterrupted one. Optuna's ``ask`` takes no
    attributes, so this does what it does through the storage's ``create_new_trial`` template
    (optuna/study/study.py, ``Study.ask``): drop the study's per-ask trial cache, create the
    trial, wrap it in a ``Trial`` (which runs the sampler's ``before_trial``)."""
    template = FrozenTrial(number=-1, state=optuna.trial.TrialState.RUNNING, value=None,
                           datetime_start=datetime.now(), datetime_complete=None, params={}, distributions={},
                           user_attrs=dict(user_attrs), system_attrs={}, intermediate_values={}, trial_id=-1)
    study._thread_local.cached_all_trials = None  # as ask() does: the sampler reads the storage anew
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    return optuna.Trial(study, trial_id)


def _tell(study: optuna.Study, trial: optuna.Trial, value: float) -> optuna.trial.TrialState:
    """``study.tell(trial, value, skip_if_finished=True).state``, without the deep copy of the trial that ``tell``
    returns (a tenth of an in-memory trial loop's own time, measured with 150 trials): Optuna's ``tell`` is
    ``_tell_with_warning`` and that copy (optuna/study/study.py, ``Study.tell``), so the trial is told the same way.
    An Optuna without that function tells through ``tell``."""
    tell_with_warning = getattr(getattr(optuna.study, "_tell", None), "_tell_with_warning", None)
    if tell_with_warning is None:
        return study.tell(trial, value, skip_if_finished=True).state
    return tell_with_warning(study=study, trial=trial, value_or_values=value, skip_if_finished=True)[0]


def _finish(study: optuna.Study, number: int, state: optuna.trial.TrialState) -> None:
    """Tell ``state`` for trial ``number`` unless it is finished already (telling is idempotent;
    another process may finish it between the check and the write, which is fine too)."""
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
        study.tell(number, state=state, skip_if_finished=True)


def _slot_is_free(study: optuna.Study, number: int, trials: int, me: str) -> bool:
    """Whether trial ``number`` (just asked, tagged with this process) may run without the study
    ending over ``trials`` COMPLETE trials: fewer than ``trials`` trials are COMPLETE or live
    RUNNING with a smaller number. Trial numbers are given atomically by the storage, so of trials
    asked concurrently for the last free slots exactly the lowest-numbered ones run."""
    host, now = socket.gethostname(), time.time()
    complete, running = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING
    taken = sum(t.state == complete or (t.number < number and _is_live(t, me, host, now))
                for t in study.get_trials(deepcopy=False, states=(complete, running)))
    return taken < trials


def _trial_loop(study: optuna.Study, evaluate: Evaluator, spec: SpaceSpec, trials: int, seed: int,
                timeout: float | None, progress: Callable[[int, int, float], None] | None, *,
                worker: int = 0, constant_liar: bool = False, seen: list[int | None] | None = None) -> int:
    """Run trials one at a time until the study holds ``trials`` COMPLETE trials (or ``timeout``).

    Before each trial the sampler is replaced by one seeded from (seed, COMPLETE trials, worker), so
    the sample depends only on those and the stored history, never on this process's past. The
    heuristic guesses run first, in order, each unless a running or complete trial holds it.

    Several processes may run this loop on one study: a trial starts only while COMPLETE plus
    live RUNNING trials are fewer than ``trials`` (else the loop waits for them), and once asked it
    runs only if it got a free slot (:func:`_slot_is_free`), else it is marked FAIL (``nmmc_surplus``)
    unrun; a trial some other process finished meanwhile (judged dead) is dropped, not told again.
    When other processes are running trials, the sample is also salted with this process's tag
    (and the sampler lies constant about their trials), so concurrent processes do not draw the
    same point. Each trial costed here is appended to ``seen``: its number, or None if it did
    not end COMPLETE. Returns the trials this call completed."""
    started = time.perf_counter()
    space, state = spec.space, optuna.trial.TrialState
    ordinal = space.ordinal
    guesses = _guess_params(spec)
    n_startup = min(20, max(trials // 5, 1))
    me, host = _owner_tag(), socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(state.RUNNING,)):
        if t.user_attrs.get(_OWNER_ATTR) == me:  # left by an earlier attempt of this process
            _finish(study, t.number, state.FAIL)
    ran = 0
    waiting_since: tuple[int, float] | None = None
    relative_space: dict[str, dict[str, Any]] = {}
    states: list[Any] = []  # the samplers' random states (_seeded_tpe)
    while timeout is None or time.perf_counter() - started < timeout:
        existing = study.get_trials(deepcopy=False)
        done = sum(t.state == state.COMPLETE for t in existing)
        if done >= trials:
            break
        now = time.time()
        live = [t for t in existing if t.state == state.RUNNING and _is_live(t, me, host, now)]
        if done + len(live) >= trials:
            # Every slot left is taken by another process's trial: wait for them (one whose
            # process dies frees its slot). Trials stuck longer than _STUCK_S are failed.
            if waiting_since is None or waiting_since[0] != done:
                waiting_since = (done, now)
            elif now - waiting_since[1] > _STUCK_S:
                for t in live:
                    if now - _started(t, now) > _STUCK_S:
                        _finish(study, t.number, state.FAIL)
            time.sleep(_POLL_S)
            continue
        waiting_since = None
        live_numbers = {t.number for t in live}
        held = [_guess_of(t) for t in existing if t.state == state.COMPLETE or t.number in live_numbers]
        guess = next((g for g in guesses if g not in held), None)
        contended = bool(live)
        lane = f"{worker}@{me}" if contended else worker
        sampler: optuna.samplers.BaseSampler = _seeded_tpe(_trial_seed(seed, done, lane), n_startup,
                                                           constant_liar or contended, states)
        study.sampler = _TrialSampler(sampler, guess, relative_space)
        trial = _ask_owned(study, {_OWNER_ATTR: me} if guess is None else {_OWNER_ATTR: me, _GUESS_ATTR: guess})
        cand = None
        try:
            if not _slot_is_free(study, trial.number, trials, me):
                trial.set_user_attr(_SURPLUS_ATTR, True)
                _finish(study, trial.number, state.FAIL)
                continue
            point = {}
            for name, values in space.candidates.items():
                if name in ordinal:
                    point[name] = values[trial.suggest_int(name, 0, len(values) - 1)]
                else:
                    point[name] = trial.suggest_categorical(name, list(values))
            cand = evaluate(space.decode(point))
            trial.set_constraint("on_chip_overflow", _overflow(cand))
            told = _tell(study, trial, cand.latency_us)
        except optuna.exceptions.UpdateFinishedTrialError:
            # Another process judged this trial dead and failed it: its slot is free again.
            if seen is not None and cand is not None:
                seen.append(None)
            continue
        except BaseException:
            with contextlib.suppress(Exception):  # the storage may be what failed: raise the cause
                _finish(study, trial.number, state.FAIL)
            raise
        if seen is not None:
            seen.append(trial.number if told == state.COMPLETE else None)
        if told != state.COMPLETE:
            continue
        ran += 1
        evaluate.trial_history.append(evaluate.best)
        if progress:
            progress(done + 1, trials, evaluate.best)
    return ran


def run_optuna(evaluate: Evaluator, spec: SpaceSpec, trials: int, seed: int,
                timeout: float | None, progress: Callable[[int, int, float], None] | None) -> int:
    optuna.logging.set_verbosity(logging.WARNING)
    study = optuna.create_study(direction="minimize")
    return _trial_loop(study, evaluate, spec, trials, seed, timeout, progress)


def _fingerprint(what: str, spec: SpaceSpec) -> str:
    text = json.dumps({"workload": what, "space": {k: list(v) for k, v in spec.space.candidates.items()},
                       "ordinal": list(spec.space.ordinal)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def check_fingerprint(study: optuna.Study, what: str, spec: SpaceSpec, *, kind: str) -> None:
    """InputError when ``study`` records another workload or schedule space than (``what``, ``spec``)."""
    recorded = study.user_attrs.get(_FINGERPRINT_ATTR)
    if recorded is not None and recorded != _fingerprint(what, spec):
        described = study.user_attrs.get(_WHAT_ATTR, study.user_attrs.get(_WORKLOAD_ATTR))
        if not isinstance(described, str):  # a study from before nmmc_what, its workload as JSON
            described = "another workload"
        raise InputError(f"study {study.study_name!r} in {kind} storage was created for "
                         f"{described}, not {what}; use another study name")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fail_dead_trials(study: optuna.Study) -> int:
    """Mark FAIL the RUNNING trials that cannot finish (:func:`_is_live`): those of processes on
    this host that no longer exist (a killed run), and those without owner tag. Trials of other
    hosts are left alone: they may be running. FAIL trials are never counted nor sampled from."""
    me, host, now = _owner_tag(), socket.gethostname(), time.time()
    failed = 0
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if t.user_attrs.get(_OWNER_ATTR) != me and not _is_live(t, me, host, now):
            _finish(study, t.number, optuna.trial.TrialState.FAIL)
            failed += 1
    return failed


def _transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is storage contention that a retry
    gets past: processes creating the same tables or version row at once ("table ... already
    exists", a unique violation), or a busy SQLite file ("database is locked")."""
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{type(seen).__name__}: {seen}"
        if any(word in text for word in ("IntegrityError", "UniqueViolation", "DuplicateTable", "already exists",
                                         "database is locked", "DuplicatedStudyError")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _open_study(storage: str, study_name: str) -> optuna.Study:
    """The study ``study_name`` in ``storage``, created if missing. Several processes may do this at
    once on a fresh storage: creating the schema (SQLAlchemy's create_all, Alembic's version row)
    is not atomic across processes, so the loser of such a race retries; creating the study itself
    is (``load_if_exists``)."""
    from .storage import open_storage

    for attempt in range(_OPEN_ATTEMPTS):
        try:
            return optuna.create_study(storage=open_storage(storage), study_name=study_name, load_if_exists=True,
                                       direction="minimize")
        except Exception as exc:
            if attempt == _OPEN_ATTEMPTS - 1 or not _transient(exc):
                raise
            time.sleep(0.05 * (attempt + 1) * (1 + random.random()))
    raise AssertionError("unreachable")


def warm(study: optuna.Study, evaluate: Evaluator, spec: SpaceSpec, seen: list[int | None]) -> None:
    """Cost the schedules of the study's COMPLETE trials not in ``seen`` (trial numbers, in the
    order ``evaluate`` costed them; this appends to it), in trial order, extending the per-trial
    history as if this process had run them."""
    known = set(seen)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    for t in sorted(complete, key=lambda t: t.number):
        if t.number in known:
            continue
        seen.append(t.number)
        try:
            point = _point_of_params(spec, t.params)
        except (KeyError, IndexError, ValueError) as exc:
            raise InputError(f"study {study.study_name!r} holds a trial whose parameters are not in this "
                             f"search space ({exc}); use another study name") from exc
        evaluate(spec.space.decode(point))
        evaluate.trial_history.append(evaluate.best)


def _catch_up(study: optuna.Study, evaluate: Evaluator, spec: SpaceSpec,
              seen: list[int | None]) -> Evaluator:
    """``evaluate`` holding every COMPLETE trial of the study, as if costed in trial order (what
    :func:`~.tuner.result_from_study` rebuilds, so every process sharing a study ends with the same
    result). When ``seen`` is a prefix of that order (a single process, or workers whose trials all
    follow this process's earlier ones) the rest is appended; when other processes' trials
    interleave with this one's, or a trial costed here did not end COMPLETE, a fresh evaluator is
    warmed from the study instead."""
    complete = sorted(t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if seen != complete[:len(seen)]:
        evaluate, seen[:] = evaluate.fresh(), []
    warm(study, evaluate, spec, seen)
    return evaluate


def _worker_main(setup: Callable[[], tuple[SpaceSpec, Evaluator]], storage: str, study_name: str, trials: int,
                 seed: int, timeout: float | None, worker: int) -> None:
    optuna.logging.set_verbosity(logging.WARNING)
    spec, evaluate = setup()
    for attempt in range(5):
        study = _open_study(storage, study_name)
        try:
            _trial_loop(study, evaluate, spec, trials, seed, timeout, None, worker=worker, constant_liar=True)
            return
        except Exception as exc:  # storage contention ("database is locked") on a loaded machine: retry
            transient = "OperationalError" in type(exc).__name__ or _transient(exc)
            if not transient or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def run_stored(evaluate: Evaluator, spec: SpaceSpec, *, what: str, trials: int, seed: int,
                timeout: float | None, progress: Callable[[int, int, float], None] | None, storage: str,
                study_name: str | None, workers: int,
                setup: Callable[[], tuple[SpaceSpec, Evaluator]] | None
                ) -> tuple[int, dict[str, object], Evaluator]:
    """Search the stored study until it holds ``trials`` COMPLETE trials (this process's trials,
    its workers' and those of any other process on the study). Returns the COMPLETE trials, the
    study summary and the evaluator holding every COMPLETE trial in trial order (``evaluate`` itself
    unless other processes' trials interleaved with this one's, see :func:`_catch_up`)."""
    from .storage import storage_kind

    optuna.logging.set_verbosity(logging.WARNING)
    kind = storage_kind(storage)
    fingerprint = _fingerprint(what, spec)
    name = study_name or f"nmmc-{fingerprint[:16]}"
    study = _open_study(storage, name)
    if study.user_attrs.get(_FINGERPRINT_ATTR) is None:
        study.set_user_attr(_FINGERPRINT_ATTR, fingerprint)
        study.set_user_attr(_WORKLOAD_ATTR, what)
        study.set_user_attr(_WHAT_ATTR, what)
    check_fingerprint(study, what, spec, kind=kind)
    _fail_dead_trials(study)
    seen: list[int | None] = []
    warm(study, evaluate, spec, seen)
    before = {t.number for t in study.get_trials(deepcopy=False)}
    owners = {_owner_tag()}  # the processes of this call: its trials are the ones they completed
    if workers == 1:
        _trial_loop(study, evaluate, spec, trials, seed, timeout, progress, seen=seen)
    else:
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_worker_main, args=(setup, storage, name, trials, seed, timeout, i + 1),
                             name=f"nmmc-tune-worker-{i + 1}") for i in range(workers)]
        for proc in procs:
            proc.start()
            owners.add(f"{socket.gethostname()}:{proc.pid}")
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
            _trial_loop(study, evaluate, spec, trials, seed, timeout, progress, seen=seen)
    evaluate = _catch_up(study, evaluate, spec, seen)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    ran = sum(t.number not in before and t.user_attrs.get(_OWNER_ATTR) in owners for t in complete)
    info: dict[str, object] = {"name": name, "storage": kind, "trials_in_study": len(complete),
                               "trials_run": ran, "workers": workers}
    total = len(complete)
    return total, info, evaluate


def _params_of(space: SearchSpace, schedule: Any) -> dict[str, object]:
    point = space.point_of(schedule) or {}
    return {name: (space.candidates[name].index(value) if name in space.ordinal else value)
            for name, value in point.items()}


def _guess_of(trial: optuna.trial.FrozenTrial) -> object:
    """The heuristic guess a trial runs (None for a sampled one): its ``nmmc_guess`` attribute, or
    for a trial of an older nmmc, which ran guesses through ``study.enqueue_trial``, the
    parameters Optuna keeps in the system attribute "fixed_params" (optuna/study/study.py). A
    trial's ``params`` would not do: those of a sampled trial that happens to equal a guess would
    withdraw the guess."""
    guess = trial.user_attrs.get(_GUESS_ATTR)
    return guess if guess is not None else trial.system_attrs.get("fixed_params")


def _overflow(cand: Candidate) -> float:
    """How far the schedule is over SBUF or PSUM capacity (0 when it fits): TPE prefers smaller."""
    cost = cand.cost
    sbuf = cost.sbuf_bytes_per_partition / cost.sbuf_capacity - 1.0
    psum = cost.psum_banks / cost.psum_capacity - 1.0
    return max(sbuf, psum, 0.0)

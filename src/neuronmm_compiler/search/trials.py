"""Optuna trials: the seeded trial loop (each trial's sample depends only on the seed, the number
of completed trials and the stored history), stored studies (resumable, fingerprinted by workload)
and worker processes sharing one study."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import optuna

from ..errors import InputError
from .candidates import Candidate, Evaluator, SpaceSpec
from .space import SearchSpace

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


def warm(study: optuna.Study, evaluate: Evaluator, spec: SpaceSpec, seen: set[int]) -> None:
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


def run_stored(evaluate: Evaluator, spec: SpaceSpec, *, what: str, trials: int, seed: int,
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
    check_fingerprint(study, what, spec, kind=kind)
    _fail_dead_trials(study)
    seen: set[int] = set()
    warm(study, evaluate, spec, seen)
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
        warm(study, evaluate, spec, seen)
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

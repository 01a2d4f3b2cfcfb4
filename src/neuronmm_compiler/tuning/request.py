"""``nmmc tune`` as a user request: the search (answered from the result cache when it can be),
then what the request asked for besides the kernel (study records, plots, a lock entry,
verification), then the kernel file and the report; and ``nmmc report``'s way back from a stored
study to its search. The command functions only parse options; the views are in :mod:`.report`."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..driver import Tuned, tune_cached
from ..errors import InputError
from ..frontends.workloads import Workload
from ..jobs import Job, ProgressFn, SearchSettings, resolve
from ..targets import Target

Echo = Callable[..., None]


@dataclass(frozen=True)
class TuneRequest:
    """One ``nmmc tune``: where (target, dialect, Neuron SDK release; None: the newest), how the search runs
    (:class:`~.jobs.SearchSettings`), and what the command adds around it (worker processes of ``tune --model``, the
    result cache, the progress bar)."""

    target: Target
    dialect: str
    search: SearchSettings = field(default_factory=SearchSettings)
    sdk: str | None = None
    jobs: int = 1  # processes: tune --model's searches run at once, one search's polish in two (SearchSettings)
    cache_dir: str | None = None
    use_cache: bool = True
    progress: bool = False
    progress_label: str = "tuning"  # what the progress bar says it is doing (a model's bucket, say)

    def settings(self, progress: ProgressFn | None = None) -> SearchSettings:  # the driver's, with a progress callback
        return replace(self.search, progress=progress, processes=self.jobs)

    def job(self, workload: Workload) -> Job:  # ``workload`` resolved for this request's target, dialect and SDK
        return resolve(workload, self.target, self.dialect, self.sdk)


def search(workload: Workload, request: TuneRequest, echo: Echo) -> tuple[Tuned, str | None]:
    """(tuned, the cache directory that answered or None), with the progress bar and the cache
    warnings the request asks for."""
    tuned, from_cache, commit = search_uncommitted(workload, request, echo)
    commit()
    return tuned, from_cache


def search_uncommitted(workload: Workload, request: TuneRequest,
                       echo: Echo) -> tuple[Tuned, str | None, Callable[[], None]]:
    """:func:`search` without writing its outcome to the result cache: the third item writes it
    (and prints the cache's warnings), for the caller to call once all its outputs are written."""
    from ..artifacts.cache import ResultCache
    from ..driver import store_tuned
    from .report import progress_bar

    if request.search.workers > 1 and not request.search.storage:
        raise InputError("--workers shares a study between processes: give --storage too (e.g. sqlite:///tune.db)")
    cache = ResultCache(Path(request.cache_dir) if request.cache_dir else None) if request.use_cache else None
    job = request.job(workload)
    update, close = progress_bar(request.progress, request.progress_label)
    try:
        tuned, from_cache = tune_cached(job, request.settings(update), cache, store=False)
    finally:
        close()

    def commit() -> None:
        if cache is not None and not from_cache:
            store_tuned(job, tuned, request.settings(), cache)
        for warning in cache.warnings if cache else []:
            echo(f"nmmc: warning: {warning}", err=True)

    return tuned, str(cache.tune_dir) if cache is not None and from_cache else None, commit


def record_study(workload: Workload, tuned: Tuned, request: TuneRequest) -> None:
    """Tag the stored study with what it tuned, so ``nmmc report`` can rebuild its result, and with this
    run's wall time (the search's, this recording included: ``tuned.search.seconds`` grows by it)."""
    import socket
    import time

    import optuna

    from ..search.storage import open_storage
    from ..search.tuner import SECONDS_ATTR

    assert request.search.storage is not None and tuned.search.study is not None
    started = time.perf_counter()
    study = optuna.load_study(study_name=str(tuned.search.study["name"]), storage=open_storage(request.search.storage))
    study.set_user_attr("nmmc_workload", workload.to_dict())
    study.set_user_attr("nmmc_target", request.target.spec)
    study.set_user_attr("nmmc_dialect", request.dialect)
    tuned.search.seconds += time.perf_counter() - started
    run = f"{SECONDS_ATTR}{socket.gethostname()}:{os.getpid()}:{time.time():.6f}"
    study.set_user_attr(run, round(tuned.search.seconds, 3))


def study_report(url: str, study_name: str | None, out_dir: Path) -> list[Path]:
    """``nmmc report`` on a storage URL: the search of a study written by ``nmmc tune --storage``,
    rebuilt from its stored trials without running one (:func:`~.search.tuner.result_from_study`),
    plotted into ``out_dir``. ``study_name`` may be omitted when the storage holds one study."""
    import optuna

    from ..artifacts.report import write_report
    from ..frontends.workloads import workload_from_dict
    from ..lowerings import lowering_for
    from ..search.storage import open_storage
    from ..search.tuner import result_from_study
    from ..targets import get_target

    storage = open_storage(url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if study_name is None:
        if len(names) != 1:
            raise InputError(f"{url} holds {len(names)} studies; choose one with --study: {', '.join(names)}")
        study_name = names[0]
    if study_name not in names:
        raise InputError(f"no study {study_name!r} in {url}; studies: {', '.join(names) or 'none'}")
    study = optuna.load_study(study_name=study_name, storage=storage)
    attrs = study.user_attrs
    if "nmmc_workload" not in attrs:
        raise InputError(f"study {study_name!r} was not written by 'nmmc tune' (no workload recorded)")
    workload = workload_from_dict(attrs["nmmc_workload"])
    target = get_target(attrs.get("nmmc_target", "trn1"))
    lowering = lowering_for(workload)
    spec, evaluate = lowering.search_setup(workload, target, lowering.exhaustive_threshold)
    # ``what`` as driver.tune names the search: the study's fingerprint covers it.
    result = result_from_study(study, spec, evaluate, what=f"{workload.describe()} on {target.label}", storage=url)
    return write_report(result, target=target, out_dir=out_dir, title=f"{workload.describe()} (study {study_name})",
                        candidates=result.candidates or None)


def check_tune_outputs(request: TuneRequest, *, output: str, lock_path: str | None,
                       report_dir: str | None) -> None:
    """Check every path ``nmmc tune`` will write (-o, --lock, --report, --storage) before any work,
    so a command that cannot write one of them fails at once and writes nothing (InputError)."""
    from ..io import check_output_dir, check_output_file
    from ..search.storage import check_storage

    if output != "-":
        check_output_file(output)
    if lock_path:
        from ..artifacts.lockfile import Lockfile

        check_output_file(lock_path)
        Lockfile.load(lock_path)  # a malformed lockfile fails now, not after the search
    if report_dir:
        check_output_dir(report_dir)
    if request.search.storage:
        check_storage(request.search.storage)


def run_tune(workload: Workload, request: TuneRequest, *, verify: bool, lock_path: str | None,
             report_dir: str | None, as_json: bool, output: str, echo: Echo) -> bool:
    """The whole of ``nmmc tune`` for one workload; False when --verify found a wrong kernel.

    Every output path is checked first (:func:`check_tune_outputs`); the outputs are written only
    once everything they need was computed: the report into a temporary directory, then the kernel
    file, the lockfile, the report files and last the result cache entry, so a failing command
    leaves none of them behind."""
    from ..io import write_output
    from .dense_baseline import dense_baseline, with_nmmc_dense
    from .report import tune_json, tune_lines

    check_tune_outputs(request, output=output, lock_path=lock_path, report_dir=report_dir)
    with dense_baseline(workload, request, echo, search_uncommitted, store_searches) as dense:
        tuned, from_cache, commit_svd = search_uncommitted(workload, request, echo)
        tuned, commit_cache = with_nmmc_dense(workload, tuned, commit_svd, dense)
    if request.search.storage and tuned.search.study:
        record_study(workload, tuned, request)
    elif request.search.storage:
        echo(f"nmmc: note: --storage {request.search.storage} is unused: the {tuned.search.method} search keeps no "
             "Optuna study (use --method optuna to record one)", err=True)
    lock_text = None
    if lock_path:
        from ..artifacts.lockfile import Lockfile, entry_from_tuned

        lock = Lockfile.load(lock_path)
        lock.add(entry_from_tuned(workload, tuned, seed=request.search.seed,
                                  trials=request.search.trials_for(request.job(workload).lowering)))
        lock_text = lock.to_json()
    report = None
    if verify:
        from ..verification import verify_source

        report = verify_source(tuned.compiled.kernel.source, filename=output, rules=True)
    source = tuned.compiled.kernel.source
    with _staged_report(tuned, request, workload, report_dir) as publish_report:
        if output != "-":
            write_output(output, source)
        if lock_text is not None:
            write_output(lock_path, lock_text)  # type: ignore[arg-type]
        publish_report()
    if report is None or report.ok:  # a schedule whose kernel failed --verify is not one to answer with again
        commit_cache()
    if as_json:
        echo(json.dumps(tune_json(tuned, output, report), indent=2))
    elif output == "-":
        echo(source, nl=False)
    else:
        if from_cache:
            echo(f"answered from the cache ({from_cache}); --no-cache to search again")
        for line in tune_lines(tuned):
            echo(line)
        echo(f"wrote {output}")
    if report_dir and from_cache:
        from ..artifacts.report import CACHED_NO_PLOTS

        echo(f"nmmc: note: --report {report_dir}: no plots, only summary.md: this tune was {CACHED_NO_PLOTS}",
             err=True)
    if report is not None and not as_json:  # with --json the result is in the "verify" field
        status = "verified" if report.ok else "VERIFICATION FAILED"
        rel = f"{report.rel_error:.3e}" if report.rel_error is not None else "n/a"
        echo(f"{status}: relative error {rel}" + (f"; {report.error}" if report.error else ""), err=output == "-")
    return report is None or report.ok


def _tune_bucket(workload: Workload, bucket: int, *, request: TuneRequest, buckets: int, echo: Echo) -> Tuned:
    """One search of ``tune --model`` (a bucket's compressed or dense MLP) through the same search
    as a single ``nmmc tune`` (cache, timeout, method, top-k); module-level, so that worker
    processes can run it."""
    label = f"tuning bucket {bucket + 1}/{buckets} ({workload.token_count} tokens)"
    # not stored in the result cache here: run_model_tune stores every search once all its files are written, so
    # an interrupted (Ctrl-C) or failing command leaves no cache entry
    return search_uncommitted(workload, replace(request, progress_label=label), echo)[0]


def _lock_chosen(lock_path: str, index: dict[str, Any], searched: list[tuple[Workload, Tuned]],
                 request: TuneRequest) -> None:
    """Record each bucket's chosen kernel (its format in the entry's workload: ranks or dense, dtype, fp8) in the
    lockfile at ``lock_path``; of an output of layer groups, each group's in each bucket."""
    from ..artifacts.lockfile import Lockfile, entry_from_tuned
    from ..io import write_output
    from ..model_tuning.formats import kernel_buckets

    lock = Lockfile.load(lock_path)
    for entry in kernel_buckets(index):  # of a grouped output: one per (layer group, bucket)
        chosen = next(f["workload"] for f in entry["formats"] if f["chosen"])
        workload, tuned = next((w, t) for w, t in searched if w.to_dict() == chosen)
        lock.add(entry_from_tuned(workload, tuned, seed=request.search.seed,
                                  trials=request.search.trials_for(request.job(workload).lowering)))
    write_output(lock_path, lock.to_json())


def store_searches(searches: list[tuple[Workload, Tuned]], request: TuneRequest, echo: Echo) -> None:
    """Store the searches of a command whose outputs are all written in the result cache (those it answered from
    the cache are left as they are), and print the cache's warnings."""
    from ..artifacts.cache import ResultCache
    from ..driver import store_tuned

    if not request.use_cache or request.search.timeout is not None:
        return
    cache = ResultCache(Path(request.cache_dir) if request.cache_dir else None)
    for workload, tuned in searches:
        store_tuned(request.job(workload), tuned, request.settings(), cache, keep_existing=True)
    for warning in cache.warnings:
        echo(f"nmmc: warning: {warning}", err=True)


@contextlib.contextmanager
def _staged_report(tuned: Tuned, request: TuneRequest, workload: Workload,
                   report_dir: str | None) -> Iterator[Callable[[], None]]:
    """Write ``tune --report``'s files into a temporary directory in or next to ``report_dir`` and yield a
    function that moves them into ``report_dir`` (created if missing); the temporary directory is
    removed however the block ends. Yields a no-op without ``report_dir``."""
    if not report_dir:
        yield lambda: None
        return
    import shutil

    from ..artifacts.report import write_report
    from ..io import temp_name

    final = Path(report_dir)
    # Inside the directory when it exists (it may be all the user can write), else next to it.
    staging = temp_name(final / "report") if final.is_dir() else temp_name(final.resolve())
    try:
        paths = write_report(tuned.search, target=request.target, out_dir=staging, title=workload.describe(),
                             candidates=tuned.search.candidates or None)

        def publish() -> None:
            final.mkdir(exist_ok=True)
            for path in paths:
                os.replace(path, final / path.name)

        yield publish
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def run_model_tune(model: str, options: dict[str, Any], request: TuneRequest, *, target_name: str, verify: bool,
                   as_json: bool, output: str, echo: Echo, lock_path: str | None = None) -> bool:
    """``nmmc tune --model``: one tuned MLP kernel per token bucket (per allowed format, ``--dtype bf16,fp8``: the
    fastest predicted one recommended) and an index; with ``lock_path``, each bucket's chosen kernel recorded in that
    lockfile. False when --verify found a wrong kernel."""
    from ..model_tuning.formats import FormatRequest, kernel_buckets
    from ..model_tuning.pipeline import activation_scales, parse_buckets, resolve_model, tune_model
    from ..model_tuning.report import model_lines
    from .report import progress_bar

    allowed = {"tokens", "keep_ratio", "dense", "dtype", "a_layout", "act_scale"}
    given = [k for k, v in options.items() if k not in allowed and v not in (None, False, ())]
    if given:
        raise InputError("--model takes --tokens (buckets) and --keep-ratio or --dense; drop " +
                         ", ".join("--" + k.replace("_", "-") for k in given))
    if options["tokens"] is None:
        raise InputError("--model needs --tokens with the token buckets, e.g. --tokens 1,32,128,512,2048")
    if request.search.workers > 1:
        raise InputError("--workers shares a stored study between processes; --model tunes its buckets one after "
                         "another without a storage: drop --workers")
    source = resolve_model(model, options["keep_ratio"], dense=bool(options.get("dense")))
    buckets = parse_buckets(str(options["tokens"]))
    formats = FormatRequest.parse(options.get("dtype"))
    formats = replace(formats, act_scale=activation_scales(model, bool(options.get("dense")), formats.weights,
                                                           options.get("act_scale"), "tune --model"))
    if lock_path:
        from ..artifacts.lockfile import Lockfile
        from ..io import check_output_file

        check_output_file(lock_path)
        Lockfile.load(lock_path)  # a malformed lockfile fails now, not after the searches
    parallel = request.jobs > 1 and len(buckets) * 2 > 1
    searched: list[tuple[Workload, Tuned]] = []

    def written(searches: list[tuple[Workload, Tuned]]) -> None:
        searched.extend(searches)
        store_searches(searches, request=request, echo=echo)

    # In worker processes a per-trial bar would interleave: the bar counts finished buckets instead; each worker's
    # search then runs in its one process.
    tune_bucket = functools.partial(_tune_bucket, request=replace(request, progress=request.progress and not parallel,
                                                                  jobs=1 if parallel else request.jobs),
                                    buckets=len(buckets), echo=echo)
    update, close = progress_bar(request.progress and parallel, f"tuning {len(buckets)} buckets")
    try:
        index = tune_model(source, buckets, output, target=request.target, dialect=request.dialect, sdk=request.sdk,
                           tune_bucket=tune_bucket, jobs=request.jobs, progress=update, on_written=written,
                           formats=formats)
    finally:
        close()
    if lock_path:
        _lock_chosen(lock_path, index, searched, request)
    failures = []
    if verify:
        from ..verification import verify_file

        for entry in kernel_buckets(index):
            # a recommended dense kernel too (none where nki-library's MLP is recommended)
            for name in (n for n in dict.fromkeys((entry["file"], entry["recommended_file"])) if n):
                report = verify_file(Path(output) / name, rules=True)
                entry["verified"] = entry.get("verified", True) and report.ok
                if not report.ok:
                    failures.append(f"{name}: {report.error}")
        from ..model_tuning.pipeline import write_index

        write_index(output, index)  # with each bucket's "verified"
    if as_json:
        echo(json.dumps(index, indent=2))
    else:
        for line in model_lines(source, index, request.target, output):
            echo(line)
    for failure in failures:
        echo(f"VERIFICATION FAILED: {failure}", err=True)
    return not failures

"""nmmc's own dense MLP as a baseline of ``nmmc tune``: for an SVD MLP (and an FP8 dense one: its bf16 twin), the
fused dense MLP searched the same way as the workload, beside it (:func:`dense_baseline`), and added to its
baselines (:func:`with_nmmc_dense`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..driver import Tuned
from ..frontends.workloads import Workload
from ..workers.cores import idle_core

if TYPE_CHECKING:  # tuning.py runs these; it passes its search and store functions in
    from .request import Echo, TuneRequest

__all__ = ["dense_baseline", "with_nmmc_dense"]

#: ``tuning.search_uncommitted``: (tuned, the cache directory that answered or None, the commit storing it)
Search = Callable[[Workload, "TuneRequest", "Echo"], tuple[Tuned, "str | None", Callable[[], None]]]
#: ``tuning.store_searches``: store searches in the result cache (those answered from it skipped)
Store = Callable[[list[tuple[Workload, Tuned]], "TuneRequest", "Echo"], None]


@contextlib.contextmanager
def dense_baseline(workload: Workload, request: TuneRequest, echo: Echo, search: Search,
                   store: Store) -> Iterator[Callable[[], Any] | None]:
    """For an SVD MLP (and an FP8 dense one: its bf16 twin), nmmc's own fused dense MLP searched the same way (same
    target, launch context, trials and seed; cached alike; no --storage study) by ``search``: yields a function
    returning its tuned and the commit storing it (None for other workloads). With several cores (``request.jobs``),
    one of them idle (:func:`~.cores.idle_core`), it runs in a worker process (:mod:`.background`) while this one
    searches the workload, as ``tune --model`` runs a bucket's two searches, and is stored with ``store``; else it
    runs when the function is called."""
    from ..model_tuning.entries import dense_counterpart

    dense = dense_counterpart(workload)
    request = replace(request, search=replace(request.search, storage=None, study_name=None, workers=1),
                      progress_label="tuning nmmc's dense MLP (baseline)")
    if dense is None:
        yield None
        return
    if request.jobs <= 1 or not idle_core():

        def here() -> tuple[Tuned, Callable[[], None]]:
            tuned, _, commit = search(dense, request, echo)
            return tuned, commit

        yield here
        return
    from ..workers.background import Background

    worker = Background(_search_answered, search, dense, replace(request, progress=False, jobs=1),
                        name="nmmc-dense-baseline")

    def result() -> tuple[Tuned, Callable[[], None]]:
        tuned, answered = worker.result()  # its result cache read there, stored here with the other outputs
        return tuned, functools.partial(store, [] if answered else [(dense, tuned)], request, echo)

    try:
        yield result
    finally:
        worker.stop()  # still running only when this process's search failed


def _search_answered(search: Search, workload: Workload, request: TuneRequest) -> tuple[Tuned, bool]:
    """(tuned, whether the result cache answered) of one ``search``, nothing stored: a worker process's."""
    tuned, from_cache, _ = search(workload, request, lambda *_, **__: None)
    return tuned, from_cache is not None


def with_nmmc_dense(workload: Workload, tuned: Tuned, commit: Callable[[], None],
                    dense: Callable[[], Any] | None) -> tuple[Tuned, Callable[[], None]]:
    """``tuned`` with nmmc's fused dense MLP (:func:`dense_baseline`) among its baselines and a commit storing both
    searches; without one, unchanged."""
    from ..model_tuning.entries import with_dense_baseline

    if dense is None:
        return tuned, commit
    dense_tuned, commit_dense = dense()

    def commit_both() -> None:
        commit()
        commit_dense()

    return with_dense_baseline(tuned, dense_tuned, unquantized=not workload.svd), commit_both

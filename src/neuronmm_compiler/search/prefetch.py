"""Costing a batch of schedules in two processes: the new neighbours of one descent step of the polish (tens of
schedules a step, most of what a search costs), or a slice of an exhaustive enumeration.

A :class:`CostWorker` is forked from this process when the search's later steps begin (it starts with the cost
function and everything it has built), takes part of each batch while this process costs the rest, and sends its
reports back pickled. The search itself does not change: the cost function is pure (a schedule's report depends on
the schedule alone) and a pickled report is the same report bit for bit, so the evaluator (:mod:`.candidates`), which
takes the reports in its own order, records what costing them one by one records (memo, history, the schedules a
descent moves to). A schedule whose costing raised raises when the evaluator reaches it, as it would have.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["CostWorker", "Outcome", "can_fork", "outcome"]

#: (True, report) or (False, the exception costing raised)
Outcome = tuple[bool, Any]


def outcome(cost: Callable[[Any], Any], schedule: Any) -> Outcome:
    """``cost(schedule)``, or the exception it raised (raised again where the evaluator takes the report)."""
    try:
        return True, cost(schedule)
    except Exception as exc:
        return False, exc


def can_fork() -> bool:
    """Whether a worker can be forked safely here: the platform forks and this process runs no other thread (a
    thread holding a lock at the fork would leave it held in the worker)."""
    return "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1


def _serve(connection: Connection, cost: Callable[[Any], Any]) -> None:
    """The worker: cost each batch it receives until it receives None (Ctrl-C is this process's to handle: it ends
    the worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while (batch := connection.recv()) is not None:
        connection.send([outcome(cost, schedule) for schedule in batch])


class CostWorker:
    """A forked process costing schedules with ``cost`` (see the module docstring); :meth:`close` ends it."""

    def __init__(self, cost: Callable[[Any], Any]) -> None:
        context = multiprocessing.get_context("fork")
        self._cost = cost
        self._connection, child = context.Pipe()
        for stream in (sys.stdout, sys.stderr):  # the worker must not write this process's pending output again
            stream.flush()
        self._process = context.Process(target=_serve, args=(child, cost), name="nmmc-cost-worker", daemon=True)
        self._process.start()
        child.close()

    def cost(self, groups: Sequence[Sequence[Any]]) -> dict[Any, Outcome]:
        """The outcome of costing every schedule of ``groups``, the groups shared out whole between the worker and
        this process (a group: forms of one schedule that its cost function lowers once, costed in one process)."""
        mine: list[Any] = []
        theirs: list[Any] = []
        for group in groups:  # whole groups, to whichever side has fewer schedules so far
            (mine if len(mine) <= len(theirs) else theirs).extend(group)
        if theirs:
            self._connection.send(theirs)
        done = {schedule: outcome(self._cost, schedule) for schedule in mine}
        if theirs:
            try:
                done.update(zip(theirs, self._connection.recv(), strict=True))
            except EOFError:
                raise RuntimeError(f"the cost worker process ended (exit code {self._process.exitcode})") from None
        return done

    def close(self) -> None:
        """End the worker."""
        if self._process.is_alive():
            with contextlib.suppress(OSError):  # a worker that died already
                self._connection.send(None)
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join()
        self._connection.close()

"""One function run in a worker process while this process goes on with other work (``nmmc tune`` of an SVD MLP
searches its dense baseline there while it searches the SVD MLP itself).

The worker is forked where the platform can and this process runs no other thread: it starts with every module
this process has imported (a spawned worker imports the package again, ~0.6 s of a command that takes a few
seconds). Otherwise it is spawned, as ``tune --model``'s workers are. The result (or the exception) comes back
pickled; a worker whose result is never taken is stopped, so an error in this process does not wait for it.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["Background"]


def _run(send: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """The worker: ``fn(*args)`` sent back as (True, result) or (False, exception) (Ctrl-C is the caller's to handle:
    it stops the worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        outcome: tuple[bool, Any] = (True, fn(*args))
    except BaseException as exc:  # every failure goes back to the caller, who raises it
        outcome = (False, exc)
    try:
        send.send(outcome)
    except Exception as exc:  # what does not pickle comes back as text
        what = f"{type(outcome[1]).__name__}: {outcome[1]}" if not outcome[0] else f"its result does not pickle: {exc}"
        send.send((False, RuntimeError(f"worker process: {what}")))
    finally:
        send.close()


class Background:
    """``fn(*args)`` started in a worker process; :meth:`result` waits for it (and raises what it raised)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "nmmc-worker") -> None:
        forkable = "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1
        context = multiprocessing.get_context("fork" if forkable else "spawn")
        self._receive, send = context.Pipe(duplex=False)
        for stream in (sys.stdout, sys.stderr):  # a forked worker must not write this process's pending output again
            stream.flush()
        self._process = context.Process(target=_run, args=(send, fn, args), name=name, daemon=True)
        self._process.start()
        send.close()

    def result(self) -> Any:
        """What ``fn`` returned (waiting for it), or the exception it raised, raised here."""
        try:
            ok, value = self._receive.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(f"worker process {self._process.name} ended without a result "
                               f"(exit code {self._process.exitcode})") from None
        finally:
            self._receive.close()
        self._process.join()
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """Stop the worker if it is still running (its result not taken)."""
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()

"""How many CPU cores this process may use: the default of ``tune --model --jobs`` and ``compress --threads``."""

from __future__ import annotations

import os

__all__ = ["available_cores", "idle_core"]


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux, the machine's count elsewhere)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def idle_core() -> bool:
    """Whether a second process of this one would find a core to itself: another core may be used and the load
    average (runnable processes over the last minute, this one included) leaves one free. Where the cores are
    busy, work shared with a worker process waits for it at every hand-over: measured, an export of two buckets
    took 16 s instead of 12 on two cores with other jobs running. Without a load average (not on Unix): the cores."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return available_cores() >= 2 and load < available_cores() - 0.5

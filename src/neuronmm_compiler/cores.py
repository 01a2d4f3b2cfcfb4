"""How many CPU cores this process may use: the default of ``tune --model --jobs`` and ``compress --threads``."""

from __future__ import annotations

import os

__all__ = ["available_cores"]


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux, the machine's count elsewhere)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)

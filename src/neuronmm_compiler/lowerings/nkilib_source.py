"""What nmmc's model of AWS nki-library's MLP is read from, and what it says where that kernel does not run (shared
by :mod:`.nkilib_mlp`, :mod:`.nkilib_tkg` and :mod:`.nkilib_cte`)."""

from __future__ import annotations

from ..errors import ScheduleError

#: The nki-library commit every constant of the model is read from ("NKI Lib 2026-04-13").
NKILIB_COMMIT = "d2ad3a579498d1888aa8740af97fd325dd5f2740"


class NotModelled(ScheduleError):
    """nki-library's kernel does not run this workload (one of its asserts), or nmmc does not model the case."""

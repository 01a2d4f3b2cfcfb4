"""On-chip capacity: which SBUF/PSUM allocations are live, and the limits they must respect.

Liveness rule. Only explicit ``nl.ndarray``/``nl.zeros`` calls with ``buffer=nl.sbuf`` or
``buffer=nl.psum`` allocate on-chip memory (values returned by 0.1-style ops are temporaries and
are not counted). An allocation is live from its creation until either

* the next allocation made at the same *site* (the allocation call in the kernel file, reached
  through the same kernel-file call chain: in practice the same line, see
  :meth:`Machine.current_site`): the compiler rotates the buffer of one site, so the newer
  allocation replaces the older one (using the older one afterwards is an error), or
* it becomes unreachable from the kernel (a ``weakref.finalize`` on the allocation releases it).

Limits checked at every allocation: partition dim <= ``pmax``; live SBUF bytes per partition <=
``sbuf_usable_bytes_per_partition``; one PSUM allocation <= ``psum_bytes_per_partition``; live PSUM
banks <= ``psum_banks``, where each PSUM allocation occupies whole banks (it starts on a bank
boundary).
"""

from __future__ import annotations

import weakref

from ..errors import KernelLimitError
from ..targets import Target
from .counters import Counters
from .tensor import PSUM, SBUF, Allocation


class _Record:
    """What the tracker remembers of one on-chip allocation (never the allocation itself)."""

    __slots__ = ("alloc_ref", "banks", "buffer", "bytes", "line", "live", "name")

    def __init__(self, alloc: Allocation, nbytes: int, banks: int):
        self.alloc_ref = weakref.ref(alloc)
        self.buffer = alloc.buffer
        self.bytes = nbytes
        self.banks = banks
        self.name = alloc.name
        self.line = alloc.line
        self.live = True


class MemoryTracker:
    """Live SBUF bytes and PSUM banks of one kernel run, with their peaks."""

    def __init__(self, target: Target, counters: Counters):
        self.target = target
        self.counters = counters
        self.sites: dict[object, _Record] = {}
        self.live: set[_Record] = set()
        self.sbuf_bytes = 0
        self.psum_bytes = 0
        self.psum_banks = 0

    def allocate(self, alloc: Allocation, site: object) -> None:
        """Account for a new on-chip allocation made at ``site``; raise if a limit is broken."""
        t = self.target
        shape = alloc.data.shape
        if shape[0] > t.pmax:
            raise KernelLimitError(
                f"partition dim {shape[0]} exceeds pmax {t.pmax}: {alloc.describe()}; dim 0 of an "
                f"on-chip tensor is the partition dim and the target has {t.pmax} partitions")
        nbytes = alloc.data.nbytes // shape[0]
        previous = self.sites.get(site)
        if previous is not None and previous.live:
            self.release(previous)
            old = previous.alloc_ref()
            if old is not None:
                old.rotated_line = alloc.line
        banks = 0
        if alloc.buffer == SBUF:
            total = self.sbuf_bytes + nbytes
            if total > t.sbuf_usable_bytes_per_partition:
                raise KernelLimitError(
                    f"SBUF capacity exceeded: {alloc.describe()} needs {nbytes} bytes/partition; with "
                    f"{self.sbuf_bytes} already live that is {total} > {t.sbuf_usable_bytes_per_partition} "
                    f"usable bytes/partition on {t.name}{self._live_list(SBUF)}")
            self.sbuf_bytes = total
            if total > self.counters.sbuf_peak_bytes:
                self.counters.sbuf_peak_bytes = total
        elif alloc.buffer == PSUM:
            bank_bytes = t.psum_bank_bytes
            if nbytes > t.psum_bytes_per_partition:
                raise KernelLimitError(
                    f"PSUM allocation too large: {alloc.describe()} needs {nbytes} bytes/partition > "
                    f"{t.psum_bytes_per_partition} PSUM bytes/partition on {t.name}")
            banks = -(-nbytes // bank_bytes)
            total_banks = self.psum_banks + banks
            if total_banks > t.psum_banks:
                raise KernelLimitError(
                    f"PSUM banks exceeded: {alloc.describe()} needs {banks} bank(s) of {bank_bytes} bytes; "
                    f"with {self.psum_banks} already live that is {total_banks} > {t.psum_banks} banks on "
                    f"{t.name}{self._live_list(PSUM)}")
            self.psum_banks = total_banks
            self.psum_bytes += nbytes
            c = self.counters
            c.psum_peak_banks = max(c.psum_peak_banks, total_banks)
            c.psum_peak_bytes = max(c.psum_peak_bytes, self.psum_bytes)
        else:  # pragma: no cover - callers only pass on-chip allocations
            raise AssertionError(alloc.buffer)
        record = _Record(alloc, nbytes, banks)
        self.sites[site] = record
        self.live.add(record)
        weakref.finalize(alloc, self.release, record)

    def release(self, record: _Record) -> None:
        """Free a live allocation's bytes (idempotent)."""
        if not record.live:
            return
        record.live = False
        self.live.discard(record)
        if record.buffer == SBUF:
            self.sbuf_bytes -= record.bytes
        else:
            self.psum_bytes -= record.bytes
            self.psum_banks -= record.banks

    def _live_list(self, buffer: str) -> str:
        live = sorted((r for r in self.live if r.buffer == buffer), key=lambda r: -r.bytes)
        if not live:
            return ""
        unit = "banks" if buffer == PSUM else "bytes"
        shown = ", ".join(
            f"'{r.name}' (line {r.line}): {r.banks if buffer == PSUM else r.bytes} {unit}" for r in live[:6])
        more = f", ... {len(live) - 6} more" if len(live) > 6 else ""
        return f"; live: {shown}{more}"

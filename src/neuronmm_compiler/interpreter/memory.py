"""On-chip capacity: how long each SBUF/PSUM allocation is live, and the limits live memory must respect.

Liveness rule. Only explicit ``nl.ndarray``/``nl.zeros`` calls with ``buffer=nl.sbuf`` or
``buffer=nl.psum`` allocate on-chip memory (values returned by 0.1-style ops are temporaries and
are not counted). A run-wide event clock advances by one on every API call (every ``nl``/``nisa``
call, allocations included, and every 0.1-style ``buf[idx] = value`` / ``buf[idx] += value``); all
the accesses one call makes happen at its tick. An allocation occupies memory over the closed
interval ``[alloc_time, last_access_time]``: from its allocation to its last read or write by any
instruction through any view of it (an allocation never accessed lives only at its allocation
tick). Two allocations are live together when one starts at or before the other's end.

Limits checked at every allocation: partition dim <= ``pmax``; one PSUM allocation (a PSUM tile)
fits one bank, ``psum_bank_bytes`` per partition (Tile-Size Constraint #2, NKI-PSUM-TILE-FMAX in
docs/nki-rules.md). Checked when the kernel returns, by a sweep over the intervals (see
:meth:`MemoryTracker.finish`): live SBUF bytes per partition <= ``sbuf_usable_bytes_per_partition``
and live PSUM banks <= ``psum_banks``, where each PSUM allocation occupies one bank (it starts on a
bank boundary).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from ..errors import KernelLimitError
from ..targets import Target
from .counters import Counters
from .tensor import PSUM, SBUF, Allocation


class _Record:
    """What the tracker remembers of one on-chip allocation (never the allocation itself).

    The allocation points at its record (``Allocation.record``) and stamps ``last`` on every access
    (:func:`~.tensor.require_written`, :func:`~.tensor.write`, :func:`~.tensor.mark_written`)."""

    __slots__ = ("banks", "buffer", "bytes", "dtype", "last", "line", "name", "shape", "start")

    def __init__(self, alloc: Allocation, nbytes: int, banks: int, start: int):
        self.buffer = alloc.buffer
        self.bytes = nbytes
        self.banks = banks
        self.name = alloc.name
        self.line = alloc.line
        self.shape = alloc.data.shape
        self.dtype = alloc.data.dtype
        self.start = start
        self.last = start

    def describe(self) -> str:
        where = f", allocated at line {self.line}" if self.line is not None else ""
        return f"'{self.name}' ({self.buffer} {list(self.shape)} {self.dtype.name}{where})"

    def size(self) -> int:
        """What the record occupies of its memory's limit: bytes/partition (SBUF) or banks (PSUM)."""
        return self.banks if self.buffer == PSUM else self.bytes


class _Sweep:
    """Result of sweeping one memory's intervals: peaks, and where the limit was first exceeded."""

    __slots__ = ("live_before", "over", "peak_bytes", "peak_size", "total")

    def __init__(self) -> None:
        self.peak_size = 0  # bytes/partition (SBUF) or banks (PSUM)
        self.peak_bytes = 0  # raw bytes/partition
        self.over: _Record | None = None  # first allocation at which the limit was exceeded
        self.total = 0  # live size including ``over``, at ``over.start``
        self.live_before: list[_Record] = []  # the other allocations live at ``over.start``


def _sweep(records: list[_Record], limit: int) -> _Sweep:
    """Peaks of the live size and raw bytes over ``records`` (in allocation order) against ``limit``.

    Live memory only grows at an allocation, so the peaks are reached at allocation ticks; at the
    tick of allocation ``r`` every earlier allocation whose last access is at or after ``r.start``
    is live (closed intervals)."""
    out = _Sweep()
    ends: list[tuple[int, int, _Record]] = []  # heap of (last, seq, record) of live allocations
    size = nbytes = 0
    for seq, r in enumerate(records):
        start = r.start
        while ends and ends[0][0] < start:
            _, _, done = heapq.heappop(ends)
            size -= done.size()
            nbytes -= done.bytes
        rsize = r.size()
        size += rsize
        nbytes += r.bytes
        if size > out.peak_size:
            out.peak_size = size
        if nbytes > out.peak_bytes:
            out.peak_bytes = nbytes
        if size > limit and out.over is None:
            out.over = r
            out.total = size
            out.live_before = [e[2] for e in ends]
        heapq.heappush(ends, (r.last, seq, r))
    return out


class MemoryTracker:
    """The on-chip allocations of one kernel run with their live intervals; peaks and capacity."""

    def __init__(self, target: Target, counters: Counters):
        self.target = target
        self.counters = counters
        self.records: list[_Record] = []  # in allocation order (= increasing ``start``)

    def allocate(self, alloc: Allocation, clock: int) -> None:
        """Record a new on-chip allocation made at tick ``clock``; raise if a per-allocation limit is
        broken (capacity is checked by :meth:`finish`)."""
        t = self.target
        shape = alloc.data.shape
        if shape[0] > t.pmax:
            raise KernelLimitError(
                f"partition dim {shape[0]} exceeds pmax {t.pmax}: {alloc.describe()}; dim 0 of an "
                f"on-chip tensor is the partition dim and the target has {t.pmax} partitions")
        nbytes = alloc.data.nbytes // shape[0]
        banks = 0
        if alloc.buffer == PSUM:
            if nbytes > t.psum_bank_bytes:  # Tile-Size Constraint #2: NKI-PSUM-TILE-FMAX in docs/nki-rules.md
                raise KernelLimitError(
                    f"PSUM tile wider than one bank: {alloc.describe()} needs {nbytes} bytes/partition > "
                    f"{t.psum_bank_bytes} on {t.name} (NKI-PSUM-TILE-FMAX: a PSUM tile's free size fits one bank; "
                    "allocate one tile per bank)")
            banks = 1
        elif alloc.buffer != SBUF:  # pragma: no cover - callers only pass on-chip allocations
            raise AssertionError(alloc.buffer)
        record = _Record(alloc, nbytes, banks, clock)
        alloc.record = record
        self.records.append(record)

    def finish(self, source_line: Callable[[int | None], str | None] | None = None) -> None:
        """Sweep the live intervals when the kernel has returned: fill the peak counters, and raise
        :class:`KernelLimitError` at the allocation where SBUF or PSUM capacity was first exceeded.

        ``source_line`` maps a kernel line number to its text (for the error's ``source_line``)."""
        t = self.target
        sbuf = _sweep([r for r in self.records if r.buffer == SBUF], t.sbuf_usable_bytes_per_partition)
        psum = _sweep([r for r in self.records if r.buffer == PSUM], t.psum_banks)
        c = self.counters
        c.sbuf_peak_bytes = sbuf.peak_bytes
        c.psum_peak_bytes = psum.peak_bytes
        c.psum_peak_banks = psum.peak_size
        failed = [s for s in (sbuf, psum) if s.over is not None]
        if not failed:
            return
        first = min(failed, key=lambda s: s.over.start)  # type: ignore[union-attr]
        r = first.over
        assert r is not None
        already = first.total - r.size()
        if r.buffer == SBUF:
            message = (
                f"SBUF capacity exceeded: {r.describe()} needs {r.bytes} bytes/partition; with "
                f"{already} already live that is {first.total} > {t.sbuf_usable_bytes_per_partition} "
                f"usable bytes/partition on {t.name}")
        else:
            message = (
                f"PSUM banks exceeded: {r.describe()} needs {r.banks} bank(s) of {t.psum_bank_bytes} bytes; "
                f"with {already} already live that is {first.total} > {t.psum_banks} banks on {t.name}")
        message += _live_list(first.live_before)
        message += "; an on-chip allocation is live from its allocation to its last access"
        text = source_line(r.line) if source_line is not None else None
        raise KernelLimitError(message, line=r.line, source_line=text)


def _live_list(live: list[_Record]) -> str:
    """``; live: 'x' (line 5): 4096 bytes, ...``: the biggest of ``live``, then the count of the rest."""
    if not live:
        return ""
    live = sorted(live, key=lambda r: (-r.size(), r.start))
    unit = "banks" if live[0].buffer == PSUM else "bytes"
    shown = ", ".join(f"'{r.name}' (line {r.line}): {r.size()} {unit}" for r in live[:6])
    more = f", ... {len(live) - 6} more" if len(live) > 6 else ""
    return f"; live: {shown}{more}"


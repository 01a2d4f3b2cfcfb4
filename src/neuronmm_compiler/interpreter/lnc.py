"""The HBM the programs of a logical core share, and the races the interpreter reports on it.

An LNC=2 kernel runs once per physical core of the logical core, ``nl.program_id(0)`` telling each which it
is; inputs and outputs are tensors in shared HBM that both programs see ("Using Logical NeuronCores (LNC) with
NKI", sections "Programming for multiple cores" and "Final Notes"). SBUF and PSUM are per core. Nothing orders
one program's HBM accesses against the other's unless the kernel synchronises them: the documented primitives are
``nisa.core_barrier`` (both programs wait; HBM written before it is visible after it) and ``nisa.sendrecv``
(SBUF to SBUF), both ``nki.lnc`` functions from NKI 0.8.0 (Neuron 2.34; the ``nki.isa`` ones deprecated there).
The kernels nmmc emits divide disjoint work and use no barrier (their exchanges are SBUF to SBUF), so the interpreter
holds them to the rule that follows: no HBM element is written by one program and read or written by the other.

The programs run in threads that take turns (:class:`Turns`, one runs at a time, so a run is deterministic):
program 0 runs until its first sendrecv (``nisa.sendrecv`` or ``nki.lnc.sendrecv``), then program 1 until its
matching one, which completes the
exchange (each ``src`` lands in the other program's ``dst``) and runs on; a program waiting for its partner gets
the turn back when the partner reaches its next exchange or ends. An exchange whose partner never comes (the
other program ended, or reached an exchange of another shape, rank or pipe) is ``LNC-EXCHANGE-MISMATCH``
(``nisa.sendrecv``, NKI API reference: both programs call it, src and dst in SBUF with one shape and dtype).

The interpreter runs the programs against the same HBM allocations, tracking per element
which program wrote it (:attr:`SharedTensor.owner`) and, for the tensors the kernel allocates, which programs read
it (:attr:`SharedTensor.readers`), so a race is found whichever program runs first:

* ``LNC-HBM-WRITE-OVERLAP``: two programs write the same HBM element (an overlapping split);
* ``LNC-HBM-UNSYNCED-READ``: a program reads an HBM element the other program writes, with no synchronisation
  between them (an exchange through HBM without its barrier).

A kernel argument's readers are not tracked (kernels never write their arguments; tracking would double the
memory a large verification needs), so a program writing an argument the other program read goes unreported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KernelLimitError

if TYPE_CHECKING:
    from .tensor import Allocation, Tensor

WRITE_OVERLAP = "LNC-HBM-WRITE-OVERLAP"
UNSYNCED_READ = "LNC-HBM-UNSYNCED-READ"
EXCHANGE_MISMATCH = "LNC-EXCHANGE-MISMATCH"
SENDRECV_SOURCE = "NKI API reference, nki.isa.sendrecv (NKI 0.3-0.7) / nki.lnc.sendrecv (NKI 0.8.0)"
#: The page both rules rest on.
#: ``SharedHbm.current`` once the programs have finished
HOST = -1
SOURCE = "Neuron docs, 'Using Logical NeuronCores (LNC) with NKI' (Final Notes; nisa.core_barrier)"


class LncRaceError(KernelLimitError):
    """Two programs of a logical core race on an HBM element."""


class SharedHbm:
    """The shared HBM of one LNC run: the allocations both programs see and which program is running."""

    def __init__(self, programs: int):
        self.programs = programs
        self.current = 0
        #: HBM tensors the kernel allocates, by (allocation line, how many the program allocated there before):
        #: the second program's ``nl.ndarray(..., buffer=nl.shared_hbm)`` names the first one's tensor
        self.allocated: dict[tuple[int | None, int], Allocation] = {}
        self._seen: dict[int | None, int] = {}

    def begin(self, program_id: int) -> None:
        """Program ``program_id`` starts: its allocation sites are counted afresh."""
        self.current = program_id
        self._seen = {}

    def finish(self) -> None:
        """Every program has finished: the host reads the outputs after the kernel, which is ordered."""
        self.current = HOST

    def hbm_allocation(self, line: int | None, create: Callable[[], Allocation]) -> Allocation:
        """The tensor of this HBM allocation site in every program (created by the first to reach it)."""
        nth = self._seen.get(line, 0)
        self._seen[line] = nth + 1
        alloc = self.allocated.get((line, nth))
        if alloc is None:
            alloc = self.allocated[(line, nth)] = create()
            alloc.lnc = SharedTensor(self, alloc, track_readers=True)
        return alloc

    def share_argument(self, alloc: Allocation) -> None:
        alloc.lnc = SharedTensor(self, alloc, track_readers=False)


class SharedTensor:
    """Per-element bookkeeping of one shared HBM tensor."""

    __slots__ = ("alloc", "owner", "readers", "shared")

    def __init__(self, shared: SharedHbm, alloc: Allocation, *, track_readers: bool):
        self.shared = shared
        self.alloc = alloc
        self.owner = np.full(alloc.data.shape, -1, np.int8)  # program that wrote each element, -1: none
        self.readers = np.zeros(alloc.data.shape, np.uint8) if track_readers else None  # bit p: program p read it

    def _other_writer(self, t: Tensor, p: int) -> tuple[int, int] | None:
        """(the other program that wrote into ``t``, how many elements) or None."""
        owner = self.owner[t.key]
        other = (owner >= 0) & (owner != p)
        return (int(owner[other].flat[0]), int(other.sum())) if other.any() else None

    def read(self, t: Tensor) -> None:
        p = self.shared.current
        if p == HOST:
            return
        found = self._other_writer(t, p)
        if found is not None:
            raise LncRaceError(f"{UNSYNCED_READ}: program {p} reads {t.describe()}, which program {found[0]} writes, "
                               f"with no synchronisation between them ({SOURCE})")
        if self.readers is not None:
            self.readers[t.key] |= np.uint8(1 << p)

    def wrote(self, t: Tensor) -> None:
        p = self.shared.current
        if p == HOST:
            return
        found = self._other_writer(t, p)
        if found is not None:
            raise LncRaceError(f"{WRITE_OVERLAP}: programs {found[0]} and {p} both write {t.describe()} ({found[1]} "
                               f"element(s)); the programs of a logical core must divide the outputs ({SOURCE})")
        if self.readers is not None and ((self.readers[t.key] & np.uint8(~(1 << p) & 0xFF)) != 0).any():
            raise LncRaceError(f"{UNSYNCED_READ}: program {p} writes {t.describe()}, which the other program reads, "
                               f"with no synchronisation between them ({SOURCE})")
        self.owner[t.key] = p


# ----------------------------------------------------------------------------- programs taking turns, exchanges


@dataclass
class _Exchange:
    """One program's side of a sendrecv, waiting for the other's."""

    index: int  # how many exchanges the program issued before this one
    peer: int
    pipe: int
    data: np.ndarray  # a copy of src when it was sent
    dst: Tensor
    done: bool = False
    units: Any = None  # the scale units of src in an FP8 run (interpreter/scale_units.py)


class _Aborted(Exception):
    """A program stops because another one failed (its own error is the one reported)."""


@dataclass
class Turns:
    """The programs of one LNC run as threads taking turns (the module docstring)."""

    shared: SharedHbm
    cond: threading.Condition = field(default_factory=threading.Condition)
    turn: int = 0
    finished: set[int] = field(default_factory=set)
    failed: BaseException | None = None
    waiting: dict[int, _Exchange] = field(default_factory=dict)
    issued: dict[int, int] = field(default_factory=dict)

    def run(self, bodies: list[Callable[[], Any]]) -> list[Any]:
        """Run ``bodies[p]`` as program p, in turns; their results, or the first failure raised."""
        results: list[Any] = [None] * len(bodies)

        def program(p: int) -> None:
            try:
                self._wait_turn(p)
                results[p] = bodies[p]()
            except _Aborted:
                pass
            except BaseException as exc:  # reported by run() in the caller's thread
                with self.cond:
                    if self.failed is None:
                        self.failed = exc
            finally:
                with self.cond:
                    self.finished.add(p)
                    self._pass_turn(p)

        threads = [threading.Thread(target=program, args=(p,), name=f"nmmc-program-{p}", daemon=True)
                   for p in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.failed is not None:
            raise self.failed
        unmatched = [(p, x) for p, x in self.waiting.items() if not x.done]
        if unmatched:
            p, x = unmatched[0]
            raise LncRaceError(f"{EXCHANGE_MISMATCH}: program {p}'s sendrecv #{x.index + 1} (to program {x.peer}) has "
                               f"no partner: program {x.peer} ended without it ({SENDRECV_SOURCE})")
        return results

    def _wait_turn(self, p: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == p or self.failed is not None)
            if self.failed is not None:
                raise _Aborted
            self.shared.current = p

    def _pass_turn(self, p: int) -> None:
        """Give the turn to the next program that has not finished (called holding the lock)."""
        n = self.shared.programs
        for step in range(1, n + 1):
            q = (p + step) % n
            if q not in self.finished:
                self.turn = q
                break
        self.cond.notify_all()

    def sendrecv(self, p: int, src: Tensor, dst: Tensor, peer: int, pipe: int, *, units: Any = None) -> None:
        """Program ``p`` exchanges ``src``/``dst`` with program ``peer`` (see the module docstring)."""
        n = self.shared.programs
        if peer == p or not 0 <= peer < n:
            raise LncRaceError(f"{EXCHANGE_MISMATCH}: program {p} sends to rank {peer}; the other program of an "
                               f"LNC={n} kernel is {1 - p if n == 2 else 'another rank'} ({SENDRECV_SOURCE})")
        with self.cond:
            index = self.issued.get(p, 0)
            self.issued[p] = index + 1
            mine = _Exchange(index, peer, pipe, np.array(src.data, copy=True), dst, units=units)
            partner = self.waiting.get(peer)
            if partner is not None and not partner.done and partner.peer == p:
                self._complete(p, mine, peer, partner)
                return
            if peer in self.finished:
                raise LncRaceError(f"{EXCHANGE_MISMATCH}: program {p}'s sendrecv #{index + 1} has no partner: program "
                                   f"{peer} already ended ({SENDRECV_SOURCE})")
            self.waiting[p] = mine
            self._pass_turn(p)
            self.cond.wait_for(lambda: mine.done or peer in self.finished or self.failed is not None)
            if self.failed is not None:
                raise _Aborted
            if not mine.done:
                raise LncRaceError(f"{EXCHANGE_MISMATCH}: program {p}'s sendrecv #{index + 1} has no partner: program "
                                   f"{peer} ended without it ({SENDRECV_SOURCE})")
            del self.waiting[p]
            self.cond.wait_for(lambda: self.turn == p or self.failed is not None)
            if self.failed is not None:
                raise _Aborted
            self.shared.current = p

    def _complete(self, p: int, mine: _Exchange, peer: int, partner: _Exchange) -> None:
        from .tensor import write

        if (partner.index, partner.pipe, partner.data.shape, partner.data.dtype) != (
                mine.index, mine.pipe, mine.data.shape, mine.data.dtype):
            raise LncRaceError(
                f"{EXCHANGE_MISMATCH}: program {peer}'s sendrecv #{partner.index + 1} (pipe {partner.pipe}, "
                f"{list(partner.data.shape)} {partner.data.dtype.name}) meets program {p}'s #{mine.index + 1} (pipe "
                f"{mine.pipe}, {list(mine.data.shape)} {mine.data.dtype.name}): both sides must match "
                f"({SENDRECV_SOURCE})")
        for into, data in ((mine.dst, partner.data), (partner.dst, mine.data)):
            if into.shape != data.shape or into.dtype != data.dtype:
                raise LncRaceError(f"{EXCHANGE_MISMATCH}: sendrecv delivers {list(data.shape)} {data.dtype.name} into "
                                   f"{into.describe()}: src and dst must have one shape and dtype ({SENDRECV_SOURCE})")
        write(mine.dst, partner.data)
        write(partner.dst, mine.data)
        if mine.units is not None:
            from .scale_units import set_units

            set_units(mine.dst, partner.units)
            set_units(partner.dst, mine.units)
        partner.done = mine.done = True
        self.cond.notify_all()

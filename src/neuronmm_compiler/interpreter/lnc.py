"""The HBM the programs of a logical core share, and the races the interpreter reports on it.

An LNC=2 kernel runs once per physical core of the logical core, ``nl.program_id(0)`` telling each which it
is; inputs and outputs are tensors in shared HBM that both programs see ("Using Logical NeuronCores (LNC) with
NKI", sections "Programming for multiple cores" and "Final Notes"). SBUF and PSUM are per core. Nothing orders
one program's HBM accesses against the other's unless the kernel synchronises them: the documented primitives are
``nisa.core_barrier`` (both programs wait; HBM written before it is visible after it) and ``nisa.sendrecv``
(SBUF to SBUF). The kernels nmmc emits today divide disjoint work and use neither, so the interpreter holds them
to the rule that follows: no HBM element is written by one program and read or written by the other.

The interpreter runs the programs one after the other against the same HBM allocations, tracking per element
which program wrote it (:attr:`SharedTensor.owner`) and, for the tensors the kernel allocates, which programs read
it (:attr:`SharedTensor.readers`), so a race is found whichever program runs first:

* ``LNC-HBM-WRITE-OVERLAP``: two programs write the same HBM element (an overlapping split);
* ``LNC-HBM-UNSYNCED-READ``: a program reads an HBM element the other program writes, with no synchronisation
  between them (an exchange through HBM without its barrier).

A kernel argument's readers are not tracked (kernels never write their arguments; tracking would double the
memory a large verification needs), so a program writing an argument the other program read goes unreported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import KernelLimitError

if TYPE_CHECKING:
    from .tensor import Allocation, Tensor

WRITE_OVERLAP = "LNC-HBM-WRITE-OVERLAP"
UNSYNCED_READ = "LNC-HBM-UNSYNCED-READ"
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

    def hbm_allocation(self, line: int | None, create: callable) -> Allocation:
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

    def read(self, t: Tensor) -> None:
        p = self.shared.current
        if p == HOST:
            return
        owner = self.owner[t.key]
        other = (owner >= 0) & (owner != p)
        if other.any():
            q = int(owner[other].flat[0])
            raise LncRaceError(f"{UNSYNCED_READ}: program {p} reads {t.describe()}, which program {q} writes, with no "
                               f"synchronisation between them ({SOURCE})")
        if self.readers is not None:
            self.readers[t.key] |= np.uint8(1 << p)

    def wrote(self, t: Tensor) -> None:
        p = self.shared.current
        if p == HOST:
            return
        owner = self.owner[t.key]
        other = (owner >= 0) & (owner != p)
        if other.any():
            q = int(owner[other].flat[0])
            raise LncRaceError(f"{WRITE_OVERLAP}: programs {q} and {p} both write {t.describe()} ({int(other.sum())} "
                               f"element(s)); the programs of a logical core must divide the outputs ({SOURCE})")
        if self.readers is not None:
            read_by_other = (self.readers[t.key] & np.uint8(~(1 << p) & 0xFF)) != 0
            if read_by_other.any():
                raise LncRaceError(f"{UNSYNCED_READ}: program {p} writes {t.describe()}, which the other program "
                                   f"reads, with no synchronisation between them ({SOURCE})")
        self.owner[t.key] = p

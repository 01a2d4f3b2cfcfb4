"""The CPU interpreter of emitted NKI kernels: the living definition of the NKI subset nmmc emits.

:func:`run_kernel` executes a kernel source file as written, with NumPy/ml_dtypes stand-ins for
``nki``, ``nki.language``, ``nki.isa`` (NKI 0.3+) and ``neuronxcc.nki``, ``.language``, ``.isa``
(NKI 0.1). Unlike AWS's simulator it enforces tile limits and SBUF/PSUM capacity, poisons new
buffers (NaN plus a written mask, so a read of unwritten memory is an error), and counts HBM bytes,
DMA transfers and engine instructions (:class:`Counters`). See docs/nki-subset.md.
"""

from __future__ import annotations

from .counters import Counters
from .loader import KernelRun, run_kernel

__all__ = ["Counters", "KernelRun", "run_kernel"]

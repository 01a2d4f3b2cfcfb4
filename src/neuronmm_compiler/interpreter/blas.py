"""Run NumPy's BLAS single-threaded while a kernel is interpreted.

A kernel issues thousands of small matmuls ([128, 128] x [128, 512]); multi-threaded OpenBLAS
gains nothing on them and, on a busy machine, its spinning threads make each one up to ~100x slower.
The thread count is set through OpenBLAS's own C entry points (found in the already loaded library)
and restored afterwards; where no OpenBLAS is found this does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

_ENTRY_POINTS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)
_Controls = tuple[Callable[[int], object], Callable[[], int]]
_controls: _Controls | None | bool = False  # False: not looked up yet


def _candidate_libraries() -> list[str]:
    paths: list[str] = []
    with contextlib.suppress(OSError):
        maps = Path("/proc/self/maps").read_text()
        paths += sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps)))
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    if libs.is_dir():
        paths += sorted(str(p) for p in libs.glob("*openblas*"))
    return paths


def _find_controls() -> _Controls | None:
    for path in _candidate_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _ENTRY_POINTS:
            setter = getattr(lib, set_name, None)
            getter = getattr(lib, get_name, None)
            if setter is not None and getter is not None:
                getter.restype = ctypes.c_int
                setter.argtypes = [ctypes.c_int]
                return setter, getter
    return None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Limit OpenBLAS to one thread inside the ``with`` block (no-op without OpenBLAS)."""
    global _controls
    if _controls is False:
        _controls = _find_controls()
    if not _controls:
        yield
        return
    setter, getter = _controls
    previous = getter()
    if previous == 1:
        yield
        return
    setter(1)
    try:
        yield
    finally:
        setter(previous)

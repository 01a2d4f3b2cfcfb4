"""The liveness rule: one live allocation per site, freed when unreachable; peaks are tracked."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from neuronmm_compiler.errors import KernelLimitError

sys.path.insert(0, os.path.dirname(__file__))
from test_interpreter import HEADER_LEGACY, HEADER_NKI, line_of, run

A = np.ones((128, 512), np.float32)

ROTATING_PSUM_NKI = HEADER_NKI + """
@nki.jit
def k(a):
    out = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.shared_hbm)
    a_sb = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=a)
    res = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    nisa.memset(dst=res, value=0.0)
    for i in range(5):
        ps = nl.ndarray((128, 8, 512), dtype=nl.float32, buffer=nl.psum)
        for bank in range(8):
            nisa.nc_matmul(dst=ps[:, bank, :], stationary=a_sb[:, 0:128], moving=a_sb)
            nisa.tensor_tensor(dst=res, data1=res, data2=ps[:, bank, :], op=nl.add)
    nisa.dma_copy(dst=out, src=res)
    return out
"""

ROTATING_PSUM_LEGACY = HEADER_LEGACY + """
@nki.jit
def k(a):
    out = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.shared_hbm)
    a_sb = nl.load(a)
    for i in nl.affine_range(5):
        ps = nl.zeros((nl.par_dim(128), 8, 512), dtype=nl.float32, buffer=nl.psum)
        for bank in nl.affine_range(8):
            ps[:, bank, :] += nisa.nc_matmul(a_sb[:, 0:128], a_sb)
    nl.store(out, value=nl.copy(ps[:, 7, :]))
    return out
"""


@pytest.mark.parametrize("source", [ROTATING_PSUM_NKI, ROTATING_PSUM_LEGACY], ids=["nki", "legacy"])
def test_loop_reallocating_eight_banks_at_one_site(source: str) -> None:
    result = run(source, [A])
    c = result.counters
    assert c.psum_peak_banks == 8
    assert c.psum_peak_bytes == 8 * 2048
    assert c.matmul_instructions == 40


def test_unreachable_allocation_is_freed() -> None:
    src = HEADER_NKI + """
@nki.jit
def k(a):
    for i in range(3):
        big = nl.ndarray((128, 40000), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=big, value=0.0)
        del big
        other = nl.ndarray((128, 40000), dtype=nl.float32, buffer=nl.sbuf)
        del other
    return a
"""
    c = run(src, [A]).counters
    assert c.sbuf_peak_bytes == 160000


def test_allocation_in_helper_released_on_return() -> None:
    src = HEADER_NKI + """
def scratch(a, cols):
    t = nl.ndarray((128, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
    return cols

@nki.jit
def k(a):
    scratch(a, 30000)
    keep = nl.ndarray((128, 30000), dtype=nl.float32, buffer=nl.sbuf)
    scratch(a, 14000)
    return a
"""
    c = run(src, [A], kernel="k").counters
    assert c.sbuf_peak_bytes == (30000 + 14000) * 4


def test_two_sites_both_live_exceed_capacity() -> None:
    src = HEADER_NKI + """
@nki.jit
def k(a):
    x = nl.ndarray((128, 30000), dtype=nl.float32, buffer=nl.sbuf)
    y = nl.ndarray((128, 30000), dtype=nl.float32, buffer=nl.sbuf)  # <-- error
    return a
"""
    with pytest.raises(KernelLimitError, match="SBUF capacity exceeded") as info:
        run(src, [A])
    assert info.value.line == line_of(src)
    assert "'x'" in str(info.value)


def test_rotated_out_buffer_cannot_be_used() -> None:
    src = HEADER_NKI + """
@nki.jit
def k(a):
    tiles = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf) for i in range(2)]
    nisa.dma_copy(dst=tiles[0], src=a)  # <-- error
    return a
"""
    with pytest.raises(KernelLimitError, match="rotated-out buffer") as info:
        run(src, [A])
    assert info.value.line == line_of(src)


def test_two_allocations_on_one_line_are_two_sites() -> None:
    src = HEADER_NKI + """
@nki.jit
def k(a):
    x, y = nl.ndarray((128, 8), nl.float32, nl.sbuf), nl.ndarray((128, 8), nl.float32, nl.sbuf)
    nisa.memset(dst=x, value=0.0)
    nisa.memset(dst=y, value=0.0)
    return a
"""
    assert run(src, [A]).counters.sbuf_peak_bytes == 64


def test_psum_allocations_round_up_to_banks() -> None:
    src = HEADER_NKI + """
@nki.jit
def k(a):
    p1 = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)
    p2 = nl.ndarray((128, 513), dtype=nl.float32, buffer=nl.psum)
    return a
"""
    c = run(src, [A]).counters
    assert c.psum_peak_banks == 3
    assert c.psum_peak_bytes == 4 + 513 * 4


def test_helper_called_from_two_places_allocates_at_two_sites() -> None:
    src = HEADER_NKI + """
def load(src):
    t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t

@nki.jit
def k(a):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(3):
        x = load(a)
        y = load(a)
        s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=x, data2=y, op=nl.add)
    nisa.dma_copy(dst=out, src=s)
    return out
"""
    result = run(src, [A], kernel="k")
    np.testing.assert_array_equal(result.outputs[0], 2 * A)
    assert result.counters.sbuf_peak_bytes == 3 * 512 * 4

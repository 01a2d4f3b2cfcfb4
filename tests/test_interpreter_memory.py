"""The liveness rule: an on-chip allocation is live from its allocation to its last access; peaks."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from neuronmm_compiler.errors import KernelLimitError
from neuronmm_compiler.interpreter.memory import _Record, _sweep

sys.path.insert(0, os.path.dirname(__file__))
from test_interpreter import HEADER_LEGACY, HEADER_NKI, line_of, run

A = np.ones((128, 512), np.float32)

LOOP_PSUM_NKI = HEADER_NKI + """
@nki.jit
def k(a):
    out = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.shared_hbm)
    a_sb = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=a)
    res = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    nisa.memset(dst=res, value=0.0)
    for i in range(5):
        banks = []
        for bank in range(8):
            banks.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum))
        for bank in range(8):
            nisa.nc_matmul(dst=banks[bank], stationary=a_sb[:, 0:128], moving=a_sb)
            nisa.tensor_tensor(dst=res, data1=res, data2=banks[bank], op=nl.add)
    nisa.dma_copy(dst=out, src=res)
    return out
"""

LOOP_PSUM_LEGACY = HEADER_LEGACY + """
@nki.jit
def k(a):
    out = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.shared_hbm)
    a_sb = nl.load(a)
    for i in nl.affine_range(5):
        banks = []
        for bank in nl.affine_range(8):
            banks.append(nl.zeros((nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum))
        for bank in nl.affine_range(8):
            banks[bank][:, :] += nisa.nc_matmul(a_sb[:, 0:128], a_sb)
    nl.store(out, value=nl.copy(banks[7]))
    return out
"""


@pytest.mark.parametrize("source", [LOOP_PSUM_NKI, LOOP_PSUM_LEGACY], ids=["nki", "legacy"])
def test_loop_allocating_eight_banks_per_iteration(source: str) -> None:
    # each iteration's 8 banks are last used in that iteration, before the next one is allocated
    result = run(source, [A])
    c = result.counters
    assert c.psum_peak_banks == 8
    assert c.psum_peak_bytes == 8 * 2048
    assert c.matmul_instructions == 40


def test_psum_allocation_held_across_iterations_counts() -> None:
    # the same loop, but every iteration's PSUM tile is kept and read after the loop: 5 x 8 banks
    src = LOOP_PSUM_NKI.replace("    for i in range(5):\n", "    tiles = []\n    for i in range(5):\n")
    src = src.replace("        banks = []\n", "        banks = []\n        tiles.append(banks)\n")
    src = src.replace("    nisa.dma_copy(dst=out, src=res)\n",
                      "    for t in tiles:\n"
                      "        nisa.tensor_tensor(dst=res, data1=res, data2=t[0], op=nl.add)\n"
                      "    nisa.dma_copy(dst=out, src=res)\n")
    assert src.count("tiles") == 3
    with pytest.raises(KernelLimitError, match="PSUM banks exceeded") as info:
        run(src, [A])
    assert "9 > 8 banks" in str(info.value)  # first exceeded at the second iteration's first allocation
    assert info.value.line == line_of(src, "banks.append(nl.ndarray")


TILE_LIST = HEADER_NKI + """
@nki.jit
def k(a):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    tiles = [nl.ndarray((128, 12000), dtype=nl.float32, buffer=nl.sbuf) for i in range(NTILES)]
    for t in tiles:
        nisa.memset(dst=t, value=1.0)
    for t in tiles:
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t[:, 0:512], op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out
"""


def test_tiles_from_one_line_all_used_at_the_end_are_all_live() -> None:
    # 3 tiles of 48000 bytes + acc 2048: all live at the third tile's allocation
    result = run(TILE_LIST.replace("NTILES", "3"), [A])
    np.testing.assert_array_equal(result.outputs[0], np.full((128, 512), 3.0, np.float32))
    assert result.counters.sbuf_peak_bytes == 3 * 48000 + 2048
    # a fourth one: 4 * 48000 + 2048 = 194048 > 180224, at the allocation of the fourth tile
    src = TILE_LIST.replace("NTILES", "4")
    with pytest.raises(KernelLimitError, match="SBUF capacity exceeded") as info:
        run(src, [A])
    message = str(info.value)
    assert "194048 > 180224" in message and "needs 48000 bytes/partition" in message
    assert "with 146048 already live" in message
    assert "'acc'" in message
    assert info.value.line == line_of(src, "tiles = [")


# Two 100 KiB SBUF buffers (trn1: 176 KiB usable). USE_X is where x is last used.
SEQUENTIAL_NKI = HEADER_NKI + """
@nki.jit
def k(a):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[:, 0:512], src=a)
    EARLY
    y = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)  # <-- second
    nisa.dma_copy(dst=y[:, 512:1024], src=a)
    LATE
    nisa.dma_copy(dst=out, src=y[:, 512:1024])
    return out
"""
USE_X_NKI = "nisa.dma_copy(dst=out, src=x[:, 0:512])"

SEQUENTIAL_LEGACY = HEADER_LEGACY + """
@nki.jit
def k(a):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)
    x[:, 0:512] = nl.load(a)
    EARLY
    y = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)  # <-- second
    y[:, 512:1024] = nl.load(a)
    LATE
    nl.store(out, value=y[:, 512:1024])
    return out
"""
USE_X_LEGACY = "x[:, 0:512] = nl.load(a)"


@pytest.mark.parametrize(("source", "use_x"), [(SEQUENTIAL_NKI, USE_X_NKI), (SEQUENTIAL_LEGACY, USE_X_LEGACY)],
                         ids=["nki", "legacy"])
def test_last_use_before_an_allocation_frees_its_bytes(source: str, use_x: str) -> None:
    src = source.replace("EARLY", use_x).replace("LATE", "")
    result = run(src, [A])
    np.testing.assert_array_equal(result.outputs[0], A)
    assert result.counters.sbuf_peak_bytes == 102400


@pytest.mark.parametrize(("source", "use_x"), [(SEQUENTIAL_NKI, USE_X_NKI), (SEQUENTIAL_LEGACY, USE_X_LEGACY)],
                         ids=["nki", "legacy"])
def test_use_after_an_allocation_keeps_both_live(source: str, use_x: str) -> None:
    # x's last access (a read in 0.3, a 0.1 assignment) comes after y's allocation
    src = source.replace("EARLY", "").replace("LATE", use_x)
    with pytest.raises(KernelLimitError, match="SBUF capacity exceeded") as info:
        run(src, [A])
    message = str(info.value)
    assert "204800 > 180224 usable bytes/partition on trn1" in message
    assert "'y'" in message and "'x' (line " in message
    assert info.value.line == line_of(src, "# <-- second")
    assert info.value.source_line is not None and "# <-- second" in info.value.source_line
    assert f"kernel line {info.value.line}" in message
    run(src, [A], target="trn2")  # 208 KiB usable: fits


def test_interval_end_is_inclusive() -> None:
    # x is last read by the very instruction that first writes y: both live at that instruction
    src = HEADER_NKI + """
@nki.jit
def k(a):
    x = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=x, value=1.0)
    y = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)  # <-- error
    nisa.tensor_copy(dst=y, src=x)
    return a
"""
    with pytest.raises(KernelLimitError, match="204800 > 180224") as info:
        run(src, [A])
    assert info.value.line == line_of(src)


def test_never_accessed_allocation_lives_only_at_its_allocation() -> None:
    src = HEADER_NKI + """
@nki.jit
def k(a):
    for i in range(3):
        big = nl.ndarray((128, 40000), dtype=nl.float32, buffer=nl.sbuf)
        other = nl.ndarray((128, 40000), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=other, value=0.0)
    return a
"""
    assert run(src, [A]).counters.sbuf_peak_bytes == 160000
    # once big is written after other is allocated, the two overlap: 320000 > 180224
    src = src.replace("nisa.memset(dst=other", "nisa.memset(dst=big")
    with pytest.raises(KernelLimitError, match="320000 > 180224"):
        run(src, [A])


def test_peak_counters_hand_computed() -> None:
    src = HEADER_NKI + """
def scratch(a, cols):
    t = nl.ndarray((128, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
    return t

@nki.jit
def k(a):
    s1 = scratch(a, 20000)
    keep = nl.ndarray((128, 10000), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=keep, value=0.0)
    s2 = scratch(a, 14000)
    nisa.tensor_copy(dst=keep[:, 0:512], src=s1[:, 0:512])
    s3 = scratch(a, 24000)
    p1 = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)
    p2 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=p1, value=0.0)
    p3 = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=p3, value=0.0)
    nisa.tensor_copy(dst=keep[:, 0:1], src=p1)
    return a
"""
    c = run(src, [A], kernel="k").counters
    # SBUF: s1 + keep + s2 live at s2's allocation (s1 read later); at s3's, only keep and s3
    assert c.sbuf_peak_bytes == (20000 + 10000 + 14000) * 4
    # PSUM: p1 (1 bank, 4 B) is read at the end, so it overlaps p2 (1 bank, 2048 B, dead after its
    # allocation) and p3 (1 bank, 1024 B); p2 and p3 do not overlap
    assert c.psum_peak_banks == 2
    assert c.psum_peak_bytes == 4 + 2048


def test_two_allocations_on_one_line_both_live() -> None:
    src = HEADER_NKI + """
@nki.jit
def k(a):
    x, y = nl.ndarray((128, 8), nl.float32, nl.sbuf), nl.ndarray((128, 8), nl.float32, nl.sbuf)
    nisa.memset(dst=x, value=0.0)
    nisa.memset(dst=y, value=0.0)
    return a
"""
    assert run(src, [A]).counters.sbuf_peak_bytes == 64


def test_psum_allocations_take_a_whole_bank_each() -> None:
    src = HEADER_NKI + """
@nki.jit
def k(a):
    p1 = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)
    p2 = nl.ndarray((128, 3), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=p1, value=0.0)
    return a
"""
    c = run(src, [A]).counters
    assert c.psum_peak_banks == 2
    assert c.psum_peak_bytes == 4 + 3 * 4


def test_helper_called_in_a_loop() -> None:
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
    # x, y, s of one iteration; the last s (read after the loop) is dead before the next x anyway
    assert result.counters.sbuf_peak_bytes == 3 * 512 * 4


TILES = ("p0", "p1", "p2", "p3", "q0", "q1", "q2", "q3")


def test_capacity_error_comes_from_the_sweep_at_return() -> None:
    # the limit is exceeded early, then the kernel runs on; the error still names the first excess
    src = HEADER_NKI + """
@nki.jit
def k(a):
""" + "".join(f"    {n} = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)\n" for n in TILES) + """\
    r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)  # <-- error
""" + "".join(f"    nisa.memset(dst={n}, value=0.0)\n" for n in TILES) + """\
    s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=p0, value=0.0)
    return a
"""
    with pytest.raises(KernelLimitError, match="PSUM banks exceeded") as info:
        run(src, [A])
    message = str(info.value)
    assert "'r'" in message and "9 > 8 banks" in message and "with 8 already live" in message
    assert "live: 'p0' (line " in message and "'q1' (line " in message and "... 2 more" in message
    assert info.value.line == line_of(src)


def _records(*intervals: tuple[int, int, int]) -> list[_Record]:
    """Liveness records of SBUF allocations given as (alloc tick, last-access tick, bytes)."""
    out = []
    for start, last, nbytes in intervals:
        record = _Record.__new__(_Record)
        record.buffer, record.bytes, record.banks, record.start, record.last = "sbuf", nbytes, 0, start, last
        out.append(record)
    return out


def test_sweep_intervals_are_closed() -> None:
    # [1, 5] and [5, 7] share tick 5: live together; [1, 4] and [5, 7] do not
    assert _sweep(_records((1, 5, 10), (5, 7, 20)), 100).peak_size == 30
    assert _sweep(_records((1, 4, 10), (5, 7, 20)), 100).peak_size == 20
    # a never-accessed allocation occupies its allocation tick only
    assert _sweep(_records((1, 1, 10), (2, 9, 20), (3, 3, 40)), 100).peak_size == 60
    over = _sweep(_records((1, 9, 10), (2, 2, 50), (3, 8, 60), (4, 9, 45)), 100)
    assert over.over is not None and over.over.start == 4 and over.total == 115  # first excess: tick 4
    assert sorted(r.start for r in over.live_before) == [1, 3]
    assert over.peak_size == 115

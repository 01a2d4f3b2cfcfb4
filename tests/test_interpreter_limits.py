"""Negative interpreter tests: one per limit, each checking the error class, that the message names
the limit, and the kernel line reported."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from neuronmm_compiler.errors import (
    KernelError,
    KernelLimitError,
    UninitializedReadError,
    UnsupportedAPIError,
)

sys.path.insert(0, os.path.dirname(__file__))
from test_interpreter import HEADER_LEGACY, HEADER_NKI, line_of, run

F32 = np.float32


def expect(source: str, args: list[np.ndarray], error: type[KernelError], *phrases: str) -> KernelError:
    """Run ``source``; it must raise ``error`` at the line marked ``# <-- error`` naming ``phrases``."""
    with pytest.raises(error) as info:
        run(source, args, kernel="k")
    exc = info.value
    assert type(exc) is error, exc
    for phrase in phrases:
        assert phrase in str(exc), (phrase, str(exc))
    assert exc.line == line_of(source), (exc.line, str(exc))
    assert exc.source_line is not None and "# <-- error" in exc.source_line
    assert f"kernel line {exc.line}" in str(exc)
    return exc


def nki_kernel(body: str, params: str = "a") -> str:
    """A 0.3 kernel ``k(params)`` with ``body`` (indented 4 spaces already stripped)."""
    lines = "\n".join("    " + line if line else "" for line in body.strip("\n").splitlines())
    return HEADER_NKI + f"\n@nki.jit\ndef k({params}):\n{lines}\n"


def legacy_kernel(body: str, params: str = "a") -> str:
    lines = "\n".join("    " + line if line else "" for line in body.strip("\n").splitlines())
    return HEADER_LEGACY + f"\n@nki.jit\ndef k({params}):\n{lines}\n"


A = np.ones((128, 512), F32)


# --- NKI 0.3 -----------------------------------------------------------------------------------
def test_partition_dim_over_pmax() -> None:
    src = nki_kernel("""
t = nl.ndarray((256, 64), dtype=nl.float32, buffer=nl.sbuf)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "partition dim 256", "pmax 128")


MATMUL_SETUP = """
s = nl.ndarray((128, {m}), dtype=nl.float32, buffer=nl.sbuf)
mv = nl.ndarray((128, {n}), dtype=nl.float32, buffer=nl.sbuf)
nisa.memset(dst=s, value=1.0)
nisa.memset(dst=mv, value=1.0)
ps = nl.ndarray((128, {pn}), dtype=nl.float32, buffer=nl.psum)
"""


def test_stationary_free_over_fmax() -> None:
    src = nki_kernel(MATMUL_SETUP.format(m=256, n=128, pn=128) + """
nisa.nc_matmul(dst=ps, stationary=s, moving=mv)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "gemm_stationary_fmax 128", "M=256")


def test_moving_free_over_fmax() -> None:
    src = nki_kernel(MATMUL_SETUP.format(m=128, n=1024, pn=512) + """
nisa.nc_matmul(dst=ps, stationary=s, moving=mv)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "gemm_moving_fmax 512", "N=1024")


def test_psum_tile_wider_than_one_bank() -> None:
    """Tile-Size Constraint #2 (NKI-PSUM-TILE-FMAX): a PSUM tile fits one bank, so no matmul output can span
    two; the interpreter once accepted tiles up to the whole 16 KiB of PSUM."""
    src = nki_kernel("""
ps = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "PSUM tile wider than one bank", "4096 bytes/partition > 2048",
           "NKI-PSUM-TILE-FMAX")
    narrow = nki_kernel(MATMUL_SETUP.format(m=128, n=512, pn=512) + """
nisa.nc_matmul(dst=ps, stationary=s, moving=mv)
return a
""")
    assert run(narrow, [A]).counters.psum_peak_banks == 1


EIGHT_BANKS = "".join(f"p{i} = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)\n" for i in range(1, 9))


def test_more_than_eight_psum_banks_live() -> None:
    late_uses = "".join(f"nisa.memset(dst=p{i}, value=0.0)\n" for i in range(1, 9))
    src = nki_kernel(EIGHT_BANKS + "p9 = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)  # <-- error\n"
                     + late_uses + "return a\n")
    # p1..p8 are live until their memsets, after p9's allocation (live = allocation to last use)
    exc = expect(src, [A], KernelLimitError, "PSUM banks exceeded", "9 > 8 banks")
    assert "'p1'" in str(exc) and "'p2'" in str(exc)
    # without the late uses, every tile is live only at its allocation: 1 bank at most
    for i in range(1, 9):
        src = src.replace(f"    nisa.memset(dst=p{i}, value=0.0)\n", "")
    assert "memset" not in src
    assert run(src, [A]).counters.psum_peak_banks == 1


def test_single_psum_allocation_over_psum_size() -> None:
    src = nki_kernel("""
p = nl.ndarray((128, 4097), dtype=nl.float32, buffer=nl.psum)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "PSUM tile wider than one bank", "16388", "2048")


def test_sbuf_over_capacity() -> None:
    # trn1: 192 KiB - 16 KiB reserved = 180224 usable bytes per partition
    src = nki_kernel("""
big = nl.ndarray((128, 45000), dtype=nl.float32, buffer=nl.sbuf)
extra = nl.ndarray((2, 200), dtype=nl.float32, buffer=nl.sbuf)  # <-- error
nisa.memset(dst=big, value=0.0)
return a
""")
    exc = expect(src, [A], KernelLimitError, "SBUF capacity exceeded", "needs 800 bytes/partition",
                 "180800 > 180224 usable")
    assert "'big'" in str(exc)
    fits = src.replace("    nisa.memset(dst=big, value=0.0)\n", "")
    assert "memset" not in fits
    assert run(fits, [A]).counters.sbuf_peak_bytes == 180000


def test_sbuf_capacity_depends_on_target() -> None:
    src = nki_kernel("""
big = nl.ndarray((128, 50000), dtype=nl.float32, buffer=nl.sbuf)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "SBUF capacity exceeded")
    run(src, [A], target="trn2")  # 224 - 16 KiB usable: fits


def test_slice_out_of_bounds() -> None:
    src = nki_kernel("""
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
nisa.dma_copy(dst=t[:, 100:600], src=a[:, 0:500])  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "slice out of bounds", "100:600", "extent 512")


def test_int_index_out_of_bounds_on_hbm() -> None:
    src = nki_kernel("""
row = a[128]  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "slice out of bounds", "index 128")


def test_ds_out_of_bounds() -> None:
    src = nki_kernel("""
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
nisa.dma_copy(dst=t[:, nl.ds(384, 256)], src=a[:, 0:256])  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "slice out of bounds", "384:640")


def test_read_of_unwritten_sbuf() -> None:
    src = nki_kernel("""
out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
nisa.dma_copy(dst=t[:, 0:256], src=a[:, 0:256])
nisa.dma_copy(dst=out, src=t)  # <-- error
return out
""")
    exc = expect(src, [A], UninitializedReadError, "unwritten", "'t'", "[0:128, 256:512]")
    assert "sbuf" in str(exc)


def test_read_of_unwritten_psum() -> None:
    src = nki_kernel("""
ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_copy(dst=t, src=ps)  # <-- error
return a
""")
    expect(src, [A], UninitializedReadError, "unwritten", "'ps'", "psum")


def test_read_of_unwritten_hbm_output() -> None:
    src = nki_kernel("""
out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
nisa.dma_copy(dst=t, src=out)  # <-- error
return out
""")
    expect(src, [A], UninitializedReadError, "'out'", "hbm")


def test_unwritten_kernel_output() -> None:
    src = nki_kernel("""
out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
return out
""")
    with pytest.raises(UninitializedReadError, match="kernel output 'output0'"):
        run(src, [A])


def test_dma_touching_psum() -> None:
    src = nki_kernel("""
out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
nisa.memset(dst=ps, value=0.0)
nisa.dma_copy(dst=out, src=ps)  # <-- error
return out
""")
    expect(src, [A], KernelLimitError, "DMA cannot access PSUM")


def test_dma_dtype_mismatch() -> None:
    src = nki_kernel("""
t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
nisa.dma_copy(dst=t, src=a)  # <-- error
return a
""")
    expect(src, [A], KernelError, "DMA does not cast")


def test_matmul_operand_in_psum() -> None:
    src = nki_kernel(MATMUL_SETUP.format(m=128, n=128, pn=128) + """
nisa.memset(dst=ps, value=0.0)
nisa.nc_matmul(dst=ps, stationary=ps, moving=mv)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "must be in SBUF")


def test_tensor_tensor_both_in_psum() -> None:
    src = nki_kernel("""
p1 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
p2 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
nisa.memset(dst=p1, value=0.0)
nisa.memset(dst=p2, value=0.0)
nisa.tensor_tensor(dst=p1, data1=p1, data2=p2, op=nl.add)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "both inputs are in PSUM")


def test_disallowed_import() -> None:
    src = HEADER_NKI + "import os  # <-- error\n"
    expect(src, [A], UnsupportedAPIError, "'os'", "not allowed")


def test_mixed_dialect_imports() -> None:
    src = HEADER_NKI + "import neuronxcc.nki.language as nl2  # <-- error\n"
    expect(src, [A], UnsupportedAPIError, "mixes NKI dialects")


def test_unknown_nl_attribute() -> None:
    src = nki_kernel("""
t = nl.matmul(a, a)  # <-- error
return a
""")
    expect(src, [A], UnsupportedAPIError, "nki.language.matmul")


def test_unknown_keyword_argument() -> None:
    src = nki_kernel("""
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
nisa.dma_copy(dst=t, src=a, dge_mode=1)  # <-- error
return a
""")
    expect(src, [A], UnsupportedAPIError, "nisa.dma_copy", "dge_mode")


def test_assignment_into_tensor_is_not_0_3() -> None:
    src = nki_kernel("""
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
t[...] = a  # <-- error
return a
""")
    expect(src, [A], UnsupportedAPIError, "dst=")


def test_kernel_assertion_becomes_kernel_error() -> None:
    src = nki_kernel("""
M, N = a.shape
assert M == 64, "expected 64 rows"  # <-- error
return a
""")
    expect(src, [A], KernelError, "AssertionError", "expected 64 rows")


def test_syntax_error_names_line() -> None:
    src = nki_kernel("""
x = (1 +  # <-- error
return a
""")
    with pytest.raises(KernelError, match="does not parse"):
        run(src, [A])


# --- NKI 0.1 -----------------------------------------------------------------------------------
def test_legacy_load_over_pmax() -> None:
    src = legacy_kernel("""
t = nl.load(a)  # <-- error
return a
""")
    expect(src, [np.ones((256, 8), F32)], KernelLimitError, "partition dim 256", "pmax 128")


def test_legacy_matmul_result_into_sbuf() -> None:
    src = legacy_kernel("""
x = nl.load(a[:, 0:128])
res = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
res[...] = nisa.nc_matmul(x, x)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "must be written to PSUM")


def test_legacy_accumulate_into_sbuf() -> None:
    src = legacy_kernel("""
x = nl.load(a[:, 0:128])
res = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.sbuf)
res[...] += nisa.nc_matmul(x, x)  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "must be in PSUM")


def test_legacy_accumulate_into_unwritten_psum() -> None:
    src = legacy_kernel("""
x = nl.load(a[:, 0:128])
ps = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
ps[...] += nisa.nc_matmul(x, x)  # <-- error
return a
""")
    expect(src, [A], UninitializedReadError, "'ps'", "+= accumulation target")


def test_legacy_matmul_into_psum_spanning_banks() -> None:
    src = legacy_kernel("""
x = nl.load(a[:, 0:128])
ps = nl.zeros((128, 1024), dtype=nl.float32, buffer=nl.psum)  # <-- error
ps[:, 480:608] += nisa.nc_matmul(x, x)
return a
""")
    expect(src, [A], KernelLimitError, "PSUM tile wider than one bank", "NKI-PSUM-TILE-FMAX")


def test_legacy_store_from_psum() -> None:
    src = legacy_kernel("""
out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
x = nl.load(a[:, 0:128])
ps = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
ps[...] += nisa.nc_matmul(x, x)
nl.store(out, value=ps)  # <-- error
return out
""")
    expect(src, [A], KernelLimitError, "DMA cannot access PSUM")


def test_legacy_par_dim_not_first() -> None:
    src = legacy_kernel("""
t = nl.ndarray((4, nl.par_dim(128), 64), dtype=nl.float32, buffer=nl.sbuf)  # <-- error
return a
""")
    expect(src, [A], UnsupportedAPIError, "par_dim")


def test_legacy_unknown_attribute() -> None:
    src = legacy_kernel("""
i = nl.arange(128)[:, None]  # <-- error
return a
""")
    expect(src, [A], UnsupportedAPIError, "neuronxcc.nki.language.arange")


def test_legacy_mask_argument_unsupported() -> None:
    src = legacy_kernel("""
t = nl.load(a, mask=None)  # <-- error
return a
""")
    expect(src, [A], UnsupportedAPIError, "nl.load", "mask")


def test_legacy_ops_cannot_be_called_in_0_3() -> None:
    src = nki_kernel("""
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
u = nl.add(t, t)  # <-- error
return a
""")
    expect(src, [A], UnsupportedAPIError, "nl.add", "op=")


def test_unknown_isa_attribute() -> None:
    src = nki_kernel("""
nisa.tensor_partition_reduce(a, a)  # <-- error
return a
""")
    expect(src, [A], UnsupportedAPIError, "nki.isa.tensor_partition_reduce")


def test_error_in_helper_names_innermost_line() -> None:
    src = HEADER_NKI + """
def load_tile(src, cols):
    t = nl.ndarray((128, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src[:, 0:cols])  # <-- error
    return t

@nki.jit
def k(a):
    load_tile(a, 256)
    load_tile(a, 1024)
    return a
"""
    expect(src, [A], KernelLimitError, "slice out of bounds", "0:1024")


def test_legacy_transpose_result_into_sbuf() -> None:
    src = legacy_kernel("""
t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
t[...] = nisa.nc_transpose(nl.load(a[:, 0:128]))  # <-- error
return a
""")
    expect(src, [A], KernelLimitError, "must be written to PSUM")

"""Interpreter tests: hand-written kernels in both NKI dialects, checked against NumPy, and counters.

The kernels and helpers here are also imported by the other ``test_interpreter_*`` files.
"""

from __future__ import annotations

import numpy as np

from neuronmm_compiler.interpreter import KernelRun, run_kernel
from neuronmm_compiler.targets import get_target

HEADER_NKI = """\
import nki
import nki.language as nl
import nki.isa as nisa
"""

HEADER_LEGACY = """\
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
import neuronxcc.nki.isa as nisa
"""

# C[M, N] = A[M, K] @ B[K, N]; one tile each way (M <= 128, K <= 128, N <= 512).
SINGLE_TILE_NKI = HEADER_NKI + """
@nki.jit
def matmul_single(a, b):
    M, K = a.shape
    _, N = b.shape
    out = nl.ndarray((M, N), dtype=a.dtype, buffer=nl.shared_hbm)
    a_t = nl.ndarray((K, M), dtype=a.dtype, buffer=nl.sbuf)
    b_sb = nl.ndarray((K, N), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=a_t, src=a)
    nisa.dma_copy(dst=b_sb, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a_t, moving=b_sb)
    res = nl.ndarray((M, N), dtype=out.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out
"""

SINGLE_TILE_LEGACY = HEADER_LEGACY + """
@nki.jit
def matmul_single(a, b):
    M, K = a.shape
    _, N = b.shape
    out = nl.ndarray((M, N), dtype=a.dtype, buffer=nl.shared_hbm)
    a_t = nl.load_transpose2d(a)
    b_sb = nl.load(b)
    acc = nl.zeros((nl.par_dim(M), N), dtype=nl.float32, buffer=nl.psum)
    acc[...] += nisa.nc_matmul(a_t, b_sb)
    nl.store(out, value=nl.copy(acc, dtype=out.dtype))
    return out
"""

# Tiled with remainder tiles in every dim; a fresh PSUM tile per output tile (accumulate=None:
# the first matmul into it overwrites, the later ones accumulate).
TILED_NKI = HEADER_NKI + """
@nki.jit
def matmul_tiled(a, b):
    M, K = a.shape
    _, N = b.shape
    TM = nl.tile_size.gemm_stationary_fmax
    TK = nl.tile_size.pmax
    TN = nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((M, N), dtype=a.dtype, buffer=nl.shared_hbm)
    for m0 in range(0, M, TM):
        msz = min(TM, M - m0)
        for n0 in range(0, N, TN):
            nsz = min(TN, N - n0)
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k0 in range(0, K, TK):
                ksz = min(TK, K - k0)
                a_t = nl.ndarray((TK, TM), dtype=a.dtype, buffer=nl.sbuf)
                b_sb = nl.ndarray((TK, TN), dtype=b.dtype, buffer=nl.sbuf)
                nisa.dma_transpose(dst=a_t[0:ksz, 0:msz], src=a[nl.ds(m0, msz), nl.ds(k0, ksz)])
                nisa.dma_copy(dst=b_sb[0:ksz, 0:nsz], src=b[k0:k0 + ksz, n0:n0 + nsz])
                nisa.nc_matmul(dst=acc[0:msz, 0:nsz], stationary=a_t[0:ksz, 0:msz],
                               moving=b_sb[0:ksz, 0:nsz])
            res = nl.ndarray((TM, TN), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res[0:msz, 0:nsz], src=acc[0:msz, 0:nsz])
            nisa.dma_copy(dst=out[m0:m0 + msz, n0:n0 + nsz], src=res[0:msz, 0:nsz])
    return out
"""

TILED_LEGACY = HEADER_LEGACY + """
@nki.jit
def matmul_tiled(a, b):
    M, K = a.shape
    _, N = b.shape
    TM = nl.tile_size.gemm_stationary_fmax
    TK = nl.tile_size.pmax
    TN = nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((M, N), dtype=a.dtype, buffer=nl.shared_hbm)
    for m0 in nl.affine_range(0, M, TM):
        msz = min(TM, M - m0)
        for n0 in nl.affine_range(0, N, TN):
            nsz = min(TN, N - n0)
            acc = nl.zeros((nl.par_dim(TM), TN), dtype=nl.float32, buffer=nl.psum)
            for k0 in nl.sequential_range(0, K, TK):
                ksz = min(TK, K - k0)
                a_t = nl.load_transpose2d(a[m0:m0 + msz, k0:k0 + ksz])
                b_sb = nl.load(b[nl.ds(k0, ksz), nl.ds(n0, nsz)])
                acc[0:msz, 0:nsz] += nisa.nc_matmul(a_t, b_sb)
            res = nl.copy(acc[0:msz, 0:nsz], dtype=out.dtype)
            nl.store(out[m0:m0 + msz, n0:n0 + nsz], value=res)
    return out
"""


def run(source: str, args: list[np.ndarray], *, kernel: str | None = None, target: str = "trn1",
        **kwargs: object) -> KernelRun:
    """Run the (first, unless named) kernel function of ``source``."""
    if kernel is None:
        kernel = source.split("def ", 1)[1].split("(", 1)[0]
    return run_kernel(source, filename="<test-kernel>", kernel_name=kernel, args=args,
                      target=get_target(target), **kwargs)


def line_of(source: str, marker: str = "# <-- error") -> int:
    """1-based line number of the (only) line containing ``marker``."""
    hits = [i + 1 for i, text in enumerate(source.splitlines()) if marker in text]
    assert len(hits) == 1, hits
    return hits[0]


def rel_err(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """max |got - A@B| / max |A@B|, the reference in float64."""
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())

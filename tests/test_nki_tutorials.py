"""No false positives on known-good NKI: kernels written here from AWS's published tutorials' descriptions (not
copied; each names the doc page it follows) pass the static rule pass on every target and Neuron SDK release the
support matrix gives their dialect.

NKI 0.1 (``neuronxcc``): the matrix multiplication tutorial (LEGACY_DOCS, general/nki/tutorials/
matrix_multiplication.rst): the basic single-tile kernel, the tiled kernel, hoisted loads, blocked free
dimensions, and the fully optimized kernel (K blocks in a sequential loop, partial sums accumulated in SBUF).
That page's later kernels lay their tiles out with block dimensions (dimensions before ``nl.par_dim``), which the
block-dimension announcement makes an error from SDK 2.25 (NKI-BLOCK-DIM); the kernels here use the layout the
migration guide gives instead (partition dimension first, nki/migration/index.rst "Removing block dimensions
from NKI kernels"), and a test below shows the block-dimension layout is reported as exactly that rule.

Current NKI (``nki``): the same tutorial in the current docs (nki/guides/tutorials/matrix_multiplication.rst:
``nisa.dma_copy``, ``nisa.nc_matmul`` with ``dst=``, ``nisa.tensor_copy`` out of PSUM), the blocked matmul of
"Profile a NKI Kernel" (nki/guides/use-neuron-profile.rst: SBUF result tiles zeroed with ``nisa.memset``, K blocks
in a sequential loop, PSUM tiles added into them with ``nisa.tensor_tensor``), and a transpose plus elementwise
kernel from the ISA pages (``nc_transpose`` SBUF -> PSUM, the hardware-DGE ``dma_transpose`` of nki-dge.rst,
``activation`` and ``tensor_tensor``).
"""

from __future__ import annotations

import pytest

from neuronmm_compiler.support import KNOWN_SDKS, SUPPORT
from neuronmm_compiler.verification.static_check import check_kernel_source
from neuronmm_compiler.vocab import Dialect

LEGACY = """\
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
"""
CURRENT = """\
import nki
import nki.isa as nisa
import nki.language as nl
"""

# --- NKI 0.1: the matrix multiplication tutorial ------------------------------------------------------------------

#: "Basic compute kernel": one 64(M) x 128(K) x 512(N) tile; LHS loaded transposed ([K, M]), indices from nl.mgrid,
#: nl.matmul with transpose_x, nl.copy out of PSUM, nl.store.
LEGACY_BASIC = LEGACY + """

@nki.jit
def matmul_basic(lhsT, rhs):
    out = nl.ndarray((64, 512), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    ik, im = nl.mgrid[0:128, 0:64]
    jk, jn = nl.mgrid[0:128, 0:512]
    om, on = nl.mgrid[0:64, 0:512]
    lhs_sb = nl.load(lhsT[ik, im])
    rhs_sb = nl.load(rhs[jk, jn])
    acc = nl.matmul(lhs_sb, rhs_sb, transpose_x=True)
    res = nl.copy(acc, dtype=out.dtype)
    nl.store(out[om, on], value=res)
    return out
"""

#: "Tiling matrix multiplications": m and n tile loops, a zeroed PSUM accumulator per (m, n), the K loop an
#: nl.affine_range accumulating with += (the pattern the page names as the way to get PSUM accumulation).
LEGACY_TILED = LEGACY + """

@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                a = nl.ndarray((128, 128), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
                a[...] = nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                b[...] = nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                acc += nisa.nc_matmul(a[0:128, 0:128], b[0:128, 0:512])
            res = nl.copy(acc, dtype=out.dtype)
            nl.store(out[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], value=res)
    return out
"""

#: "Optimization 1: Removing Redundant Loads": the K strip of lhsT loaded once per m tile, of rhs once per (m, n).
LEGACY_HOISTED = LEGACY + """

@nki.jit
def matmul_hoisted(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        a_strip = nl.ndarray((nl.par_dim(128), 8, 128), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(8):
            a_strip[0:128, k, 0:128] = nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
        for n in nl.affine_range(N // 512):
            b_strip = nl.ndarray((nl.par_dim(128), 8, 512), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(8):
                b_strip[0:128, k, 0:512] = nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(8):
                acc += nisa.nc_matmul(a_strip[0:128, k, 0:128], b_strip[0:128, k, 0:512])
            nl.store(out[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], value=nl.copy(acc, dtype=out.dtype))
    return out
"""

#: "Optimization 2: Reuse More Load Through Blocking": 2 x 2 tiles per (m, n) block, K not blocked.
LEGACY_BLOCK_FREE = LEGACY + """

@nki.jit
def matmul_block_free(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 256):
        a_block = nl.ndarray((nl.par_dim(128), 8, 256), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(8):
            a_block[0:128, k, 0:256] = nl.load(lhsT[k * 128:(k + 1) * 128, m * 256:(m + 1) * 256])
        for n in nl.affine_range(N // 1024):
            b_block = nl.ndarray((nl.par_dim(128), 8, 1024), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(8):
                b_block[0:128, k, 0:1024] = nl.load(rhs[k * 128:(k + 1) * 128, n * 1024:(n + 1) * 1024])
            for bm in nl.affine_range(2):
                for bn in nl.affine_range(2):
                    acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(8):
                        acc += nisa.nc_matmul(a_block[0:128, k, bm * 128:(bm + 1) * 128],
                                              b_block[0:128, k, bn * 512:(bn + 1) * 512])
                    row = (m * 2 + bm) * 128
                    col = (n * 2 + bn) * 512
                    nl.store(out[row:row + 128, col:col + 512], value=nl.copy(acc, dtype=out.dtype))
    return out
"""

#: "Optimization 3: Further Blocking and DMA Efficiency Optimization": 16 / 2 / 8 tiles per block (M / N / K), the
#: K-block loop an nl.sequential_range, partial sums of each K block added into SBUF result tiles, one store per
#: result row of tiles.
LEGACY_OPTIMIZED = LEGACY + """

@nki.jit
def matmul_optimized(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in nl.affine_range(N // 1024):
        res = nl.zeros((nl.par_dim(128), 4, 16, 1024), dtype=lhsT.dtype, buffer=nl.sbuf)  # M <= 4 * 2048
        for kb in nl.sequential_range(K // 1024):
            b_block = nl.ndarray((nl.par_dim(128), 8, 1024), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(8):
                row = (kb * 8 + k) * 128
                b_block[0:128, k, 0:1024] = nl.load(rhs[row:row + 128, n * 1024:(n + 1) * 1024])
            for m in nl.affine_range(M // 2048):
                a_block = nl.ndarray((nl.par_dim(128), 8, 2048), dtype=lhsT.dtype, buffer=nl.sbuf)
                for k in nl.affine_range(8):
                    row = (kb * 8 + k) * 128
                    a_block[0:128, k, 0:2048] = nl.load(lhsT[row:row + 128, m * 2048:(m + 1) * 2048])
                for bn in nl.affine_range(2):
                    for bm in nl.affine_range(16):
                        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
                        for k in nl.affine_range(8):
                            acc += nisa.nc_matmul(a_block[0:128, k, bm * 128:(bm + 1) * 128],
                                                  b_block[0:128, k, bn * 512:(bn + 1) * 512])
                        res[0:128, m, bm, bn * 512:(bn + 1) * 512] = nl.add(
                            res[0:128, m, bm, bn * 512:(bn + 1) * 512], acc)
        for m in nl.affine_range(M // 2048):
            for bm in nl.affine_range(16):
                row = (m * 16 + bm) * 128
                nl.store(out[row:row + 128, n * 1024:(n + 1) * 1024], value=res[0:128, m, bm, 0:1024])
    return out
"""

# --- current NKI --------------------------------------------------------------------------------------------------

#: Current matrix multiplication tutorial, "Basic compute kernel": nisa.dma_copy in, nisa.nc_matmul into a PSUM
#: tile, nisa.tensor_copy to SBUF, nisa.dma_copy out.
CURRENT_BASIC = CURRENT + """

@nki.jit
def matmul_basic(lhsT, rhs):
    out = nl.ndarray((64, 512), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 64), dtype=lhsT.dtype, buffer=nl.sbuf)
    b = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhsT[0:128, 0:64])
    nisa.dma_copy(dst=b, src=rhs[0:128, 0:512])
    acc = nl.ndarray((64, 512), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    res = nl.ndarray((64, 512), dtype=lhsT.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out
"""

#: Current tutorial, "Tiling matrix multiplications": a PSUM tile per (m, n); in the K loop the first nc_matmul
#: overwrites it and the later ones accumulate.
CURRENT_TILED = CURRENT + """

@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                a = nl.ndarray((128, 128), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                nisa.dma_copy(dst=b, src=rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            res = nl.ndarray((128, 512), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], src=res)
    return out
"""

#: "Profile a NKI Kernel" (use-neuron-profile.rst), its blocked matmul: result M-tiles in SBUF zeroed with
#: nisa.memset, K blocks in nl.sequential_range, rhs and lhsT blocks loaded one DMA per K tile, each PSUM tile added
#: into its result M-tile with nisa.tensor_tensor, the M-tiles stored per N block.
CURRENT_BLOCKED = CURRENT + """

@nki.jit
def matmul_blocked(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in nl.affine_range(N // 1024):
        tiles = []
        for m in nl.affine_range(M // 2048):
            for mt in nl.affine_range(16):
                tile = nl.ndarray((128, 2, 512), dtype=lhsT.dtype, buffer=nl.sbuf)
                nisa.memset(dst=tile, value=0.0)
                tiles.append(tile)
        for kb in nl.sequential_range(K // 1024):
            b_block = nl.ndarray((128, 8, 1024), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in range(8):
                row = (kb * 8 + k) * 128
                nisa.dma_copy(dst=b_block[0:128, k, 0:1024], src=rhs[row:row + 128, n * 1024:(n + 1) * 1024])
            for m in nl.affine_range(M // 2048):
                a_block = nl.ndarray((128, 8, 2048), dtype=lhsT.dtype, buffer=nl.sbuf)
                for k in nl.affine_range(8):
                    row = (kb * 8 + k) * 128
                    nisa.dma_copy(dst=a_block[0:128, k, 0:2048], src=lhsT[row:row + 128, m * 2048:(m + 1) * 2048])
                for nt in nl.affine_range(2):
                    for mt in nl.affine_range(16):
                        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
                        for k in nl.affine_range(8):
                            nisa.nc_matmul(dst=acc, stationary=a_block[0:128, k, mt * 128:(mt + 1) * 128],
                                           moving=b_block[0:128, k, nt * 512:(nt + 1) * 512])
                        tile = tiles[m * 16 + mt]
                        nisa.tensor_tensor(dst=tile[0:128, nt, 0:512], data1=tile[0:128, nt, 0:512], data2=acc,
                                           op=nl.add)
        for m in nl.affine_range(M // 2048):
            for mt in nl.affine_range(16):
                flat = tiles[m * 16 + mt].reshape((128, 1024))
                row = (m * 16 + mt) * 128
                nisa.dma_copy(dst=out[row:row + 128, n * 1024:(n + 1) * 1024], src=flat[0:128, 0:1024])
    return out
"""

#: A transpose and elementwise kernel from the ISA pages: x [128, 64] transposed on the TensorEngine (nc_transpose
#: reads SBUF, writes PSUM, dst dtype = data dtype), y [16, 128] transposed by a hardware-DGE dma_transpose
#: (nki-dge.rst "Hardware DGE transpose": src [16, ...], last dim a multiple of 128, 2-byte dtype), then
#: silu(x^T) * y^T by nisa.activation and nisa.tensor_tensor, stored with nisa.dma_copy.
CURRENT_TRANSPOSE = CURRENT + """

@nki.jit
def transpose_mul(x, y):
    out = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    xs = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x[0:128, 0:64])
    xt_psum = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.psum)
    nisa.nc_transpose(dst=xt_psum, data=xs)
    act = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=act, op=nl.silu, data=xt_psum)
    yt = nl.ndarray((128, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst=yt, src=y[0:16, 0:128], dge_mode=nisa.dge_mode.hwdge)
    yt_wide = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=yt_wide, src=y[16:80, 0:128])
    prod = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=act, data2=yt_wide, op=nl.multiply)
    nisa.dma_copy(dst=out, src=prod)
    return out
"""

#: Argument dtypes as an nmmc kernel file's metadata line records them, so dtype rules see the operands.
METADATA = ('# nmmc-metadata: {"inputs": [{"name": "lhsT", "dtype": "bfloat16"}, {"name": "rhs", "dtype": '
            '"bfloat16"}, {"name": "x", "dtype": "bfloat16"}, {"name": "y", "dtype": "bfloat16"}]}\n')

KERNELS = {
    "legacy-basic": (Dialect.NEURONXCC, LEGACY_BASIC),
    "legacy-tiled": (Dialect.NEURONXCC, LEGACY_TILED),
    "legacy-hoisted": (Dialect.NEURONXCC, LEGACY_HOISTED),
    "legacy-block-free": (Dialect.NEURONXCC, LEGACY_BLOCK_FREE),
    "legacy-optimized": (Dialect.NEURONXCC, LEGACY_OPTIMIZED),
    "current-basic": (Dialect.NKI, CURRENT_BASIC),
    "current-tiled": (Dialect.NKI, CURRENT_TILED),
    "current-blocked": (Dialect.NKI, CURRENT_BLOCKED),
    "current-transpose": (Dialect.NKI, CURRENT_TRANSPOSE),
}


def _where(dialect: Dialect) -> list[tuple[str, str]]:
    """Every (target, SDK release) the support matrix documents the dialect on."""
    return [(target, sdk) for entry in SUPPORT if entry.dialect is dialect for target in entry.targets
            for sdk in KNOWN_SDKS if entry.covers(dialect, target, sdk)]


@pytest.mark.parametrize("name", KERNELS)
def test_tutorial_kernels_pass_where_the_docs_run_them(name):
    dialect, source = KERNELS[name]
    where = _where(dialect)
    assert len(where) >= 8
    for target, sdk in where:
        for text in (source, METADATA + source):
            found = check_kernel_source(text, dialect=dialect, target=target, sdk=sdk)
            assert found == [], (name, target, sdk, [str(v) for v in found])


def test_the_kernels_exercise_the_checked_calls():
    """The known-good kernels reach the calls the checker has rules for (so passing means something)."""
    legacy = LEGACY_TILED + LEGACY_OPTIMIZED
    current = CURRENT_BLOCKED + CURRENT_TRANSPOSE
    for call in ("nisa.nc_matmul(", "nl.affine_range(", "nl.sequential_range(", "nl.par_dim(", "buffer=nl.psum"):
        assert call in legacy, call
    for call in ("nisa.nc_matmul(dst=", "nisa.nc_transpose(", "nisa.dma_transpose(", "nisa.activation(",
                 "nisa.tensor_tensor(", "nisa.memset(", "nisa.tensor_copy(", "nisa.dma_copy("):
        assert call in current + CURRENT_TILED, call


def test_the_legacy_tutorials_block_dimension_layout_is_exactly_the_block_dim_rule():
    """The NKI 0.1 tutorial page lays its hoisted tiles out as (K // 128, nl.par_dim(128), 128): block dimensions,
    an error from SDK 2.25 by the block-dimension announcement. The same kernel with that layout is reported as
    NKI-BLOCK-DIM on every SDK the neuronxcc dialect is supported on, and as nothing else."""
    source = (LEGACY_HOISTED
              .replace("nl.ndarray((nl.par_dim(128), 8, 128)", "nl.ndarray((8, nl.par_dim(128), 128)")
              .replace("nl.ndarray((nl.par_dim(128), 8, 512)", "nl.ndarray((8, nl.par_dim(128), 512)")
              .replace("a_strip[0:128, k, 0:128]", "a_strip[k, 0:128, 0:128]")
              .replace("b_strip[0:128, k, 0:512]", "b_strip[k, 0:128, 0:512]"))
    assert source.count("nl.par_dim(128), ") == 2
    for target, sdk in _where(Dialect.NEURONXCC):
        found = check_kernel_source(source, dialect="neuronxcc", target=target, sdk=sdk)
        assert {v.rule_id for v in found} == {"NKI-BLOCK-DIM"} and len(found) == 2, (target, sdk, found)

"""Interpreter tests: hand-written kernels in both NKI dialects, checked against NumPy, and counters.

The kernels and helpers here are also imported by the other ``test_interpreter_*`` files.
"""

from __future__ import annotations

import collections
import json

import ml_dtypes
import numpy as np
import pytest

from neuronmm_compiler.errors import KernelError
from neuronmm_compiler.interpreter import KernelRun, run_kernel
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.vocab import Dialect

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


# --- kernels against NumPy ---------------------------------------------------------------------
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
# bf16 operands (8-bit mantissa) with fp32 accumulation and a bf16 output: the output rounding alone
# is 2^-9 relative; 1e-2 leaves room for K up to a few thousand. fp32 end to end: ~K * 2^-24.
TOLERANCE = {BF16: 1e-2, F32: 1e-5}


def random_inputs(m: int, k: int, n: int, dtype: np.dtype, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)]


@pytest.mark.parametrize("source", [SINGLE_TILE_NKI, SINGLE_TILE_LEGACY], ids=["nki", "legacy"])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(128, 128, 512), (37, 5, 300), (1, 1, 1)])
def test_single_tile_matmul(source: str, dtype: np.dtype, shape: tuple[int, int, int]) -> None:
    a, b = random_inputs(*shape, dtype)
    result = run(source, [a, b])
    (out,) = result.outputs
    assert out.dtype == dtype and out.shape == (shape[0], shape[2])
    assert rel_err(out, a, b) < TOLERANCE[dtype]
    assert result.counters.matmul_instructions == 1


@pytest.mark.parametrize("source", [TILED_NKI, TILED_LEGACY], ids=["nki", "legacy"])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(200, 300, 700), (128, 256, 1024), (129, 129, 513)])
def test_tiled_matmul_with_remainders(source: str, dtype: np.dtype, shape: tuple[int, int, int]) -> None:
    a, b = random_inputs(*shape, dtype, seed=1)
    (out,) = run(source, [a, b]).outputs
    assert out.dtype == dtype
    assert rel_err(out, a, b) < TOLERANCE[dtype]


def tiles(extent: int, tile: int) -> list[int]:
    """Sizes of the tiles covering ``extent`` (last one may be short)."""
    return [min(tile, extent - start) for start in range(0, extent, tile)]


@pytest.mark.parametrize("dialect", ["nki", "legacy"])
def test_tiled_matmul_counters_exact(dialect: str) -> None:
    m, k, n, item = 200, 300, 700, 4
    a, b = random_inputs(m, k, n, F32)
    source = TILED_NKI if dialect == "nki" else TILED_LEGACY
    c = run(source, [a, b], output_names=["c"]).counters
    m_tiles, k_tiles, n_tiles = tiles(m, 128), tiles(k, 128), tiles(n, 512)
    mt, kt, nt = len(m_tiles), len(k_tiles), len(n_tiles)
    assert c.hbm_bytes_read == {"a": nt * m * k * item, "b": mt * k * n * item, "c": 0}
    assert c.hbm_bytes_written == {"a": 0, "b": 0, "c": m * n * item}
    assert c.total_hbm_bytes_read == (nt * m * k + mt * k * n) * item
    assert c.dma_transfers == 2 * mt * nt * kt + mt * nt
    assert c.dma_transposes == mt * nt * kt
    expected_hist: collections.Counter[int] = collections.Counter()
    for msz in m_tiles:
        for nsz in n_tiles:
            for _ksz in k_tiles:
                expected_hist[msz * item] += 1  # A^T tile [ksz, msz]: msz elements per partition
                expected_hist[nsz * item] += 1  # B tile [ksz, nsz]
            expected_hist[nsz * item] += 1  # store of C tile [msz, nsz]
    assert c.dma_bytes_per_partition == dict(expected_hist)
    assert c.matmul_instructions == mt * nt * kt
    assert c.matmul_moving_columns == mt * kt * n
    assert c.tensor_copies == mt * nt
    assert (c.transposes, c.tensor_tensor_ops, c.activations) == (0, 0, 0)
    assert c.psum_peak_banks == 1 and c.psum_peak_bytes == 512 * 4
    if dialect == "nki":
        assert c.memsets == 0
        # a_t [128, 128] + b_sb [128, 512] live together until the last matmul of an output tile;
        # res [128, 512] is allocated after it (a_t, b_sb dead) and dies at its store
        assert c.sbuf_peak_bytes == (128 + 512) * item
    else:
        assert c.memsets == mt * nt  # nl.zeros of the PSUM tile
        assert c.sbuf_peak_bytes == 0  # 0.1 op results are temporaries
    json.dumps(c.as_dict())


def test_dialect_reported() -> None:
    a, b = random_inputs(4, 4, 4, F32)
    nki_run, legacy_run = run(SINGLE_TILE_NKI, [a, b]), run(SINGLE_TILE_LEGACY, [a, b])
    assert nki_run.dialect is Dialect.NKI and nki_run.dialect.nki_version == "0.3"
    assert legacy_run.dialect is Dialect.NEURONXCC and legacy_run.dialect.nki_version == "0.1"


ELEMENTWISE_NKI = HEADER_NKI + """
@nki.jit
def gated(x, g, bias):
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    x_sb = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    g_sb = nl.ndarray((P, F), dtype=g.dtype, buffer=nl.sbuf)
    b_sb = nl.ndarray((P, 1), dtype=bias.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)
    nisa.dma_copy(dst=g_sb, src=g)
    nisa.dma_copy(dst=b_sb, src=bias)
    act = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=act, op=nl.silu, data=x_sb, bias=b_sb, scale=0.5)
    prod = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=act, data2=g_sb, op=nl.multiply)
    nisa.memset(dst=act, value=1.0)
    nisa.tensor_tensor(dst=prod, data1=prod, data2=act, op=nl.add)
    nisa.dma_copy(dst=out, src=prod)
    return out
"""

ELEMENTWISE_LEGACY = HEADER_LEGACY + """
@nki.jit
def gated(x, g, bias):
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    x_sb = nl.load(x)
    act = nisa.activation(op=nl.silu, data=x_sb, bias=nl.load(bias), scale=0.5, dtype=nl.float32)
    prod = nl.multiply(act, nl.load(g), dtype=x.dtype)
    ones = nisa.activation(op=nl.exp, data=nl.subtract(x_sb, x_sb))
    nl.store(out, value=nisa.tensor_tensor(prod, ones, op=nl.add))
    return out
"""


@pytest.mark.parametrize("source", [ELEMENTWISE_NKI, ELEMENTWISE_LEGACY], ids=["nki", "legacy"])
def test_elementwise_ops(source: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((96, 200)).astype(BF16)
    g = rng.standard_normal((96, 200)).astype(BF16)
    bias = rng.standard_normal((96, 1)).astype(BF16)
    result = run(source, [x, g, bias])
    z = x.astype(np.float32) * np.float32(0.5) + bias.astype(np.float32)
    silu = z / (1 + np.exp(-z))
    expected = (silu * g.astype(np.float32)).astype(BF16).astype(np.float32) + 1
    np.testing.assert_allclose(result.outputs[0].astype(np.float32), expected, rtol=1e-2, atol=1e-2)
    assert result.counters.activations >= 1 and result.counters.tensor_tensor_ops >= 2


ACCUMULATE_NKI = HEADER_NKI + """
@nki.jit
def acc_modes(a, b):
    K, M = a.shape
    _, N = b.shape
    out = nl.ndarray((4, M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    a_sb = nl.ndarray((K, M), dtype=a.dtype, buffer=nl.sbuf)
    b_sb = nl.ndarray((K, N), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=a)
    nisa.dma_copy(dst=b_sb, src=b)
    ps = nl.ndarray((M, 4, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps[:, 0, :], stationary=a_sb, moving=b_sb)
    nisa.nc_matmul(dst=ps[:, 0, :], stationary=a_sb, moving=b_sb)
    nisa.nc_matmul(dst=ps[:, 1, :], stationary=a_sb, moving=b_sb, accumulate=False)
    nisa.nc_matmul(dst=ps[:, 1, :], stationary=a_sb, moving=b_sb, accumulate=False)
    nisa.memset(dst=ps[:, 2, :], value=1.0)
    nisa.nc_matmul(dst=ps[:, 2, :], stationary=a_sb, moving=b_sb, accumulate=True)
    nisa.nc_matmul(dst=ps[0:M, 3, 0:N // 2], stationary=a_sb, moving=b_sb[:, 0:N // 2])
    nisa.nc_matmul(dst=ps[0:M, 3, N // 2:N], stationary=a_sb, moving=b_sb[:, N // 2:N])
    nisa.nc_matmul(dst=ps[:, 3, :], stationary=a_sb, moving=b_sb)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    for i in range(4):
        nisa.tensor_copy(dst=res, src=ps[:, i, :])
        nisa.dma_copy(dst=out[i], src=res)
    return out
"""


def test_matmul_accumulate_modes() -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((64, 32)).astype(F32)
    b = rng.standard_normal((64, 128)).astype(F32)
    (out,) = run(ACCUMULATE_NKI, [a, b]).outputs
    ab = a.T.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out[0], 2 * ab, rtol=1e-5, atol=1e-4)  # None: overwrite, then add
    np.testing.assert_allclose(out[1], ab, rtol=1e-5, atol=1e-4)  # False: overwrite twice
    np.testing.assert_allclose(out[2], ab + 1, rtol=1e-5, atol=1e-4)  # True: onto the memset
    np.testing.assert_allclose(out[3], 2 * ab, rtol=1e-5, atol=1e-4)  # None: halves written, then add


def test_matmul_with_implicit_accumulate_into_a_partly_written_tile_is_an_error() -> None:
    """The hardware has one accumulate flag per instruction: a tile written in part cannot be
    accumulated into in part and overwritten in part (it once mixed the two per element)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((64, 32)).astype(F32)
    b = rng.standard_normal((64, 128)).astype(F32)
    source = ACCUMULATE_NKI.replace(
        "    nisa.nc_matmul(dst=ps[0:M, 3, N // 2:N], stationary=a_sb, moving=b_sb[:, N // 2:N])\n", "")
    assert source != ACCUMULATE_NKI
    with pytest.raises(KernelError, match="only partly written"):
        run(source, [a, b])


TRANSPOSE_NKI = HEADER_NKI + """
@nki.jit
def transpose(x):
    P, F = x.shape
    out = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
    x_sb = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)
    t_ps = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=t_ps, data=x_sb)
    t_sb = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t_sb, src=t_ps)
    nisa.dma_copy(dst=out, src=t_sb)
    return out
"""

TRANSPOSE_LEGACY = HEADER_LEGACY + """
@nki.jit
def transpose(x):
    P, F = x.shape
    out = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
    t_ps = nl.ndarray((nl.par_dim(F), P), dtype=nl.float32, buffer=nl.psum)
    t_ps[...] = nisa.nc_transpose(nl.load(x))
    nl.store(out, value=nl.copy(t_ps, dtype=x.dtype))
    return out
"""


def test_nc_transpose_does_not_cast() -> None:
    x = np.random.default_rng(7).standard_normal((96, 80)).astype(BF16)
    casting = TRANSPOSE_NKI.replace("t_ps = nl.ndarray((F, P), dtype=x.dtype",
                                    "t_ps = nl.ndarray((F, P), dtype=nl.float32")
    with pytest.raises(KernelError, match="must equal the data dtype"):
        run(casting, [x])


@pytest.mark.parametrize("source", [TRANSPOSE_NKI, TRANSPOSE_LEGACY], ids=["nki", "legacy"])
def test_nc_transpose(source: str) -> None:
    x = np.random.default_rng(7).standard_normal((96, 80)).astype(BF16)
    result = run(source, [x])
    np.testing.assert_array_equal(result.outputs[0], x.T)
    assert result.counters.transposes == 1


def test_cast_on_write_rounds_to_nearest() -> None:
    a = np.random.default_rng(9).standard_normal((8, 16)).astype(F32)
    b = np.eye(16, dtype=F32)
    source = SINGLE_TILE_NKI.replace("dtype=out.dtype, buffer=nl.sbuf", "dtype=nl.bfloat16, "
                                     "buffer=nl.sbuf").replace("dtype=a.dtype, buffer=nl.shared_hbm",
                                                               "dtype=nl.bfloat16, buffer=nl.shared_hbm")
    (out,) = run(source, [a, b]).outputs
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, a.astype(BF16))


def test_names_of_counters_follow_arg_and_output_names() -> None:
    a, b = random_inputs(8, 8, 8, F32)
    c = run(SINGLE_TILE_NKI, [a, b], arg_names=["x", "w"], output_names=["y"]).counters
    assert set(c.hbm_bytes_read) == {"x", "w", "y"}
    assert c.hbm_bytes_written["y"] == 8 * 8 * 4


def test_inputs_are_not_modified_and_outputs_keep_hbm_dtype() -> None:
    a, b = random_inputs(16, 16, 16, BF16)
    before = a.copy()
    (out,) = run(SINGLE_TILE_LEGACY, [a, b]).outputs
    np.testing.assert_array_equal(a, before)
    assert out.dtype == BF16


@pytest.mark.parametrize("kernel", ["graph-svd_mlp-nki", "graph-svd_mlp-neuronxcc"])
def test_nl_identity_is_not_an_activation(kernel) -> None:
    """NKI's identity activation is nl.copy; nl.identity does not exist, and a kernel naming it
    must not verify (issue 12, finding 6)."""
    from pathlib import Path

    from neuronmm_compiler.errors import NmmcError
    from neuronmm_compiler.verification import verify_source

    source = (Path(__file__).parent / "golden" / "kernels" / f"{kernel}.py").read_text()
    silu = "op=nl.silu" if "op=nl.silu" in source else "nl.silu("  # the legacy dialect calls nl.silu(x)
    assert silu in source
    with pytest.raises(NmmcError, match="identity"):
        verify_source(source.replace(silu, silu.replace("silu", "identity"), 1), filename=f"{kernel}.py")

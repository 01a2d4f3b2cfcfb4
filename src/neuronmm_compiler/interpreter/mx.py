"""The MX instructions of NeuronCore-v4 in the interpreter: ``nisa.nc_matmul_mx`` and ``nisa.quantize_mx``, the packed
``_x4`` dtypes and the ``uint8`` scale tiles they use (docs/mx.md).

A packed tile is a NumPy array of the ``_x4`` dtype (ir/mx.py, ``numpy_dtype``: four elements' bits in one word), so
DMA copies and slices move packed elements whole, as the hardware does; the instructions unpack them. What each checks,
by rule id (verification/rules.py), as the NKI ISA reference states it (aws-neuron/aws-neuron-sdk@81ce03ae,
nki/api/nki/isa/__init__.py):

- NKI-MX-TARGET: both are "Available only on NeuronCore-v4 and newer" (a target with no MX format refuses them).
- NKI-MX-MATMUL-TILE (nc_matmul_mx, "Tile size", "Memory types", "Data types"): stationary and moving in SBUF, of the
  ``_x4`` dtypes, their partitions identical, a multiple of 32 and at most 128; the stationary's free size even and at
  most 128; the moving's at most 4096 (fp32 dst) or 8192 (bf16 dst); dst in PSUM, float32 or bfloat16; no
  ``perf_mode``, and no column tiling ("Tensor Engine supports only row tiling mode": nmmc emits none).
- NKI-MX-QUANTIZE-TILE (quantize_mx, "Tile size", "Data types"): src bf16/fp16 in SBUF, its partitions a multiple of 32
  up to 128 and its free size (all free axes, the 4 packed elements innermost) a multiple of 4; dst
  ``float8_e5m2_x4`` or ``float8_e4m3fn_x4`` ("Quantize-MX does not support an FP4 output") with a quarter of the free
  size.
- NKI-MX-SCALE-LAYOUT: a scale tile is uint8 (or float8_e8m0fnu) with the data tile's shape when it spans more than one
  quadrant, or ``P // 8`` rows within one, and holds group ``g``'s scale on partition ``32 (g // 4) + g % 4`` (the
  guide's "Scale Tensor"); an instruction reading a scale partition that no scale was written to, or finding scale
  partitions of another tile, fails here.

Arithmetic: quantize_mx computes each group's scale ``2^(floor(log2 max|v|) - (E_max - 1))`` (2^-127 for zeros) and
rounds ``v / scale`` to nearest even into the element type (ir/mx.py, the reference's own rule, applied here to the
partitions and packed elements of the tile); nc_matmul_mx multiplies every element by its group's scale (exact:
powers of two) and accumulates ``stationary.T @ moving`` over the partitions and the 4 packed elements in fp32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from ..errors import KernelError, KernelLimitError, UnsupportedAPIError
from ..ir.mx import (
    E8M0_BIAS,
    E8M0_MAX,
    E8M0_MIN,
    GROUP_PARTITIONS,
    MX_PACK,
    QUADRANT,
    X4_DTYPES,
    numpy_dtype,
    pack_elements,
    round_element,
    scale_partition,
    unpack_elements,
)
from . import ops
from .modules import api
from .tensor import SBUF, Tensor, mark_written, require_written, write

if TYPE_CHECKING:
    from .machine import Machine

__all__ = ["MX_DTYPES", "isa_attrs", "language_attrs"]

TARGET_RULE = "NKI-MX-TARGET"
MATMUL_RULE = "NKI-MX-MATMUL-TILE"
QUANTIZE_RULE = "NKI-MX-QUANTIZE-TILE"
SCALE_RULE = "NKI-MX-SCALE-LAYOUT"
UINT8 = np.dtype(np.uint8)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
#: The dtypes an MX kernel allocates besides the others: the packed data, its uint8 scales (or float8_e8m0fnu)
MX_DTYPES = (*(numpy_dtype(d) for d in X4_DTYPES), UINT8, E8M0)
#: Moving free size at most "4096 when dst is in float32 or 8192 when dst is in bfloat16" (nc_matmul_mx, "Tile size")
MOVING_FMAX = {np.dtype(np.float32): 4096, np.dtype(ml_dtypes.bfloat16): 8192}


def packed_name(t: Tensor) -> str | None:
    """The ``_x4`` dtype of a tile, else None."""
    names = t.dtype.names
    return names[0] if names and names[0] in X4_DTYPES else None


def language_attrs() -> dict[str, Any]:
    """``nl.float8_e4m3fn_x4``, ``nl.float8_e5m2_x4``, ``nl.float4_e2m1fn_x4``, ``nl.uint8``, ``nl.float8_e8m0fnu``."""
    return {**{d: numpy_dtype(d) for d in X4_DTYPES}, "uint8": UINT8, "float8_e8m0fnu": E8M0}


def _on_target(m: Machine, what: str) -> None:
    if not m.target.mx_formats:
        raise KernelLimitError(f"{TARGET_RULE}: {what} is 'Available only on NeuronCore-v4 and newer'; this kernel "
                               f"runs on {m.target.name} ({m.target.core})")


def _sbuf(value: Any, what: str) -> Tensor:
    t = ops.tensor_arg(value, what)
    if t.alloc.buffer != SBUF:
        raise KernelLimitError(f"{what} must be in SBUF, got {t.describe()}")
    return t


def _scale_rows(partitions: int) -> list[int]:
    """The partitions of a scale tile holding the scales of a ``partitions``-partition data tile, by group."""
    return [scale_partition(g) for g in range(partitions // GROUP_PARTITIONS)]


def _scale_tile(value: Any, data: Tensor, what: str) -> Tensor:
    """Check a scale tile of ``data`` [P, F] (rule NKI-MX-SCALE-LAYOUT): uint8 or float8_e8m0fnu, SBUF, [P, F] (or
    [P // 8, F] when P <= 32)."""
    t = _sbuf(value, what)
    p, f = data.shape[0], int(np.prod(data.shape[1:]))
    allowed = [(p, f)] + ([(p // GROUP_PARTITIONS, f)] if p <= QUADRANT else [])
    shape = (t.shape[0], int(np.prod(t.shape[1:])))
    if t.dtype not in (UINT8, E8M0) or shape not in allowed:
        raise KernelLimitError(f"{SCALE_RULE}: {what} must be a uint8 (or float8_e8m0fnu) tile of shape "
                               f"{' or '.join(str(list(a)) for a in allowed)} for data {list(data.shape)}; got "
                               f"{t.describe()} {t.dtype}")
    return t


def _group_rows(scale: Tensor, partitions: int) -> list[int]:
    return list(range(partitions // GROUP_PARTITIONS)) if scale.shape[0] < partitions else _scale_rows(partitions)


def _read_scales(scale: Tensor, partitions: int, what: str) -> np.ndarray:
    """The scale exponents [P // 8, F] of a scale tile, read from each group's partition (unwritten: rule
    NKI-MX-SCALE-LAYOUT)."""
    rows = _group_rows(scale, partitions)
    a = scale.alloc
    if not a.fully_written:
        mask = np.asarray(a.written[scale.key]).reshape(scale.shape[0], -1)
        missing = [r for r in rows if not mask[r].all()]
        if missing:
            raise KernelLimitError(f"{SCALE_RULE}: {what} {scale.describe()} holds no scale on partition(s) "
                                   f"{missing[:4]}: the scale of the group of partitions 8g..8g+7 sits on partition "
                                   "32 (g // 4) + g % 4 (nki/deep-dives/mxfp-matmul.rst, 'Scale Tensor')")
    require_written(scale[rows[0]:rows[0] + 1], what)  # stamps the liveness record
    raw = np.asarray(scale.data).reshape(scale.shape[0], -1)[rows]
    bits = raw.view(np.uint8) if raw.dtype == E8M0 else raw
    if np.any(bits == 255):
        raise KernelError(f"{what}: an E8M0 scale is NaN (0xFF)")
    return bits.astype(np.int64) - E8M0_BIAS


def _dequantized(data: Tensor, scale: Tensor, what: str) -> np.ndarray:
    """A packed tile [P, F] times its scales: float32 [P, F, 4]."""
    require_written(data, what)
    elements = unpack_elements(np.asarray(data.data).reshape(data.shape[0], -1), packed_name(data))
    exps = _read_scales(scale, data.shape[0], f"{what} scale")
    factor = np.exp2(np.repeat(exps, GROUP_PARTITIONS, axis=0).astype(np.float32))[:, :, None]
    return elements * factor


def _check_matmul(m: Machine, out: Tensor, st: Tensor, mv: Tensor) -> None:
    for t, role in ((st, "stationary"), (mv, "moving")):
        if packed_name(t) is None or t.ndim != 2:
            raise KernelLimitError(f"{MATMUL_RULE}: nisa.nc_matmul_mx {role} must be a 2-D tile of float8_e5m2_x4, "
                                   f"float8_e4m3fn_x4 or float4_e2m1fn_x4; got {t.describe()} {t.dtype}")
    k, m_free = st.shape
    k2, n_free = mv.shape
    if k != k2 or k % QUADRANT or k > m.target.pmax:
        raise KernelLimitError(f"{MATMUL_RULE}: nisa.nc_matmul_mx stationary and moving partitions must be identical, "
                               f"a multiple of 32 and at most {m.target.pmax}; got {k} and {k2}")
    if m_free % 2 or m_free > m.target.gemm_stationary_fmax:
        raise KernelLimitError(f"{MATMUL_RULE}: nisa.nc_matmul_mx stationary free size must be even and at most "
                               f"{m.target.gemm_stationary_fmax}; got {m_free} ({st.describe()})")
    if out.dtype not in MOVING_FMAX or n_free > MOVING_FMAX[out.dtype]:
        raise KernelLimitError(f"{MATMUL_RULE}: nisa.nc_matmul_mx dst must be float32 or bfloat16 PSUM with the moving "
                               f"free size at most 4096 / 8192; got {out.describe()} {out.dtype}, moving {n_free}")


def _accumulate(out: Tensor, result: np.ndarray, accumulate: Any, what: str) -> bool:
    """Write or add ``result`` into the PSUM tile ``out`` as nc_matmul does (accumulate None: add into a tile written
    whole, overwrite one written nowhere); whether it added."""
    if accumulate is None:
        mask = np.asarray(out.alloc.written[out.key])
        if mask.all():
            accumulate = True
        elif not mask.any():
            accumulate = False
        else:
            raise KernelError(f"{what} into {out.describe()}, which is only partly written: one instruction either "
                              "accumulates into the whole tile or overwrites it")
    if accumulate is True:
        require_written(out, f"{what} dst (accumulate=True)")
        write(out, np.asarray(out.data, dtype=np.float32) + result)
        return True
    if accumulate is False:
        write(out, result)
        return False
    raise UnsupportedAPIError(f"{what} accumulate={accumulate!r}: use None, True or False")


def isa_attrs(m: Machine) -> dict[str, Any]:
    """``nisa.nc_matmul_mx`` and ``nisa.quantize_mx`` bound to ``m``."""

    @api("nisa.nc_matmul_mx", m)
    def nc_matmul_mx(dst: Any, stationary: Any, moving: Any, stationary_scale: Any, moving_scale: Any,
                     tile_position: Any = None, tile_size: Any = None, accumulate: Any = None) -> None:
        what = "nisa.nc_matmul_mx"
        _on_target(m, what)
        out = ops.psum_dst(dst, what)
        st, mv = _sbuf(stationary, f"{what} stationary"), _sbuf(moving, f"{what} moving")
        if tile_position not in (None, ()) or tile_size not in (None, ()):
            raise UnsupportedAPIError(f"{what}: tile_position / tile_size (row tiling) are not in the subset nmmc "
                                      "emits")
        _check_matmul(m, out, st, mv)
        a = _dequantized(st, _scale_tile(stationary_scale, st, f"{what} stationary_scale"), f"{what} stationary")
        b = _dequantized(mv, _scale_tile(moving_scale, mv, f"{what} moving_scale"), f"{what} moving")
        k, m_free = st.shape
        result = a.transpose(1, 0, 2).reshape(m_free, k * MX_PACK) @ b.transpose(0, 2, 1).reshape(k * MX_PACK, -1)
        if out.shape != result.shape:
            raise KernelError(f"{what}: dst shape {list(out.shape)} != [M, N] = {list(result.shape)}")
        added = _accumulate(out, result.astype(np.float32), accumulate, what)
        m.counters.matmul_instructions += 1
        m.counters.matmul_moving_columns += mv.shape[1]
        if m.units is not None:
            from .scale_units_mx import matmul_mx

            matmul_mx(m.units, out, st, mv, stationary_scale, moving_scale, accumulates=added, what=what)

    @api("nisa.quantize_mx", m)
    def quantize_mx(dst: Any, src: Any, dst_scale: Any) -> None:
        what = "nisa.quantize_mx"
        _on_target(m, what)
        s, out = _sbuf(src, f"{what} src"), _sbuf(dst, f"{what} dst")
        p = s.shape[0]
        free = int(np.prod(s.shape[1:]))
        dtype = packed_name(out)
        if s.dtype.name not in ("bfloat16", "float16") or p % QUADRANT or p > m.target.pmax or free % MX_PACK:
            raise KernelLimitError(f"{QUANTIZE_RULE}: {what} src must be bf16/fp16 with partitions a multiple of 32 up "
                                   f"to {m.target.pmax} and a free size a multiple of 4; got {s.describe()} {s.dtype}")
        if dtype is None or not X4_DTYPES[dtype].on_chip:
            raise KernelLimitError(f"{QUANTIZE_RULE}: {what} dst must be float8_e5m2_x4 or float8_e4m3fn_x4 (no FP4 "
                                   f"output); got {out.describe()} {out.dtype}")
        if out.shape[0] != p or int(np.prod(out.shape[1:])) * MX_PACK != free:
            raise KernelLimitError(f"{QUANTIZE_RULE}: {what} dst has src's partitions and a quarter of its free size; "
                                   f"got {list(out.shape)} for src {list(s.shape)}")
        scale = _scale_tile(dst_scale, out, f"{what} dst_scale")
        require_written(s, f"{what} src")
        element = X4_DTYPES[dtype].name
        values = ops.as_f32(s).astype(np.float64).reshape(p, free // MX_PACK, MX_PACK)
        groups = np.abs(values).reshape(p // GROUP_PARTITIONS, GROUP_PARTITIONS, -1, MX_PACK).max(axis=(1, 3))
        exps = np.frexp(np.where(groups > 0, groups, 1.0))[1].astype(np.int64) - 1 - (X4_DTYPES[dtype].emax - 1)
        exps = np.clip(np.where(groups > 0, exps, E8M0_MIN), E8M0_MIN, E8M0_MAX)
        q = round_element(values / np.exp2(np.repeat(exps, GROUP_PARTITIONS, axis=0).astype(np.float64))[:, :, None],
                          element)
        write(out, pack_elements(q, element).reshape(out.shape))
        biased = (exps + E8M0_BIAS).astype(np.uint8)
        for g, row in enumerate(_group_rows(scale, p)):
            tile = scale[row:row + 1]
            write(tile, (biased[g] if scale.dtype == UINT8 else biased[g].view(E8M0)).reshape(tile.shape))
        mark_written(out)
        m.counters.vector_ops += 1
        if m.units is not None:
            from .scale_units_mx import quantize_mx as quantize_units

            quantize_units(m.units, out, scale, s, what)

    return {"nc_matmul_mx": nc_matmul_mx, "quantize_mx": quantize_mx}


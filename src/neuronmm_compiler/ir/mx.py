"""OCP microscaling (MX) formats of the graph IR, their exact arithmetic and how MX tensors are stored (docs/mx.md).

NeuronCore-v4 (trn3) multiplies MX matrices on its Tensor Engine and quantizes to them on its Vector Engine:

- ``nki.isa.nc_matmul_mx``: "matrix multiplication of MXFP8/MXFP4 quantized matrices with integrated dequantization";
  "The micro-scaling group size is 32 elements in groups of 8 partitions x 4 elements per partition"; inputs
  "float8_e5m2_x4, float8_e4m3fn_x4, or float4_e2m1fn_x4 (4-packed quantized data types)", scales "float8_e8m0fnu
  or uint8" (NKI ISA reference, nki.isa.nc_matmul_mx, "Data types", "Layout"; aws-neuron/aws-neuron-sdk@81ce03ae,
  nki/api/nki/isa/__init__.py).
- ``nki.isa.quantize_mx``: bf16/fp16 to ``float8_e5m2_x4`` / ``float8_e4m3fn_x4`` (no FP4 output), one scale per group
  of 32 (8 partitions x 4 elements), the scale ``X = 2^(floor(log2(max|V|)) - (E_max - 1))`` with ``E_max`` 8 for
  float8_e4m3fn and 15 for float8_e5m2: "a block scale that is two times larger" than the OCP specification's sample
  algorithm, "reserving additional range for rounding the largest values in each group without saturation"; an
  all-zero group gets ``2^-127`` (same page, "Scale calculation").
- Layout: one instruction contracts K = 512 = 128 partitions x 4 packed elements, "4 elements originating 128 apart on
  the contraction axis" packed together ("interleaving": "MXFP Matrix Multiplication with NKI on AWS Neuron",
  nki/deep-dives/mxfp-matmul.rst, "Data Tensor"; Trainium3 architecture guide, "Quad-MXFP8/MXFP4 Matmul
  Performance").

So nmmc's MX values live in the IR as the hardware holds them, *packed*: a ``[K, N]`` weight is a ``[K/4, N]`` input of
an ``_x4`` dtype (:data:`X4_DTYPES`), an activation ``[T, K]`` quantized for a matmul a ``[T, K/4]`` value; packed row
``r = 128 kt + p`` holds the contraction positions ``512 kt + 128 j + p``, ``j = 0..3`` (:func:`to_packed`). A block
(one E8M0 scale) is 8 consecutive packed rows x their 4 packed elements: 32 contraction positions
``512 kt + 128 j + 8 g + i`` (``g = 0..15``, ``i = 0..7``). The IR's value of an MX tensor is the real matrix it stands
for (elements times their block's scale, in contraction order); its dtype says how it is stored. K must be a multiple
of 512 (:data:`MX_TILE`: one instruction's contraction; nki-library's MX MLP asks the same, "H must be divisible by
512", aws-neuron/nki-library@d2ad3a57, src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_mx.py).

Weights are quantized offline with the OCP sample algorithm (``X = 2^(floor(log2(max|V|)) - E_max)``, elements clamped
to the format's largest value, rounded to nearest even), as nki-library's reference quantizer does
(aws-neuron/nki-library@d2ad3a57, src/nkilib_src/nkilib/core/utils/mx_torch_common.py, ``quantize_to_mx``:
``block_max_exp - max_exp``, then ``np.clip(..., -max_val, max_val)``); activations on chip with quantize_mx's doubled
scale (:func:`quantize_activation`). Storage (kernel arguments, :func:`pack`): the elements as ``[K/4, N]`` of the
``_x4`` dtype (float8: four bytes of a 32-bit word, element ``j`` in byte ``j``; float4: four nibbles of a 16-bit
word, element ``j`` in bits ``4j..4j+3``, as nki-library's ``unpack_float8_e4m3fn_x4`` / ``unpack_float4_x4`` read
them), and the scales as a ``uint8`` array ``<name>_scale`` ``[16, K/512, N]`` of E8M0 exponents (``e + 127``), row
``g`` of tile ``kt`` the scale of group ``g``: the rows of one SBUF quadrant (``g = 4q .. 4q + 3``) are contiguous, so
each quadrant's scales load in one DMA (:func:`scale_partition`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..errors import InputError, ScheduleError

if TYPE_CHECKING:
    import numpy as np

    from ..targets import Target

__all__ = ["MX_BLOCK", "MX_FORMATS", "MX_RULE", "MX_SCALE_DTYPE", "MX_TILE", "X4_DTYPES", "MxElement", "MxFormat",
           "activation_dtype", "check_mx_on_target", "is_mx", "mx_format", "pack", "quantize_activation",
           "quantize_weight", "scale_partition", "to_logical", "to_packed", "unpack"]

#: Contraction positions one E8M0 scale covers ("groups of 32 elements"; nki.isa.nc_matmul_mx, "Layout").
MX_BLOCK = 32
#: Packed elements per x4 element and contraction positions of one ``nc_matmul_mx`` (128 partitions x 4).
MX_PACK = 4
MX_TILE = 512
#: Partitions of one scaling group, and of one SBUF quadrant ("the partition-dimension of SBUF ... split into 4
#: quadrants of 32 partitions each"; a quadrant's scales sit in its first 4 partitions: nki/deep-dives/mxfp-matmul.rst,
#: "Scale Tensor", "Packing Scale Values").
GROUP_PARTITIONS = 8
QUADRANT = 32
SCALES_PER_QUADRANT = QUADRANT // GROUP_PARTITIONS
#: The dtype of scale tiles and arguments: uint8 holding the E8M0 exponent (+127). "float8_e8m0fnu or uint8 (prefer
#: float8_e8m0fnu: OCP MX standard; uint8 accepted for backward compatibility)" (nki.isa.nc_matmul_mx, "Data types");
#: the Neuron 2.29 page of nki.isa.quantize_mx reads "The dst_scale tile must be uint8", so uint8 is the spelling every
#: release nmmc's nki dialect covers takes (rule NKI-MX-SCALE-DTYPE).
MX_SCALE_DTYPE = "uint8"
#: The rule an MX kernel on a target without nc_matmul_mx breaks (verification/rules.py).
MX_RULE = "NKI-MX-TARGET"
#: E8M0's exponent range (bias 127; 255 is NaN): "2^-127, the minimum value representable by float8_e8m0fnu".
E8M0_MIN, E8M0_MAX, E8M0_BIAS = -127, 127, 127


@dataclass(frozen=True)
class MxElement:
    """An MX element type: its NKI / ml_dtypes name, its packed ``_x4`` dtype and bytes per packed element, mantissa
    bits, smallest normal exponent (``frexp`` convention: ``f * 2**e``, ``f`` in [0.5, 1)), largest finite value,
    ``E_max`` (the largest normal's unbiased exponent: "8 for float8_e4m3fn and 15 for float8_e5m2",
    nki.isa.quantize_mx; 2 for float4_e2m1fn, nki-library's ``_MX_DTYPE_PARAMS``), and whether quantize_mx writes it."""

    name: str
    packed: str
    packed_bytes: int
    mantissa_bits: int
    min_exponent: int
    max: float
    emax: int
    on_chip: bool


#: The element types of nc_matmul_mx (float4_e2m1fn: OCP E2M1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6).
MX_ELEMENTS: Mapping[str, MxElement] = MappingProxyType({
    "float8_e4m3fn": MxElement("float8_e4m3fn", "float8_e4m3fn_x4", 4, 3, -5, 448.0, 8, True),
    "float8_e5m2": MxElement("float8_e5m2", "float8_e5m2_x4", 4, 2, -13, 57344.0, 15, True),
    "float4_e2m1fn": MxElement("float4_e2m1fn", "float4_e2m1fn_x4", 2, 1, 1, 6.0, 2, False),
})
#: The packed dtypes (an IR dtype: an MX value as stored) -> their element type.
X4_DTYPES: Mapping[str, MxElement] = MappingProxyType({e.packed: e for e in MX_ELEMENTS.values()})


@dataclass(frozen=True)
class MxFormat:
    """A ``--dtype`` MX format: the weights' element type and the element type quantize_mx gives the activations
    (MXFP8 only: "Quantize-MX does not support an FP4 output but Matmul-MX does support FP4 input", and "Multiplying an
    MXFP8 matrix with an MXFP4 matrix is also allowed"; an MXFP4 MLP's activations are MXFP8 E4M3, as nki-library's,
    projection_mx_constants.py ``SUPPORTED_QMX_OUTPUT_DTYPES = [nl.float8_e4m3fn_x4]``)."""

    name: str
    weights: str
    activations: str

    @property
    def weight_dtype(self) -> str:
        return MX_ELEMENTS[self.weights].packed

    @property
    def activation_dtype(self) -> str:
        return MX_ELEMENTS[self.activations].packed

    @property
    def weight_bits(self) -> float:
        """Bits per weight, its scale's share included (8 or 4, plus 8 per 32)."""
        return 8 * MX_ELEMENTS[self.weights].packed_bytes / MX_PACK + 8 / MX_BLOCK


#: The formats, by canonical name (the OCP MX v1.0 names: MXFP8 E4M3, MXFP8 E5M2, MXFP4 E2M1).
MX_FORMATS: Mapping[str, MxFormat] = MappingProxyType({
    "mxfp8_e4m3": MxFormat("mxfp8_e4m3", "float8_e4m3fn", "float8_e4m3fn"),
    "mxfp8_e5m2": MxFormat("mxfp8_e5m2", "float8_e5m2", "float8_e5m2"),
    "mxfp4": MxFormat("mxfp4", "float4_e2m1fn", "float8_e4m3fn"),
})
#: Accepted ``--dtype`` spellings (lower case): the OCP names and those of the NKI pages and nki-library (``mxfp8``,
#: E4M3 as quantize_mx's and nki-library's default output; ``mxfp8_e4m3fn``; ``mxfp4_e2m1``).
MX_ALIASES: Mapping[str, str] = MappingProxyType({
    "mxfp8": "mxfp8_e4m3", "mxfp8_e4m3": "mxfp8_e4m3", "mxfp8_e4m3fn": "mxfp8_e4m3", "mxfp8_e5m2": "mxfp8_e5m2",
    "mxfp4": "mxfp4", "mxfp4_e2m1": "mxfp4", "mxfp4_e2m1fn": "mxfp4",
})


def mx_format(spelled: str) -> MxFormat | None:
    """The :class:`MxFormat` a ``--dtype`` spelling names (any case), else None."""
    name = MX_ALIASES.get(spelled.strip().lower()) if isinstance(spelled, str) else None
    return None if name is None else MX_FORMATS[name]


def activation_dtype(weight_dtype: str) -> str:
    """The packed dtype quantize_mx gives the activations a matmul with MX weights of ``weight_dtype`` reads."""
    return next(f.activation_dtype for f in MX_FORMATS.values() if f.weight_dtype == weight_dtype)


def is_mx(dtype: str) -> bool:
    """True for a packed MX dtype (an MX value of the IR)."""
    return dtype in X4_DTYPES


def check_mx_on_target(fmt: MxFormat, target: Target, dialect: str = "nki") -> None:
    """Refuse MX on a target whose Tensor Engine has no ``nc_matmul_mx`` (ScheduleError naming rule NKI-MX-TARGET), or
    in the NKI 0.1 dialect (``neuronxcc``), which nmmc does not emit MX kernels in."""
    if fmt.name not in target.mx_formats:
        raise ScheduleError(f"{MX_RULE}: --dtype {fmt.name} needs nisa.nc_matmul_mx and nisa.quantize_mx, 'Available "
                            f"only on NeuronCore-v4 and newer' (NKI ISA reference); {target.name} is {target.core}: "
                            "use --target trn3, or fp8 here (docs/mx.md)")
    if dialect != "nki":
        raise ScheduleError(f"--dtype {fmt.name}: MX kernels are emitted in the nki dialect (NKI 0.3+) only; use "
                            "--dialect nki (docs/mx.md)")


def check_contraction(k: int, what: str) -> None:
    """InputError unless ``k`` is a whole number of 512-position MX tiles."""
    if k % MX_TILE:
        raise InputError(f"{what}: MX contracts {MX_TILE} positions per nc_matmul_mx (128 partitions x 4 packed "
                         f"elements); {k} is not a multiple of {MX_TILE} (docs/mx.md)")


# ----------------------------------------------------------------------------- layout
def to_packed(x: np.ndarray, axis: int) -> np.ndarray:
    """A 2-D ``x`` with its ``axis`` (0 or 1: K, a multiple of 512) in packed order: that axis becomes ``K/4`` rows and
    a new last axis holds each row's 4 elements (row ``128 kt + p``, element ``j``: position ``512 kt + 128 j + p``)."""
    import numpy as np

    x = np.moveaxis(np.asarray(x), axis, -1)
    k = x.shape[-1]
    tiles = x.reshape(*x.shape[:-1], k // MX_TILE, MX_PACK, MX_TILE // MX_PACK)  # [.., kt, j, p]
    packed = np.swapaxes(tiles, -1, -2).reshape(*x.shape[:-1], k // MX_PACK, MX_PACK)  # [.., 128 kt + p, j]
    return np.moveaxis(packed, -2, axis)


def to_logical(packed: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of :func:`to_packed`: ``packed`` [.., K/4 on ``axis``, .., 4] back in contraction order."""
    import numpy as np

    p = np.moveaxis(np.asarray(packed), axis, -2)  # [.., K/4, 4]
    rows = p.shape[-2]
    tiles = p.reshape(*p.shape[:-2], rows // (MX_TILE // MX_PACK), MX_TILE // MX_PACK, MX_PACK)  # [.., kt, p, j]
    logical = np.swapaxes(tiles, -1, -2).reshape(*p.shape[:-2], rows * MX_PACK)
    return np.moveaxis(logical, -1, axis)


def scale_partition(group: int) -> int:
    """The SBUF partition holding the scale of group ``group`` (0..15) of a 128-partition tile: the first 4 partitions
    of its quadrant ("Scales must be placed in the quadrant from which the corresponding scaling group originated",
    nki/deep-dives/mxfp-matmul.rst, "Scale Tensor"; ``load_scales_scattered``: HBM rows ``4q .. 4q + 4`` to partitions
    ``32q .. 32q + 4``)."""
    return QUADRANT * (group // SCALES_PER_QUADRANT) + group % SCALES_PER_QUADRANT


# ----------------------------------------------------------------------------- arithmetic
def round_element(x: np.ndarray, element: str) -> np.ndarray:
    """``x`` (float64) clamped to the element type's finite range and rounded to nearest even into it (float64)."""
    import numpy as np

    fmt = MX_ELEMENTS[element]
    clipped = np.clip(np.asarray(x, dtype=np.float64), -fmt.max, fmt.max)
    quantum = np.exp2(np.maximum(np.frexp(clipped)[1], fmt.min_exponent) - fmt.mantissa_bits - 1)
    return np.round(clipped / quantum) * quantum


def _block_amax(packed: np.ndarray, axis: int) -> np.ndarray:
    """``max|v|`` of every block of ``packed`` (packed rows on ``axis``, 0 or 1, the 4 elements last): blocks of 8
    consecutive rows, on ``axis`` of the result."""
    a = abs(packed).max(axis=-1)
    return a.reshape((*a.shape[:axis], a.shape[axis] // GROUP_PARTITIONS, GROUP_PARTITIONS, *a.shape[axis + 1:])).max(
        axis=axis + 1)


def _floor_log2(amax: np.ndarray) -> np.ndarray:
    """``floor(log2(a))`` of positive values, exactly (``frexp``: a = f * 2^e, f in [0.5, 1))."""
    import numpy as np

    return np.frexp(amax)[1].astype(np.int64) - 1


def _quantize(packed: np.ndarray, axis: int, element: str, doubled: bool) -> tuple[np.ndarray, np.ndarray]:
    """(elements float64 like ``packed``, E8M0 exponents [.., R/8 on ``axis``] int64) of the packed values."""
    import numpy as np

    fmt = MX_ELEMENTS[element]
    amax = _block_amax(packed, axis)
    exps = _floor_log2(np.where(amax > 0, amax, 1.0)) - (fmt.emax - 1 if doubled else fmt.emax)
    exps = np.clip(np.where(amax > 0, exps, E8M0_MIN), E8M0_MIN, E8M0_MAX)
    scale = np.exp2(_expand(exps.astype(np.float64), axis))
    return round_element(np.asarray(packed, dtype=np.float64) / scale, element), exps


def _expand(per_block: np.ndarray, axis: int) -> np.ndarray:
    """Per-block values (blocks on ``axis``, 0 or 1) repeated over each block's 8 rows, with an axis of 1 last (to
    broadcast over the 4 packed elements)."""
    import numpy as np

    return np.repeat(per_block, GROUP_PARTITIONS, axis=axis)[..., None]


def quantize_activation(x: np.ndarray, element: str) -> np.ndarray:
    """The ``quantize_mx`` op on a [T, K] value (float64 holding bf16 values): ``x`` rounded to nki.isa.quantize_mx's
    MX grid along K, its doubled block scale (module docstring), in contraction order (float64 [T, K]). The quotient
    by a power of two is exact; the elements round to nearest even (the page says "casts to the target MXFP8
    element data type"; round to nearest even assumed, as every other NKI cast to a narrower float)."""
    elements, exps = _quantize(to_packed(x, 1), 1, element, doubled=True)
    return to_logical(elements * _scale_values(exps, 1), 1)


def quantize_weight(w: np.ndarray, element: str) -> tuple[np.ndarray, np.ndarray]:
    """``(elements, exponents)`` of a weight ``w`` [K, N] (``x @ w``) quantized offline along K with the OCP sample
    algorithm (module docstring): elements float64 [K/4, N, 4] in packed order, exponents int64 [K/32, N] in block
    order (block ``b`` = packed rows ``8b .. 8b + 7``)."""
    return _quantize(to_packed(w, 0), 0, element, doubled=False)


def _scale_values(exps: np.ndarray, axis: int) -> np.ndarray:
    import numpy as np

    return np.exp2(_expand(np.asarray(exps, dtype=np.float64), axis))


def dequantize(elements: np.ndarray, exps: np.ndarray, axis: int) -> np.ndarray:
    """The real matrix of packed ``elements`` [.., R, .., 4] with block exponents [.., R/8, ..] on ``axis``, in
    contraction order."""
    return to_logical(elements * _scale_values(exps, axis), axis)


# ----------------------------------------------------------------------------- storage (kernel arguments)
@functools.cache
def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of a packed MX dtype: one unsigned field of its width named after it (float8: 32 bits,
    float4: 16), so each ``_x4`` type is its own dtype, as nki's are."""
    import numpy as np

    return np.dtype([(dtype, "<u4" if X4_DTYPES[dtype].packed_bytes == 4 else "<u2")])


def element_dtype(element: str) -> np.dtype:
    import ml_dtypes
    import numpy as np

    return np.dtype(getattr(ml_dtypes, element))


def _bits(values: np.ndarray, element: str) -> np.ndarray:
    """The bit patterns (uint8; float4 in the low nibble) of element values (exact in the element type)."""
    import numpy as np

    bits = np.asarray(values, dtype=np.float32).astype(element_dtype(element)).view(np.uint8)
    return bits & 0xF if MX_ELEMENTS[element].packed_bytes == 2 else bits


def pack_elements(elements: np.ndarray, element: str) -> np.ndarray:
    """Element values [..., 4] (float64, exact in ``element``) as an array of its ``_x4`` dtype [...]."""
    import numpy as np

    fmt = MX_ELEMENTS[element]
    bits = _bits(elements, element).astype(np.uint32)
    width = 8 * fmt.packed_bytes // MX_PACK
    word = bits[..., 0] | bits[..., 1] << width | bits[..., 2] << 2 * width | bits[..., 3] << 3 * width
    out = np.empty(word.shape, numpy_dtype(fmt.packed))
    out.view(np.uint32 if fmt.packed_bytes == 4 else np.uint16)[...] = word
    return out


def unpack_elements(packed: np.ndarray, dtype: str) -> np.ndarray:
    """An array of a packed dtype [...] as its element values [..., 4], float32."""
    import numpy as np

    fmt = X4_DTYPES[dtype]
    width = 8 * fmt.packed_bytes // MX_PACK
    word = np.ascontiguousarray(packed).view(np.uint32 if fmt.packed_bytes == 4 else np.uint16).astype(np.uint32)
    bits = np.stack([(word >> (width * j)) & ((1 << width) - 1) for j in range(MX_PACK)], axis=-1).astype(np.uint8)
    return bits.view(element_dtype(fmt.name)).astype(np.float32)


def scales_to_storage(exps: np.ndarray) -> np.ndarray:
    """Weight block exponents [K/32, N] (block order) as the stored ``<name>_scale`` [16, K/512, N] uint8."""
    import numpy as np

    blocks, n = exps.shape
    biased = (np.asarray(exps) + E8M0_BIAS).astype(np.uint8)
    return np.ascontiguousarray(biased.reshape(blocks // 16, 16, n).transpose(1, 0, 2))


def scales_from_storage(stored: np.ndarray) -> np.ndarray:
    """The inverse of :func:`scales_to_storage`: int64 exponents [K/32, N]."""
    import numpy as np

    groups, tiles, n = stored.shape
    return np.asarray(stored, dtype=np.int64).transpose(1, 0, 2).reshape(groups * tiles, n) - E8M0_BIAS


def pack(w: np.ndarray, element: str) -> tuple[np.ndarray, np.ndarray]:
    """A weight ``w`` [K, N] quantized offline (:func:`quantize_weight`) as its two kernel arguments: the elements
    [K/4, N] of the ``_x4`` dtype and the scales [16, K/512, N] uint8 (module docstring)."""
    elements, exps = quantize_weight(w, element)
    return pack_elements(elements, element), scales_to_storage(exps)


def unpack(data: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The real matrix [K, N] (float64) of a stored MX weight: its ``_x4`` elements [K/4, N] and scales."""
    import numpy as np

    dtype = data.dtype.names[0]
    elements = unpack_elements(data, dtype).astype(np.float64)
    return dequantize(elements, scales_from_storage(scales), 0)

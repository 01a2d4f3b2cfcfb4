"""MX kernel arguments from float weights: each weight quantized, when the package patches a model, into the packed
OCP MX elements and E8M0 scales nmmc's MX kernels (trn3, ``nki.isa.nc_matmul_mx``) take.

The rules are nmmc's (``ir/mx.py``: ``to_packed``, ``quantize_weight``, ``round_element``, ``pack_elements``,
``scales_to_storage``), restated in torch so that a package needs no nmmc on a Neuron host, and held equal to them bit
for bit by nmmc's tests:

- a weight ``W`` [K, N] (``x @ W``; a checkpoint's ``weight`` [N, K] transposed, or an ``nmmc compress`` factor as
  stored) is put in packed order along K: packed row ``128 kt + p`` holds the positions ``512 kt + 128 j + p``,
  ``j = 0..3`` (K a multiple of 512, one ``nc_matmul_mx`` contraction);
- a block is 8 consecutive packed rows x their 4 elements (32 positions) and gets one E8M0 scale by the OCP sample
  algorithm, ``e = floor(log2(max|v|)) - E_max`` (E_max 8 for float8_e4m3fn, 15 for float8_e5m2, 2 for
  float4_e2m1fn), ``e = -127`` for an all-zero block, ``e`` clipped to [-127, 127];
- each element is ``v / 2^e`` clamped to the element type's largest finite value and rounded to nearest even;
- storage (the kernel's arguments): the elements as one word per 4 (float8: element ``j`` in byte ``j`` of a 32-bit
  word; float4: in bits ``4j..4j+3`` of a 16-bit word) of the kernel argument's shape ``[K/4, N]``, and the scales as
  uint8 ``e + 127`` of shape ``[16, K/512, N]``, row ``g`` of tile ``kt`` the scale of group ``g``.

Host dtypes (torch 2.13 has ``float8_e8m0fnu`` and ``float4_e2m1fn_x2``, no 4-packed type): the packed words are
``torch.int32`` (float8_e4m3fn_x4, float8_e5m2_x4) and ``torch.int16`` (float4_e2m1fn_x4) tensors of the kernel
argument's shape, the scales ``torch.uint8`` (the kernel declares its scale arguments uint8, which nc_matmul_mx
accepts besides float8_e8m0fnu). How torch-neuronx hands such a tensor to a kernel argument of a ``_x4`` dtype is not
documented (the NKI pages list the ``_x4`` types as NKI's own); nmmc has not run it.

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

import sys

import torch

#: Per element type: (mantissa bits, smallest normal exponent in frexp's convention, largest finite value, E_max,
#: bits per element). nmmc's ir/mx.py MX_ELEMENTS (float8_e4m3fn: OCP E4M3, largest 448; float8_e5m2; float4_e2m1fn:
#: OCP E2M1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6).
ELEMENTS = {"float8_e4m3fn": (3, -5, 448.0, 8, 8), "float8_e5m2": (2, -13, 57344.0, 15, 8),
            "float4_e2m1fn": (1, 1, 6.0, 2, 4)}
#: The packed (kernel argument) dtype of each element type, and the torch dtype holding its words.
PACKED = {"float8_e4m3fn": "float8_e4m3fn_x4", "float8_e5m2": "float8_e5m2_x4", "float4_e2m1fn": "float4_e2m1fn_x4"}
HOST_DTYPES = {"float8_e4m3fn_x4": torch.int32, "float8_e5m2_x4": torch.int32, "float4_e2m1fn_x4": torch.int16}
#: The weights' element type of each MX format (nmmc's ir/mx.py MX_FORMATS).
FORMATS = {"mxfp8_e4m3": "float8_e4m3fn", "mxfp8_e5m2": "float8_e5m2", "mxfp4": "float4_e2m1fn"}
TILE, PACK, GROUP, GROUPS_PER_TILE, BIAS = 512, 4, 8, 16, 127
_FP4_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def element_of(packed: str) -> str:
    """The element type of a packed dtype (``float4_e2m1fn_x4`` -> ``float4_e2m1fn``)."""
    return next(e for e, p in PACKED.items() if p == packed)


def to_packed(w: torch.Tensor) -> torch.Tensor:
    """``w`` [K, N] in packed order: [K/4, N, 4], element ``[128 kt + p, n, j]`` = ``w[512 kt + 128 j + p, n]``."""
    k, n = w.shape
    if k % TILE:
        raise ValueError(f"an MX weight's contraction must be a multiple of {TILE} (one nc_matmul_mx); got {k}")
    return w.reshape(k // TILE, PACK, TILE // PACK, n).permute(0, 2, 3, 1).reshape(k // PACK, n, PACK)


def round_element(v: torch.Tensor, element: str) -> torch.Tensor:
    """``v`` (float64) clamped to the element type's finite range and rounded to nearest even into it (float64)."""
    mantissa, emin, largest, _, _ = ELEMENTS[element]
    v = v.clamp(-largest, largest)
    _, exponent = torch.frexp(v)
    quantum = torch.exp2((torch.clamp(exponent, min=emin) - mantissa - 1).to(torch.float64))
    return torch.round(v / quantum) * quantum  # torch.round rounds half to even


def quantize(w: torch.Tensor, element: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(elements float64 [K/4, N, 4] in packed order, E8M0 exponents int64 [K/32, N] in block order) of ``w`` [K, N]
    (module docstring)."""
    packed = to_packed(w.to(torch.float64))
    rows, n, _ = packed.shape
    amax = packed.abs().amax(dim=-1).reshape(rows // GROUP, GROUP, n).amax(dim=1)
    _, exponent = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    exps = torch.where(amax > 0, exponent.to(torch.int64) - 1 - ELEMENTS[element][3], torch.full_like(
        exponent, -BIAS, dtype=torch.int64)).clamp(-BIAS, BIAS)
    scale = torch.exp2(exps.to(torch.float64)).repeat_interleave(GROUP, dim=0)[:, :, None]
    return round_element(packed / scale, element), exps


def element_bits(values: torch.Tensor, element: str) -> torch.Tensor:
    """The bit patterns (uint8; float4 in the low nibble) of element values exact in ``element``."""
    if element == "float4_e2m1fn":
        magnitudes = torch.tensor(_FP4_MAGNITUDES, dtype=torch.float64)
        code = torch.searchsorted(magnitudes, values.abs().contiguous())
        return (code + 8 * torch.signbit(values).to(code.dtype)).to(torch.uint8)
    dtype = torch.float8_e4m3fn if element == "float8_e4m3fn" else torch.float8_e5m2
    return values.to(dtype).view(torch.uint8)


def pack_words(elements: torch.Tensor, element: str) -> torch.Tensor:
    """Elements [.., 4] as the words of the packed dtype [..] (int32 / int16, little-endian as nmmc's '<u4'/'<u2')."""
    if sys.byteorder != "little":  # pragma: no cover - every Neuron host is little-endian
        raise RuntimeError("packing MX words assumes a little-endian host")
    bits = element_bits(elements, element)
    if ELEMENTS[element][4] == 4:
        bits = bits[..., 0::2] | (bits[..., 1::2] << 4)  # two nibbles per byte, element 2i in the low one
    return bits.contiguous().view(HOST_DTYPES[PACKED[element]])[..., 0]


def scales_to_storage(exps: torch.Tensor) -> torch.Tensor:
    """Block exponents [K/32, N] as the stored scale argument [16, K/512, N] uint8 (``e + 127``)."""
    blocks, n = exps.shape
    biased = (exps + BIAS).to(torch.uint8)
    return biased.reshape(blocks // GROUPS_PER_TILE, GROUPS_PER_TILE, n).transpose(0, 1).contiguous()


def quantize_weight(w: torch.Tensor, element: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed words [K/4, N] in the host dtype, scales [16, K/512, N] uint8) of a weight ``w`` [K, N]: the two kernel
    arguments of an MX weight."""
    elements, exps = quantize(w, element)
    return pack_words(elements, element), scales_to_storage(exps)


def dequantize(words: torch.Tensor, scales: torch.Tensor, packed: str) -> torch.Tensor:
    """The real matrix [K, N] (float64) of stored MX arguments (what the kernel's nc_matmul_mx multiplies)."""
    element = element_of(packed)
    width = ELEMENTS[element][4]
    raw = words.contiguous().view(torch.uint8).reshape(*words.shape, -1).to(torch.int64)
    if width == 4:
        raw = torch.stack([raw & 0xF, raw >> 4], dim=-1).flatten(-2)
        table = torch.tensor(_FP4_MAGNITUDES + tuple(-m for m in _FP4_MAGNITUDES), dtype=torch.float64)
        values = table[raw]
    else:
        dtype = torch.float8_e4m3fn if element == "float8_e4m3fn" else torch.float8_e5m2
        values = raw.to(torch.uint8).view(dtype).to(torch.float64)
    groups, tiles, n = scales.shape
    exps = scales.to(torch.int64).transpose(0, 1).reshape(groups * tiles, n) - BIAS
    real = values * torch.exp2(exps.to(torch.float64)).repeat_interleave(GROUP, dim=0)[:, :, None]
    rows = real.shape[0]
    return real.reshape(rows // (TILE // PACK), TILE // PACK, n, PACK).permute(0, 3, 1, 2).reshape(rows * PACK, n)

"""The MX instructions of the loop-nest program: ``nc_matmul_mx`` and ``quantize_mx`` (NeuronCore-v4; docs/mx.md).

:class:`MatmulMx` is a :class:`~.program.Matmul` (so every pass over the program that moves, splits or counts matmuls
treats it as one: LNC distribution, PSUM bank lists, folded loops, the prologue's anchor) whose operands are packed
MX tiles (``_x4`` dtypes: 128 partitions x 4 packed elements contract 512 positions) and which reads the scale tile of
each. :class:`QuantizeMx` is the Vector Engine's quantization of a bf16 tile whose free axis holds each partition's
4 interleaved elements innermost (``src`` [P, F, 4] as ``nisa.quantize_mx`` reads [P, 4F]) into an ``_x4`` tile
[P, F] and its scales [P, F] uint8.

The tile rules each instruction checks (NKI ISA reference, aws-neuron/aws-neuron-sdk@81ce03ae,
nki/api/nki/isa/__init__.py):

- nc_matmul_mx, "Tile size": "The partition dimension size of stationary and moving must be identical and be a multiple
  of 32, not exceeding 128"; "The free dimension size of stationary must be even and not exceed 128"; moving's free
  size at most 4096 (fp32 dst) or 8192 (bf16 dst); "Tensor Engine supports only row tiling mode" (rules
  NKI-MX-MATMUL-TILE, which covers the row tiling);
- quantize_mx, "Tile size": "The partition dimension size of src must be a multiple of 32 and must not exceed 128";
  "The free dimension size of src must be a multiple of 4"; dst has "a free dimension size that is 1/4 of src free
  dimension size" (rule NKI-MX-QUANTIZE-TILE);
- scales: "If P > 32 (Oversize required) MX Quantized Scale = [P, F//4] UINT8 in SBUF", each group's scale in the first
  4 partitions of its quadrant (nki/deep-dives/mxfp-matmul.rst, "Scale Tensor"; rule NKI-MX-SCALE-LAYOUT).
"""

from __future__ import annotations

from dataclasses import dataclass

from .program import DmaCopy, Matmul, Ref

__all__ = ["Interleave", "InterleavedLoad", "MatmulMx", "QuantizeMx"]


@dataclass(frozen=True)
class MatmulMx(Matmul):
    """``dst[M, N] (+)= dequant(stationary)[4K, M].T @ dequant(moving)[4K, N]`` (``nisa.nc_matmul_mx``): stationary
    [K, M] and moving [K, N] are packed MX tiles, ``stationary_scale`` / ``moving_scale`` their scale tiles
    ([K, M] / [K, N] uint8, the quadrant layout). Never ``perf_mode`` (an nc_matmul argument) or a column tile."""

    stationary_scale: Ref | None = None
    moving_scale: Ref | None = None

    def __post_init__(self) -> None:
        if self.stationary_scale is None or self.moving_scale is None:
            raise ValueError("nc_matmul_mx reads a scale tile for each operand")
        if self.perf_mode != "none":
            raise ValueError("nc_matmul_mx takes no perf_mode")


@dataclass(frozen=True)
class QuantizeMx:
    """``dst, dst_scale = quantize_mx(src)`` on the Vector Engine (``nisa.quantize_mx``): ``src`` [P, F, 4] bf16 (each
    partition's 4 packed elements innermost, printed as the [P, 4F] tile the instruction reads), ``dst`` [P, F] of an
    ``_x4`` dtype, ``dst_scale`` [P, F] uint8 (the scales of the groups of 8 partitions in the first 4 partitions of
    each quadrant)."""

    dst: Ref
    src: Ref
    dst_scale: Ref


@dataclass(frozen=True)
class Interleave:
    """``dst[p, t, j] = src[p, j, t]``: four consecutive tiles of a strip (``src`` [P, 4, T], the contraction positions
    128 apart) copied into the layout quantize_mx reads (``dst`` [P, T, 4], the 4 elements of a partition innermost),
    one engine copy whose source is read through an access pattern (``nisa.tensor_copy`` with ``src=t.ap(...)``, the
    "VectorE/ScalarE Strided Access" of "MXFP Matrix Multiplication with NKI on AWS Neuron", and nki-library's strided
    PSUM read, gate_up_projection_mx_shard_H.py:199-216). ``src`` is a region of a 3-D ``[P, tiles, T_block]``
    buffer."""

    dst: Ref
    src: Ref


@dataclass(frozen=True)
class InterleavedLoad(DmaCopy):
    """A DMA of a row-major activation block ``src`` [T, 512] (HBM) straight into the layout quantize_mx reads,
    ``dst`` [P, T, 4] with ``dst[p, t, j] = src[t, 128 j + p]``: the source read through an access pattern (the "DMA
    Strided Access" of "MXFP Matrix Multiplication with NKI on AWS Neuron", "SBUF Layout Using Strided Access": "we DMA
    a tensor from HBM to SBUF using a strided access pattern"). Its contiguous runs are single elements, which is how
    the cost model prices it (slow on a large block; at a decode step's few tokens it saves the TensorE transposes and
    their evictions)."""

"""What the lowerings take from the :class:`~neuronmm_compiler.targets.Target`: hardware limits, and
nmmc's tiling policies derived from them.

The lowerings hold no hardware number of their own. Limits are read from the target's fields
(``pmax``, ``gemm_stationary_fmax``, ``gemm_moving_fmax``, ``psum_bank_bytes``, ``psum_banks``,
``dma_efficiency_curve``); where nmmc makes a *choice* from them (how many PSUM banks a K-blocked
group may hold, how wide a copy tile is), the choice is one function here whose docstring says how
it follows from the target.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from ..kernel_ir.expr import named
from ..kernel_ir.program import DTYPE_BYTES

if TYPE_CHECKING:
    from ..targets import Target

#: PSUM banks a fused kernel keeps for other uses while a K-blocked group holds its accumulators:
#: one for the accumulator of the row-major matmul that follows in the same token block, one for
#: the TensorE transposes (``x_transpose=pe`` strips, outputs stored transposed). A policy count of
#: nmmc's fused kernel layout, not a hardware figure.
FUSED_RESERVED_PSUM_BANKS = 2

#: DMA efficiency (fraction of peak) nmmc treats as "on the plateau" of the target's efficiency curve.
DMA_PLATEAU_EFFICIENCY = 0.95


def named_limits(target: Target) -> Target:
    """``target`` with the tile limits a lowering reads named for the printed kernel (:class:`Named`): ``P`` for
    ``pmax``, the partitions of a tile (NKI's ``nl.tile_size.pmax``). Values, and so every count, are unchanged."""
    return replace(target, pmax=named(target.pmax, "P", "partitions per tile (nl.tile_size.pmax)"))


def constant_name(node_id: str, what: str) -> str:
    """The printed name of a size of a graph value: ``constant_name("h_ud", "BLOCK")`` is ``H_UD_BLOCK``."""
    return re.sub(r"\W", "_", f"{node_id}_{what}").upper()


def feature_tile_size(target: Target, features: int) -> int:
    """Output features per matmul of a transposed group (``F_TILE`` in the printed kernel): the stationary's free
    size, ``gemm_stationary_fmax`` (128), or all of ``features`` when fewer."""
    fmax = target.gemm_stationary_fmax
    return named(fmax, "F_TILE", "output features per matmul (nl.tile_size.gemm_stationary_fmax)") \
        if features >= fmax else features


def psum_bank_fp32(target: Target) -> int:
    """fp32 values per partition in one PSUM bank (the accumulators' dtype): the target's bank
    bytes over 4 (2 KiB: 512 values on every current generation)."""
    return target.psum_bank_bytes // DTYPE_BYTES["float32"]


def k_blocked_group_banks(target: Target) -> int:
    """PSUM banks a transposed group with a blocked contraction may hold across its K blocks.

    Each output feature tile of such a group keeps one bank as its accumulator for the whole K loop,
    so the group's feature block is bounded by the banks it may hold. The fused kernel keeps
    :data:`FUSED_RESERVED_PSUM_BANKS` for the row-major matmul after it and for TensorE transposes,
    so the group gets the rest: ``psum_banks - 2`` (6 of 8 on trn1/trn2/trn3), at least 1."""
    return max(1, target.psum_banks - FUSED_RESERVED_PSUM_BANKS)


def packed_feature_tiles(target: Target, tokens: int) -> int:
    """Feature tiles whose ``[128, tokens]`` fp32 accumulators one PSUM bank holds side by side, where packing is
    worth it (more than the banks a K-blocked group may hold one per tile, :func:`k_blocked_group_banks`); 0 where
    it is not. Matmuls accumulating into different slices of one bank, interleaved over the contraction, are what
    AWS's decode MLP does in its weight-stationary down projection (aws-neuron/nki-library@d2ad3a57:
    src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_down_projection.py:266-331, ``perBankT = psum_fmax // T``
    slices of one bank)."""
    slots = psum_bank_fp32(target) // max(tokens, 1)
    return slots if slots > k_blocked_group_banks(target) else 0


def copy_tile_cols(target: Target) -> int:
    """Columns per tile of a fused kernel's plain copy (an output returning an input as stored):
    as wide as the widest row a matmul of the kernel produces (the moving operand's free size,
    ``gemm_moving_fmax``, 512), so a copy's transfers are no narrower than the kernel's stores."""
    return target.gemm_moving_fmax


def dma_plateau_bytes(target: Target) -> int:
    """Bytes per partition of the narrowest transfer on the target's DMA efficiency curve that reaches
    :data:`DMA_PLATEAU_EFFICIENCY` of peak (4 KiB on the stock curve, at 97%); the widest point of
    the curve when none does."""
    curve = target.dma_efficiency_curve
    return next((size for size, efficiency in curve if efficiency >= DMA_PLATEAU_EFFICIENCY), curve[-1][0])


def elementwise_tile_cols(target: Target) -> int:
    """Columns per tile of a standalone elementwise kernel (the unfused baselines' SiLU, multiply,
    add): enough that a bf16 row of one tile is a transfer on the DMA efficiency plateau
    (:func:`dma_plateau_bytes` / 2 bytes: 2048 columns on the stock curve). The same column count
    serves fp32 tensors, whose rows are then twice as long and on the plateau too."""
    return dma_plateau_bytes(target) // DTYPE_BYTES["bfloat16"]

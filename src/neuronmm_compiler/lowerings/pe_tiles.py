"""PE column tiles, shared by the lowerings: a row-major matmul sequence whose stationary is narrow (decode tokens)
spread over ``C`` tiles of the TensorEngine's PE columns, and the sum of the tiles' partial results.

The 128 x 128 PE array can be sliced into 2 x 64 (from NeuronCore-v2) or 4 x 32 (from NeuronCore-v3) column tiles;
``nc_matmul`` instructions in distinct tiles run concurrently (NKI API reference, nki.isa.nc_matmul, "Tiling mode";
rule NKI-MATMUL-TILE). The contraction tiles of one output tile are independent matmuls into one accumulator, so
they go round the ``C`` tiles: K tile ``kt`` runs in column tile ``kt % C`` (K tiles in groups of ``C``, tile ``ct`` of
a group in PE columns ``ct * width``), and accumulates on the PSUM partitions of its columns (rule
NKI-MATMUL-TILE-DST), so the accumulator spans the array's partitions and holds ``C`` partial sums, which the
eviction adds. AWS's decode MLP does the same (aws-neuron/nki-library, core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py).
"""

from __future__ import annotations

from collections.abc import Callable

from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Expr, Lin, scale, var
from ..kernel_ir.program import Alloc, Buffer, Copy, Loop, Matmul, PeTile, Ref, Stmt, TensorTensor, span
from ..vocab import ElementwiseOp


def column_matmuls(k_tiles: int, tiles: int, width: int, matmul: Callable[[Expr, Expr], Matmul],
                   prefix: str = "") -> list[Stmt]:
    """The matmuls of one output tile over ``k_tiles`` contraction tiles in ``tiles`` PE column tiles of ``width``
    columns: ``matmul(kt, ct)`` builds the matmul of K tile ``kt`` in column tile ``ct``. Loops ``kg`` (groups of
    ``tiles`` K tiles) and ``ct`` (one per column tile; fewer in a ragged last group)."""
    groups = Dim("kc", k_tiles, 1, k_tiles, tiles)
    kg, ct = iv(f"{prefix}kg", groups.blocks), var(f"{prefix}ct")
    body = [Loop(f"{prefix}ct", groups.tiles_in(kg), [matmul(groups.tile_index(kg, ct), ct)])]
    return loop(f"{prefix}kg", Lin(groups.blocks), groups.blocks, body,
                comment=f"contraction tiles {tiles} at a time, one per PE column tile of {width} columns")


def column_tile(ct: Expr, width: int, rows: int) -> PeTile:
    """Column tile ``ct`` of ``width`` columns, over ``rows`` PE rows from row 0."""
    return PeTile(Lin(0), scale(ct, width), rows, width)


def column_dst(acc: Buffer, ct: Expr, width: int, rows: Expr, cols: Expr, col0: Expr | int = 0) -> Ref:
    """The PSUM region column tile ``ct`` accumulates on: ``rows`` partitions from ``ct * width``."""
    return Ref(acc, (span(scale(ct, width), rows), span(col0, cols)))


def column_sum(acc: Buffer, total: Buffer, dst: Ref, tiles: int, width: int, rows: Expr, cols: Expr) -> list[Stmt]:
    """Add the ``tiles`` partial sums of a column-tiled accumulator ``acc`` (tile ``j`` on partitions ``j * width``)
    into ``dst``: the first copied into the fp32 SBUF tile ``total`` (a vector instruction reads at most one PSUM
    operand), the others added to it, the last add writing ``dst`` (cast to its dtype). A partial sum on
    partitions ``j * width`` moves to partition 0: VectorE moves up to 32 partitions across quadrants and up to 64
    across halves (Trainium/Inferentia2 architecture guide, Cross-Partition Connectivity), which the widths
    (32 for 4 tiles, 64 for 2) match."""
    def part(j: int) -> Ref:
        return Ref(acc, (span(j * width, rows), span(0, cols)))

    held = Ref(total, (span(0, rows), span(0, cols)))
    out: list[Stmt] = [Alloc(total, comment=f"the {tiles} PE column tiles' partial sums, added"), Copy(held, part(0))]
    for j in range(1, tiles):
        out.append(TensorTensor(dst if j == tiles - 1 else held, held, part(j), ElementwiseOp.ADD))
    return out


def column_tiled(acc: Buffer, tiles: int, rows: int, k_tiles: int, msz: Expr, nsz: Expr,
                 operands: Callable[[Expr], tuple[Ref, Ref]]) -> list[Stmt]:
    """The matmuls of one output tile (``msz`` x ``nsz``) over ``k_tiles`` contraction tiles in ``tiles`` column
    tiles of the accumulator ``acc``'s partitions (the array's columns), over ``rows`` PE rows;
    ``operands(kt)``: the stationary and moving tiles of contraction tile ``kt``."""
    width = acc.shape[0] // tiles

    def matmul(kt: Expr, ct: Expr) -> Matmul:
        return Matmul(column_dst(acc, ct, width, msz, nsz), *operands(kt), tile=column_tile(ct, width, rows))

    return column_matmuls(k_tiles, tiles, width, matmul)

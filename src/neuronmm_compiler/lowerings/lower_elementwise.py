"""A standalone elementwise kernel (``out = silu(a)``, ``a * b``, ``a + b`` on row-major [rows, cols]
tensors): what an unfused baseline runs between its matmul kernels, HBM to HBM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Lin
from ..kernel_ir.program import Activation, Alloc, Buffer, DmaCopy, Program, Ref, Stmt, TensorTensor, span
from ..vocab import ElementwiseOp
from .limits import elementwise_tile_cols

if TYPE_CHECKING:
    from ..targets import Target

def lower_elementwise(op: str, shape: tuple[int, int], dtype: str, target: Target, *, name: str | None = None,
                      cols_per_tile: int | None = None) -> Program:
    """Rows in tiles of the target's partitions (``pmax``), columns in tiles of ``cols_per_tile``
    (default: :func:`~.limits.elementwise_tile_cols` of the target): load, compute, store."""
    checked = ElementwiseOp.lookup(op)
    if checked is None:
        raise ScheduleError(f"no elementwise kernel for {op!r}; known: {', '.join(ElementwiseOp)}")
    op = checked
    rows, cols = shape
    pmax = target.pmax
    rdim = Dim("r", rows, min(pmax, rows), -(-rows // pmax), 1)
    width = min(cols_per_tile or elementwise_tile_cols(target), cols)
    cdim = Dim("c", cols, width, -(-cols // width), 1)
    ins = [Buffer(n, shape, dtype, "hbm") for n in ("a", "b")[: op.arity]]
    out = Buffer("out", shape, dtype, "hbm")
    rt, ct = iv("r_tile", rdim.tiles), iv("c_tile", cdim.tiles)
    rsz, csz = rdim.tile_size(rt), cdim.tile_size(ct)
    region = (span(rdim.tile_start(rt), rsz), span(cdim.tile_start(ct), csz))
    body: list[Stmt] = []
    tiles = []
    for buf in ins:
        tile = Buffer(f"{buf.name}_tile", (rdim.tile, width), dtype, "sbuf")
        tiles.append(Ref(tile, (span(0, rsz), span(0, csz))))
        body += [Alloc(tile), DmaCopy(tiles[-1], Ref(buf, region))]
    res = Buffer("out_tile", (rdim.tile, width), dtype, "sbuf")
    res_ref = Ref(res, (span(0, rsz), span(0, csz)))
    body.append(Alloc(res))
    if op.unary:
        body.append(Activation(res_ref, tiles[0], op))
    else:
        body.append(TensorTensor(res_ref, tiles[0], tiles[1], op))
    body.append(DmaCopy(Ref(out, region), res_ref))
    nest = loop("r_tile", Lin(rdim.tiles), rdim.tiles, loop("c_tile", Lin(cdim.tiles), cdim.tiles, body))
    doc = f"out = {op}({', '.join(b.name for b in ins)}) over [{rows}, {cols}] ({dtype}), HBM to HBM."
    return Program(name or f"{op}_kernel", ins, [out], nest, doc=doc)

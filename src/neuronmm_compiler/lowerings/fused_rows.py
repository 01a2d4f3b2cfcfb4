"""Row-major groups of a fused kernel: values held token-major (tokens on partitions), computed
with a strip slice as the stationary operand and the weight as the moving one, packed into rows and
stored; outputs declared transposed of such values; and outputs that copy an input.

Part of the fused lowering (:mod:`.lower_fused`).
"""

from __future__ import annotations

from ..errors import ScheduleError
from ..ir import Node
from ..kernel_ir.dims import Dim, balanced_block, iv, loop
from ..kernel_ir.expr import Expr, Lin, add, scale, var
from ..kernel_ir.lnc import PROGRAM_ID, divisible_blocking, halves
from ..kernel_ir.program import (
    Alloc,
    Buffer,
    Comment,
    Copy,
    DmaCopy,
    Matmul,
    PeTranspose,
    Point,
    Ref,
    SendRecv,
    Stmt,
    TensorTensor,
    span,
)
from ..schedule.fused import tiles_per_weight_block
from ..vocab import ElementwiseOp, Layout
from .fused_groups import Group
from .fused_operands import OperandLoads
from .limits import constant_name, copy_tile_cols, k_blocked_group_banks, psum_bank_fp32


class RowMajorGroups(OperandLoads):
    """The lowering of groups annotated ``orient=normal``, of transposed stores and of copies."""

    def row_major_group(self, group: Group, mb: Expr, tok: Dim | None = None,
                        outputs: list[tuple[Node, Buffer]] | None = None) -> list[Stmt]:
        """A group held row-major (tokens on partitions), stored row by row to its outputs (default:
        every output of its root) over the token dimension ``tok`` (default: the kernel's)."""
        s, root = self.s, group.root
        tok = tok or self.tok
        if outputs is None:
            if not self._stored(root):
                raise ScheduleError(f"kernel {self.name}: row-major %{root.id} is placed in SBUF, but a row-major "
                                    "value is only ever stored")
            outputs = self.out_hbm[root.id]
        stores = [(o, hbm) for o, hbm in outputs if o.layout != Layout.TRANSPOSED]
        flipped = [(o, hbm) for o, hbm in outputs if o.layout == Layout.TRANSPOSED]
        out_dtype = outputs[0][0].dtype
        n = root.shape[1]
        tile_n = min(s.out_tile, n)
        ntiles = -(-n // tile_n)
        programs = self.target.lnc
        reducing = self._reduces(group)
        divided = programs > 1 and not reducing and (s.lnc_split == "features" or self._divides_features(group))
        if divided and ntiles % programs:
            # narrower tiles, so the output tiles divide between the programs (kernel_ir/lnc.py)
            tile_n = -(-n // (ntiles + programs - ntiles % programs))
            ntiles = -(-n // tile_n)
        kb = self._k_blocked_rows(group, tok, flipped, reducing)
        per_block = (self._tiles_per_block(group, tile_n, ntiles) if not kb else
                     max(1, min(tiles_per_weight_block(s, kb, tile_n, self._weight_bytes(group), ntiles),
                                k_blocked_group_banks(self.target))))
        if divided:  # blocks the programs can divide (kernel_ir/lnc.py)
            per_block = divisible_blocking(ntiles, per_block, self.target.lnc)
        if reducing:  # whole blocks, so each block's columns halve evenly (checked by reducing_group)
            per_block = max(d for d in range(1, per_block + 1) if ntiles % d == 0)
        odim = Dim("o", n, tile_n, ntiles, balanced_block(ntiles, per_block),
                   block_name=constant_name(root.id, "BLOCK"))
        ob = iv("o_blk", odim.blocks)
        if kb:
            return self._k_blocked_row_group(group, mb, odim, ob, kb, stores, out_dtype)
        loads, sources = self._weight_sources(group, odim, ob)
        tt = iv("tt", tok.tiles_in_block)
        tg = tok.tile_index(mb, tt)
        tsz = tok.tile_size(tg)
        bn = iv("bn", odim.tiles_in_block)
        g = odim.tile_index(ob, bn)
        nsz = odim.tile_size(g)
        name = outputs[0][0].attrs["name"]
        rows = Buffer(f"{name}_rows", (tok.tile, odim.block_elems), "float32" if reducing else out_dtype, "sbuf")
        result = Ref(rows, (span(0, tsz), span(scale(bn, tile_n), nsz)))
        per_tile, values = self._term_tiles(group, sources, odim, g, scale(bn, tile_n), nsz, tt, tsz, row_major=True,
                                            result=result)
        values.update(self.scale_refs(group, tsz, odim.tile_start(g), nsz))
        values.update(self.row_scale_refs(group, tsz, tsz, tt))
        for op in group.operands:
            if self._is_scale_operand(op.id):
                continue
            buf = Buffer(f"{op.attrs['name']}_rowtile", (tok.tile, tile_n), op.dtype, "sbuf")
            dst = Ref(buf, (span(0, tsz), span(0, nsz)))
            hbm = self.hbm[op.id]
            t0, c0 = tok.tile_start(tg), odim.tile_start(g)
            if op.layout == Layout.TRANSPOSED:
                dma = DmaCopy(dst, Ref(hbm, (span(c0, nsz), span(t0, tsz))), transpose=True)
            else:
                dma = DmaCopy(dst, Ref(hbm, (span(t0, tsz), span(c0, nsz))))
            per_tile += [Alloc(buf), dma]
            values[op.id] = dst
        per_tile += self._evaluated(group, values, result, (tok.tile, tile_n), (tsz, nsz))
        for out_node, hbm in flipped:
            per_tile += self._transposed_store(out_node, hbm, rows, odim, g, scale(bn, tile_n), tok, tg, tsz)
        cols = odim.block_size(ob)
        if reducing:
            store = self._reduce_scatter(rows, stores, odim, ob, tok.tile_start(tg), tsz, out_dtype)
        else:
            real = self.mx_tokens(tok.tile_start(tg), tsz)  # an MX kernel's pad token is not stored (lowerings/mx.py)
            store = [DmaCopy(Ref(hbm, (span(tok.tile_start(tg), real), span(odim.block_start(ob), cols))),
                             Ref(rows, (span(0, real), span(0, cols)))) for _, hbm in stores]
        what = "this program's partial sums of" if reducing else "one packed row of"
        token_tile = [Alloc(rows, comment=f"{what} output tiles"),
                      *loop("bn", odim.tiles_in(ob), odim.tiles_in_block, per_tile), *store]
        body = loads + loop("tt", tok.tiles_in(mb), tok.tiles_in_block, token_tile)
        names = ", ".join(o.attrs["name"] for o, _ in outputs)
        families = () if reducing else ("features", "gather", "hidden", "intermediate")
        return [Comment(f"{names} = {self._describe_group(group)}"),
                *loop("o_blk", Lin(odim.blocks), odim.blocks, body, split=families)]

    def _k_blocked_rows(self, group: Group, tok: Dim, flipped: list, reducing: bool) -> int:
        """K tiles per weight block when a row-major group streams its weight rows in K blocks (0: it does not):
        ``row_k_tiles`` (or, at 0, ``k_tiles_per_block``) below the contraction's tiles, balanced, for a decode-sized
        token block (one token tile), one term of one matmul whose weights are not cached, no operand read from HBM by
        the epilogue (an FP8 dequantization's scales are on chip already), no column tiles, no reduction, stored
        row-major. The output tiles' accumulators then live across the K blocks, as nki-library's decode down
        projection accumulates a 4096-column output tile across its 128-row weight slabs
        (aws-neuron/nki-library@d2ad3a57: src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_down_projection.py:125-198)."""
        s = self.s
        hbm_operands = [op for op in group.operands if not self._is_scale_operand(op.id)]
        asked = s.row_k_tiles or s.k_tiles_per_block
        if (asked <= 0 or tok.tiles_in_block != 1 or tok is not self.tok or reducing or flipped
                or hbm_operands or len(group.terms) != 1 or len(group.terms[0].matmuls) != 1):
            return 0
        (mm,) = group.terms[0].matmuls
        if self._cache(mm) or self._column_tiles(group, group.terms[0]) > 1 or self._contraction_split(group):
            return 0
        k_tiles = -(-self.nodes[mm.operands[0]].shape[1] // self.target.pmax)
        return balanced_block(k_tiles, asked) if asked < k_tiles else 0

    def _k_blocked_row_group(self, group: Group, mb: Expr, odim: Dim, ob: Expr, kb: int,
                             stores: list[tuple[Node, Buffer]], out_dtype: str) -> list[Stmt]:
        """A row-major group over one token tile with its contraction in K blocks: per output block, one PSUM bank
        per output tile held across the K blocks, each K block's weight rows loaded once (one DMA per 128 rows of the
        block's columns) and multiplied into every tile, then the tiles evicted into one packed row (the group's
        epilogue, e.g. an FP8 dequantization, evaluated on the eviction) and stored."""
        tok, root = self.tok, group.root
        (mm,) = group.terms[0].matmuls
        w, lhs = self._weight(mm), self.nodes[mm.operands[0]]
        kdim = self._kdim(lhs.shape[1], kb)
        kblk, kt = iv("k_blk", kdim.blocks), iv("kt", kb)
        gk = kdim.tile_index(kblk, kt)
        ksz = kdim.tile_size(gk)
        bn = iv("bn", odim.tiles_in_block)
        g = odim.tile_index(ob, bn)
        nsz = odim.tile_size(g)
        tsz = tok.tile_size(mb)
        name = stores[0][0].attrs["name"]
        acc = Buffer(f"{root.id}_psum", (tok.tile, odim.tiles_in_block, psum_bank_fp32(self.target)), "float32",
                     "psum")
        wbuf = Buffer(f"{w.attrs['name']}_block", (kdim.tile, kb, odim.block_elems), w.dtype, "sbuf")
        cols = odim.block_size(ob)
        load = self._load_k_block(w, wbuf, kdim, kblk, odim, ob)
        dst = Ref(acc, (span(0, tsz), Point(bn), span(0, nsz)))
        strip = Ref(self.strips[lhs.id], (span(0, ksz), Point(gk), span(0, tsz)))
        mmul = Matmul(dst, strip, Ref(wbuf, (span(0, ksz), Point(kt), span(scale(bn, odim.tile), nsz))),
                      perf_mode=self._perf_mode(mm))
        k_body = [Alloc(wbuf), *load, *loop("bn", odim.tiles_in(ob), odim.tiles_in_block,
                                            loop("kt", kdim.tiles_in(kblk), kb, [mmul]))]
        rows = Buffer(f"{name}_rows", (tok.tile, odim.block_elems), out_dtype, "sbuf")
        result = Ref(rows, (span(0, tsz), span(scale(bn, odim.tile), nsz)))
        values = {group.terms[0].node.id: dst, **self.scale_refs(group, tsz, odim.tile_start(g), nsz),
                  **self.row_scale_refs(group, tsz, tsz, Lin(0))}
        evict = self._evaluated(group, values, result, (tok.tile, odim.tile), (tsz, nsz))
        real = self.mx_tokens(tok.tile_start(mb), tsz)  # an MX kernel's pad token is not stored (lowerings/mx.py)
        store = [DmaCopy(Ref(hbm, (span(tok.tile_start(mb), real), span(odim.block_start(ob), cols))),
                         Ref(rows, (span(0, real), span(0, cols)))) for _, hbm in stores]
        body = [Alloc(acc, accumulator=True, comment="one PSUM bank per output tile, across K blocks"),
                *self.mx_hoisted_scales(w, wbuf, kdim, kblk, odim, ob),  # MX scales before the K blocks (mx.py)
                *loop("k_blk", Lin(kdim.blocks), kdim.blocks, k_body),
                Alloc(rows, comment="one packed row of output tiles"),
                *loop("bn", odim.tiles_in(ob), odim.tiles_in_block, evict), *store]
        names = ", ".join(o.attrs["name"] for o, _ in stores)
        return [Comment(f"{names} = {self._describe_group(group)}; weight rows in blocks of {kb} K tiles"),
                *loop("o_blk", Lin(odim.blocks), odim.blocks, body, split=("features", "gather", "hidden",
                                                                           "intermediate"))]

    def _reduce_scatter(self, rows: Buffer, stores: list[tuple[Node, Buffer]], odim: Dim, ob: Expr, t0: Expr,
                        tsz: Expr, dtype: str) -> list[Stmt]:
        """A reducing group's row of partial sums (lnc_split=hidden, intermediate): each program sends the other the
        half of the block's columns the other stores, adds the half it receives to its own, and stores its half
        (nisa.sendrecv; kernel_ir/lnc.py)."""
        half = odim.block_elems // 2
        own, other = halves(half)
        received = Buffer(f"{rows.name}_other", (rows.shape[0], half), "float32", "sbuf")
        summed = Buffer(f"{rows.name}_sum", (rows.shape[0], half), dtype, "sbuf")
        mine = Ref(rows, (span(0, tsz), own))
        col = add(odim.block_start(ob), scale(var(PROGRAM_ID), half))
        theirs = Ref(received, (span(0, tsz), span(0, half)))
        return [Alloc(received), SendRecv(theirs, Ref(rows, (span(0, tsz), other))),
                TensorTensor(mine, mine, theirs, ElementwiseOp.ADD),
                Alloc(summed), Copy(Ref(summed, (span(0, tsz), span(0, half))), mine),
                *(DmaCopy(Ref(hbm, (span(t0, real), span(col, half))), Ref(summed, (span(0, real), span(0, half))))
                  for _, hbm in stores for real in (self.mx_tokens(t0, tsz),))]

    def _transposed_store(self, out_node: Node, hbm: Buffer, rows: Buffer, odim: Dim, g: Expr, col: Expr,
                          tok: Dim, tg: Expr, tsz: Expr) -> list[Stmt]:
        """Store output tile ``g`` of a row-major value to an output declared transposed: TensorE
        transposes of chunks of the packed row, each stored as rows of the output. A TensorE transpose
        is a matmul of the chunk (stationary) with an identity, so a chunk has at most
        ``gemm_stationary_fmax`` columns, which land on the result's partitions (at most ``pmax``)."""
        n = odim.size
        chunk = min(self.target.pmax, self.target.gemm_stationary_fmax)
        if odim.tile <= chunk:
            cdim = Dim("c", n, odim.tile, odim.tiles, 1)
        elif odim.tiles == 1 or odim.tile % chunk == 0:
            cdim = Dim("c", n, chunk, -(-n // chunk), -(-odim.tile // chunk))
        else:
            raise ScheduleError(f"kernel {self.name}: output {out_node.attrs['name']} is stored transposed from "
                                f"row-major tiles of {odim.tile} columns; use an out_tile of at most {chunk} or a "
                                f"multiple of {chunk}")
        ct = iv("ct", cdim.tiles_in_block)
        gc = cdim.tile_index(g, ct)
        csz = cdim.tile_size(gc)
        name = out_node.attrs["name"]
        tp = Buffer(f"{name}_tpsum", (cdim.tile, tok.tile), rows.dtype, "psum")
        tile = Buffer(f"{name}_tile", (cdim.tile, tok.tile), rows.dtype, "sbuf")
        body: list[Stmt] = [
            Alloc(tp),
            PeTranspose(Ref(tp, (span(0, csz), span(0, tsz))),
                        Ref(rows, (span(0, tsz), span(add(col, scale(ct, cdim.tile)), csz)))),
            Alloc(tile),
            Copy(Ref(tile, (span(0, csz), span(0, tsz))), Ref(tp, (span(0, csz), span(0, tsz)))),
            DmaCopy(Ref(hbm, (span(cdim.tile_start(gc), csz), span(tok.tile_start(tg), tsz))),
                    Ref(tile, (span(0, csz), span(0, tsz)))),
        ]
        return [Comment(f"{name} is declared transposed: TensorE transposes of the row, stored as columns"),
                *loop("ct", cdim.tiles_in(g), cdim.tiles_in_block, body)]

    def _plain_copy(self, inp: Node, out_node: Node, hbm: Buffer) -> list[Stmt]:
        """An output returning an input in the same layout: HBM to SBUF to HBM, tile by tile."""
        rows, cols = inp.storage_shape
        pmax = self.target.pmax
        rdim = Dim("r", rows, min(pmax, rows), -(-rows // pmax), 1)
        width = min(copy_tile_cols(self.target), cols)
        cdim = Dim("c", cols, width, -(-cols // width), 1)
        rt, ct = iv("r_tile", rdim.tiles), iv("c_tile", cdim.tiles)
        rsz, csz = rdim.tile_size(rt), cdim.tile_size(ct)
        region = (span(rdim.tile_start(rt), rsz), span(cdim.tile_start(ct), csz))
        name = out_node.attrs["name"]
        tile = Buffer(f"{name}_rows", (rdim.tile, width), inp.dtype, "sbuf")
        held = Ref(tile, (span(0, rsz), span(0, csz)))
        body: list[Stmt] = [Alloc(tile), DmaCopy(held, Ref(self.hbm[inp.id], region)), DmaCopy(Ref(hbm, region), held)]
        return [Comment(f"{name} = {inp.id}, copied as stored"),
                *loop("r_tile", Lin(rdim.tiles), rdim.tiles, loop("c_tile", Lin(cdim.tiles), cdim.tiles, body))]


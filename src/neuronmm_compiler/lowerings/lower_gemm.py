"""Lower a GEMM schedule to a loop-nest :class:`~.program.Program`.

The nest has three levels:

* block loops over m, n, k in ``loop_order`` (a loop of one trip is not emitted);
* in the body of the innermost block loop each operand depends on, that operand's block is loaded
  into SBUF (A as A^T tiles ``[tile_k, tiles_k, block_m]``, B as ``[tile_k, tiles_k, block_n]``);
* innermost, the compute section: tile loops over the block's M and N tiles (``tile_order``) and
  the K tiles of the block, issuing one ``nc_matmul`` per (m, n, k) tile triple.

Partial sums: when K is one block and accumulation is in PSUM, each output tile accumulates in its
own PSUM tile inside the compute section and is evicted right after. Otherwise accumulators for
every output tile the K loop revisits are allocated just outside the K loop, in PSUM (one bank per
tile) or in SBUF (zeroed, a vector add per tile and K block), and stored after it.

Output tiles are evicted from PSUM into SBUF and stored: one DMA per tile (``dma=tile``), or packed into
rows, one DMA per partition row of the block (``dma=row``), each row stored as soon as its tiles are
evicted when the N tiles are the inner tile loop (``tile_order=mn``), else the block's rows after its
last tile. With ``psum_buffers`` >= 1 the output tiles of a block rotate through that many PSUM copies
allocated before the tile loops, each tile's first matmul starting its sums.

Ragged dimensions: tile sizes and tiles-per-block of the last tile/block become ``min(...)``
expressions, so no out-of-bounds access and no padding of the user's tensors.

PE column tiles (``column_tiles``): with K in one block, an output tile's K tiles go round column tiles of the PE
array and its eviction adds their partial sums (:mod:`.pe_tiles`). The module is a few lines longer than the
400-line guideline for those two hooks, which sit in the compute section they change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Expr, Lin, add, modulo, named, scale, sub, var
from ..kernel_ir.fold import fold_unit_loops
from ..kernel_ir.lnc import distribute
from ..kernel_ir.program import (
    Alloc,
    Buffer,
    Comment,
    Copy,
    DmaCopy,
    Loop,
    Matmul,
    PeTranspose,
    Point,
    Program,
    Ref,
    Span,
    Stmt,
    TensorTensor,
    span,
)
from ..schedule.gemm import GemmProblem, GemmSchedule, load_levels, normalize_on, tile_counts
from ..vocab import ALayout, ElementwiseOp
from .limits import named_limits, psum_bank_fp32
from .pe_tiles import column_sum, column_tiled

if TYPE_CHECKING:
    from ..targets import Target


#: What an operand block holds (the comment on its allocation).
BLOCK_COMMENTS = {"a": "A^T block: K on partitions, M free (stationary)",
                  "b": "B block: K on partitions, N free (moving)"}


class _GemmLowering:
    def __init__(self, problem: GemmProblem, schedule: GemmSchedule, target: Target):
        self.p = problem
        self.target = target = named_limits(target)
        self.s = normalize_on(problem, schedule, target)
        counts = tile_counts(problem, self.s)
        s = self.s
        # tile and block sizes named as in AWS's matmul tutorial (TILE_M, BLOCK_M, ...; expr.Named)
        self.dims = {d: Dim(d, getattr(problem, d), named(getattr(s, f"tile_{d}"), f"TILE_{d.upper()}"), counts[d],
                            getattr(s, f"tiles_in_block_{d}"), block_name=f"BLOCK_{d.upper()}") for d in "mnk"}
        dt = problem.dtype
        m, n, k = self.dims["m"], self.dims["n"], self.dims["k"]
        self.a_hbm = Buffer(problem.a_name, problem.a_storage_shape, dt, "hbm")
        self.b_hbm = Buffer("b", (problem.k, problem.n), dt, "hbm")
        self.c_hbm = Buffer("c", (problem.m, problem.n), dt, "hbm")
        # Operand blocks held in explicit copies (operand_buffers >= 2): the copy a block uses is the index of
        # the loop it is loaded in, modulo the copies; the copies are allocated before that loop.
        order = s.loop_order
        self.level = load_levels(order)
        self.rotation: dict[str, tuple[int, Expr]] = {}
        for operand, level in self.level.items():
            copies = min(s.operand_buffers, self.dims[order[level]].blocks)
            if copies >= 2:
                self.rotation[operand] = (copies, modulo(var(f"{order[level]}_blk"), copies))
        self.a_tiles = Buffer("a_t_tiles", (k.tile, *self.copies("a"), k.tiles_in_block, m.block_elems), dt, "sbuf")
        self.a_rows = Buffer("a_rows", (m.tile, m.tiles_in_block, k.block_elems), dt, "sbuf")
        self.a_t_psum = Buffer("a_t_psum", (k.tile, m.tile), dt, "psum")  # a transpose does not cast
        self.b_tiles = Buffer("b_tiles", (k.tile, *self.copies("b"), k.tiles_in_block, n.block_elems), dt, "sbuf")
        self.per_tile_psum = s.accumulate == "psum" and k.blocks == 1
        self.hoisted_acc = not self.per_tile_psum
        kpos = order.index("k")
        self.outer_dims = [d for d in order[:kpos]]
        self.inner_dims = [d for d in order[kpos + 1:]]
        # Where each operand block is loaded (above) and the accumulators live: the body of the innermost
        # loop (in loop_order, one-trip loops included) the operand depends on.
        self.level["acc"] = max((order.index(d) for d in self.outer_dims), default=-1)
        # Accumulator coverage: the dims whose blocks the K loop revisits get all their tiles.
        self.acc_m_tiles = m.tiles if "m" in self.inner_dims else m.tiles_in_block
        self.acc_n_tiles = n.tiles if "n" in self.inner_dims else n.tiles_in_block
        acc_slots = self.acc_m_tiles * self.acc_n_tiles
        if s.accumulate == "psum":
            shape = (m.tile, n.tile) if acc_slots == 1 else (m.tile, acc_slots, psum_bank_fp32(target))
            self.acc = Buffer("acc_psum", shape, "float32", "psum")
        else:
            acc_dtype = "float32" if s.accumulator_dtype == "float32" else dt
            self.acc = Buffer("acc_sbuf", (m.tile, self.acc_m_tiles, self.acc_n_tiles * n.tile), acc_dtype, "sbuf")
        self.psum_tile = Buffer("c_psum", (m.tile, n.tile), "float32", "psum")
        if s.column_tiles > 1:  # PE column tiles: the accumulator spans the array's columns (lowerings/pe_tiles.py)
            self.psum_tile = Buffer("c_psum", (target.gemm_stationary_fmax, n.tile), "float32", "psum")
        self.column_sum = Buffer("c_sum", (m.tile, n.tile), "float32", "sbuf")
        # Rotating PSUM copies (psum_buffers >= 1): one bank each, so every copy is its own NKI tile once
        # kernel_ir.psum_banks splits the buffer, and the copy a tile uses is named statically.
        self.psum_rotation = Buffer("c_psum", (m.tile, max(s.psum_buffers, 1), psum_bank_fp32(target)),
                                    "float32", "psum")
        self.c_tile = Buffer("c_tile", (m.tile, n.tile), dt, "sbuf")
        self.c_block = Buffer("c_block", (m.tile, m.tiles_in_block, n.block_elems), dt, "sbuf")
        self.c_row = Buffer("c_row", (m.tile, n.block_elems), dt, "sbuf")
        row_cols = problem.n if "n" in self.inner_dims else n.block_elems
        self.c_rows = Buffer("c_rows", (m.tile, row_cols), dt, "sbuf")

    # ------------------------------------------------------------------ operand blocks

    def copies(self, operand: str) -> tuple[int, ...]:
        """The copies axis of an operand block's buffer: ``(B,)`` when it rotates through B copies, else none."""
        return (self.rotation[operand][0],) if operand in self.rotation else ()

    def tile_ref(self, operand: str, ksz: Expr, bk: Expr, free: Span) -> Ref:
        """K tile ``bk`` of an operand block (its current copy when the block rotates), free range ``free``."""
        buffer = self.a_tiles if operand == "a" else self.b_tiles
        copy = (Point(self.rotation[operand][1]),) if operand in self.rotation else ()
        return Ref(buffer, (span(0, ksz), *copy, Point(bk), free))

    def block_alloc(self, operand: str, *, hoisted: bool = False) -> list[Stmt]:
        """The allocation of an operand block: where it is loaded (``hoisted`` False) unless it rotates through
        explicit copies, which are allocated once before the loop that loads it (``hoisted`` True)."""
        if (operand in self.rotation) != hoisted:
            return []
        buffer = self.a_tiles if operand == "a" else self.b_tiles
        if not hoisted:
            return [Alloc(buffer, comment=BLOCK_COMMENTS[operand])]
        copies = self.rotation[operand][0]
        return [Alloc(buffer, copies=copies,
                      comment=f"{BLOCK_COMMENTS[operand]}; {copies} copies the loads rotate through")]

    # ------------------------------------------------------------------ operand loads
    def load_a(self, mb: Expr, kb: Expr) -> list[Stmt]:
        m, k, s = self.dims["m"], self.dims["k"], self.s
        bm, bk = iv("bm", m.tiles_in_block), iv("bk", k.tiles_in_block)
        gm, gk = m.tile_index(mb, bm), k.tile_index(kb, bk)
        msz, ksz = m.tile_size(gm), k.tile_size(gk)
        a_tile_dst = self.tile_ref("a", ksz, bk, span(scale(bm, m.tile), msz))
        out = self.block_alloc("a")
        km = self.p.a_layout == ALayout.KM
        if km or s.a_transpose == "dma":
            if s.dma == "row":
                mrows = m.block_size(mb)
                if km:
                    src = Ref(self.a_hbm, (span(k.tile_start(gk), ksz), span(m.block_start(mb), mrows)))
                else:
                    src = Ref(self.a_hbm, (span(m.block_start(mb), mrows), span(k.tile_start(gk), ksz)))
                dst = self.tile_ref("a", ksz, bk, span(0, mrows))
                out += loop("bk", k.tiles_in(kb), k.tiles_in_block, [DmaCopy(dst, src, transpose=not km)])
            else:
                if km:
                    src = Ref(self.a_hbm, (span(k.tile_start(gk), ksz), span(m.tile_start(gm), msz)))
                else:
                    src = Ref(self.a_hbm, (span(m.tile_start(gm), msz), span(k.tile_start(gk), ksz)))
                inner = loop("bk", k.tiles_in(kb), k.tiles_in_block, [DmaCopy(a_tile_dst, src, transpose=not km)])
                out += loop("bm", m.tiles_in(mb), m.tiles_in_block, inner)
            return out
        # A row-major, transposed on the TensorEngine: load rows, transpose tile by tile via PSUM.
        out.append(Alloc(self.a_rows, comment="A block as stored: M on partitions, K free"))
        if s.dma == "row":
            krows = k.block_size(kb)
            load = DmaCopy(Ref(self.a_rows, (span(0, msz), Point(bm), span(0, krows))),
                           Ref(self.a_hbm, (span(m.tile_start(gm), msz), span(k.block_start(kb), krows))))
            out += loop("bm", m.tiles_in(mb), m.tiles_in_block, [load])
        else:
            load = DmaCopy(Ref(self.a_rows, (span(0, msz), Point(bm), span(scale(bk, k.tile), ksz))),
                           Ref(self.a_hbm, (span(m.tile_start(gm), msz), span(k.tile_start(gk), ksz))))
            out += loop("bm", m.tiles_in(mb), m.tiles_in_block,
                         loop("bk", k.tiles_in(kb), k.tiles_in_block, [load]))
        transpose = [
            Alloc(self.a_t_psum),
            PeTranspose(Ref(self.a_t_psum, (span(0, ksz), span(0, msz))),
                        Ref(self.a_rows, (span(0, msz), Point(bm), span(scale(bk, k.tile), ksz)))),
            Copy(a_tile_dst, Ref(self.a_t_psum, (span(0, ksz), span(0, msz)))),
        ]
        out += loop("bm", m.tiles_in(mb), m.tiles_in_block,
                     loop("bk", k.tiles_in(kb), k.tiles_in_block, transpose))
        return out

    def load_b(self, kb: Expr, nb: Expr) -> list[Stmt]:
        n, k = self.dims["n"], self.dims["k"]
        bn, bk = iv("bn", n.tiles_in_block), iv("bk", k.tiles_in_block)
        gn, gk = n.tile_index(nb, bn), k.tile_index(kb, bk)
        nsz, ksz = n.tile_size(gn), k.tile_size(gk)
        out = self.block_alloc("b")
        if self.s.dma == "row":
            ncols = n.block_size(nb)
            load = DmaCopy(self.tile_ref("b", ksz, bk, span(0, ncols)),
                           Ref(self.b_hbm, (span(k.tile_start(gk), ksz), span(n.block_start(nb), ncols))))
            return out + loop("bk", k.tiles_in(kb), k.tiles_in_block, [load])
        load = DmaCopy(self.tile_ref("b", ksz, bk, span(scale(bn, n.tile), nsz)),
                       Ref(self.b_hbm, (span(k.tile_start(gk), ksz), span(n.tile_start(gn), nsz))))
        return out + loop("bn", n.tiles_in(nb), n.tiles_in_block,
                           loop("bk", k.tiles_in(kb), k.tiles_in_block, [load]))

    # ------------------------------------------------------------------ compute
    def compute(self, blocks: dict[str, Expr]) -> list[Stmt]:
        m, n, k, s = self.dims["m"], self.dims["n"], self.dims["k"], self.s
        mb, nb, kb = blocks["m"], blocks["n"], blocks["k"]
        bm, bn, bk = iv("bm", m.tiles_in_block), iv("bn", n.tiles_in_block), iv("bk", k.tiles_in_block)
        gm, gn = m.tile_index(mb, bm), n.tile_index(nb, bn)
        msz, nsz = m.tile_size(gm), n.tile_size(gn)

        def kloop(dst: Ref) -> list[Stmt]:
            if s.column_tiles > 1 and dst.buffer is self.psum_tile:  # normalize: K in one block
                return column_tiled(self.psum_tile, s.column_tiles, self.target.pmax, k.tiles, msz, nsz,
                                    lambda t: self.operands(blocks, t))
            return loop("bk", k.tiles_in(kb), k.tiles_in_block, [Matmul(dst, *self.operands(blocks, bk))])

        body: list[Stmt]
        pre: list[Stmt] = []
        post: list[Stmt] = []
        row_pre: list[Stmt] = []  # around the inner tile loop
        row_post: list[Stmt] = []
        rotating = s.psum_buffers > 0
        if rotating:
            what = ("copies the block's output tiles rotate through" if s.psum_buffers > 1
                    else "copy every output tile reuses")
            pre = [Alloc(self.psum_rotation, accumulator=True, copies=s.psum_buffers,
                         comment=f"{s.psum_buffers} PSUM {what}")]
        if self.per_tile_psum:
            psum, acc_alloc = self.tile_psum(msz, nsz)
            body = [*acc_alloc, *(self.first_kloop(psum, blocks) if rotating else kloop(psum))]
            if s.dma == "tile":
                c_sb = Ref(self.c_tile, (span(0, msz), span(0, nsz)))
                body += [Alloc(self.c_tile), *self.evict(c_sb, psum, msz, nsz),
                         DmaCopy(Ref(self.c_hbm, (span(m.tile_start(gm), msz), span(n.tile_start(gn), nsz))), c_sb)]
            elif s.tile_order == "mn":  # a row of the block is whole after its N tiles: stored right then
                body += self.evict(Ref(self.c_row, (span(0, msz), span(scale(bn, n.tile), nsz))), psum, msz, nsz)
                ncols = n.block_size(nb)
                row_pre = [Alloc(self.c_row, comment="one row of the block's output tiles, stored once evicted")]
                row_post = [DmaCopy(Ref(self.c_hbm, (span(m.tile_start(gm), msz), span(n.block_start(nb), ncols))),
                                    Ref(self.c_row, (span(0, msz), span(0, ncols))))]
            else:
                packed = Ref(self.c_block, (span(0, msz), Point(bm), span(scale(bn, n.tile), nsz)))
                body += self.evict(packed, psum, msz, nsz)
                pre.append(Alloc(self.c_block, comment="output block, packed for one store per row"))
                ncols = n.block_size(nb)
                store = DmaCopy(Ref(self.c_hbm, (span(m.tile_start(gm), msz), span(n.block_start(nb), ncols))),
                                Ref(self.c_block, (span(0, msz), Point(bm), span(0, ncols))))
                post = loop("bm", m.tiles_in(mb), m.tiles_in_block, [store])
        else:
            m_slot = gm if "m" in self.inner_dims else bm
            n_slot = gn if "n" in self.inner_dims else bn
            if s.accumulate == "psum":
                slot = add(scale(m_slot, self.acc_n_tiles), n_slot)
                if len(self.acc.shape) == 2:
                    dst = Ref(self.acc, (span(0, msz), span(0, nsz)))
                else:
                    dst = Ref(self.acc, (span(0, msz), Point(slot), span(0, nsz)))
                body = kloop(dst)
            else:
                psum, acc_alloc = self.tile_psum(msz, nsz)
                acc = Ref(self.acc, (span(0, msz), Point(m_slot), span(scale(n_slot, n.tile), nsz)))
                body = [*acc_alloc, *(self.first_kloop(psum, blocks) if rotating else kloop(psum)),
                        TensorTensor(acc, acc, psum, ElementwiseOp.ADD)]
        loops = {"m": ("bm", m.tiles_in(mb), m.tiles_in_block), "n": ("bn", n.tiles_in(nb), n.tiles_in_block)}
        outer, inner = s.tile_order
        body = row_pre + loop(*loops[inner], body) + row_post
        return pre + loop(*loops[outer], body) + post

    def evict(self, dst: Ref, psum: Ref, msz: Expr, nsz: Expr) -> list[Stmt]:
        """Evict an output tile's accumulator ``psum`` into ``dst``: a copy, or the sum of its PE column tiles'."""
        c = self.s.column_tiles
        return [Copy(dst, psum)] if c == 1 else column_sum(self.psum_tile, self.column_sum, dst, c,
                                                            self.psum_tile.shape[0] // c, msz, nsz)

    def operands(self, blocks: dict[str, Expr], bk: Expr) -> tuple[Ref, Ref]:
        """The stationary (A^T) and moving (B) tiles of K tile ``bk`` of the block, for the output tile the
        ``bm`` / ``bn`` loop variables select."""
        m, n, k = self.dims["m"], self.dims["n"], self.dims["k"]
        bm, bn = iv("bm", m.tiles_in_block), iv("bn", n.tiles_in_block)
        ksz = k.tile_size(k.tile_index(blocks["k"], bk))
        msz, nsz = m.tile_size(m.tile_index(blocks["m"], bm)), n.tile_size(n.tile_index(blocks["n"], bn))
        return (self.tile_ref("a", ksz, bk, span(scale(bm, m.tile), msz)),
                self.tile_ref("b", ksz, bk, span(scale(bn, n.tile), nsz)))

    def tile_psum(self, msz: Expr, nsz: Expr) -> tuple[Ref, list[Stmt]]:
        """An output tile's PSUM accumulator and its allocation: its own tile allocated in the tile loops, or
        (``psum_buffers`` >= 1) the rotating copy its position in the block selects, allocated before them."""
        if self.s.psum_buffers == 0:
            return Ref(self.psum_tile, (span(0, msz), span(0, nsz))), [Alloc(self.psum_tile, accumulator=True)]
        outer, inner = self.s.tile_order
        inner_tiles = self.dims[inner].tiles_in_block
        outer_var = iv("b" + outer, self.dims[outer].tiles_in_block)
        slot = modulo(add(scale(outer_var, inner_tiles), iv("b" + inner, inner_tiles)), self.s.psum_buffers)
        return Ref(self.psum_rotation, (span(0, msz), Point(slot), span(0, nsz))), []

    def first_kloop(self, dst: Ref, blocks: dict[str, Expr]) -> list[Stmt]:
        """The K-tile matmuls of one output tile into a rotating PSUM copy, which still holds an earlier
        tile's sums: the first K tile overwrites (starts the accumulation), the rest accumulate."""
        k, kb = self.dims["k"], blocks["k"]

        def matmul(bk: Expr, overwrite: bool) -> Matmul:
            return Matmul(dst, *self.operands(blocks, bk), overwrite=overwrite)

        out: list[Stmt] = [matmul(Lin(0), True)]
        if k.tiles_in_block == 1:
            return out
        rest = sub(k.tiles_in(kb), 1)
        if k.tiles_in_block == 2 and isinstance(rest, Lin) and rest.is_const:
            return [*out, matmul(Lin(1), False)]
        return [*out, Loop("bk", rest, [matmul(add(var("bk"), 1), False)])]

    # ------------------------------------------------------------------ accumulator store
    def store_acc(self, blocks: dict[str, Expr]) -> list[Stmt]:
        """Evict and store every accumulator tile once the K loop is done."""
        m, n, s = self.dims["m"], self.dims["n"], self.s
        if "m" in self.inner_dims:
            mt_name, mt_trip, mt_max = "m_tile", Lin(m.tiles), m.tiles
            gm = iv("m_tile", m.tiles)
            m_slot = gm
        else:
            mt_name, mt_trip, mt_max = "bm", m.tiles_in(blocks["m"]), m.tiles_in_block
            m_slot = iv("bm", m.tiles_in_block)
            gm = m.tile_index(blocks["m"], m_slot)
        if "n" in self.inner_dims:
            nt_name, nt_trip, nt_max = "n_tile", Lin(n.tiles), n.tiles
            gn = iv("n_tile", n.tiles)
            n_slot = gn
            col0, ncols = Lin(0), Lin(self.p.n)
        else:
            nt_name, nt_trip, nt_max = "bn", n.tiles_in(blocks["n"]), n.tiles_in_block
            n_slot = iv("bn", n.tiles_in_block)
            gn = n.tile_index(blocks["n"], n_slot)
            col0, ncols = n.block_start(blocks["n"]), n.block_size(blocks["n"])
        msz, nsz = m.tile_size(gm), n.tile_size(gn)
        if s.accumulate == "psum":
            if len(self.acc.shape) == 2:
                src = Ref(self.acc, (span(0, msz), span(0, nsz)))
            else:
                src = Ref(self.acc, (span(0, msz), Point(add(scale(m_slot, self.acc_n_tiles), n_slot)), span(0, nsz)))
        else:
            src = Ref(self.acc, (span(0, msz), Point(m_slot), span(scale(n_slot, n.tile), nsz)))
        if s.dma == "row":
            pack = Copy(Ref(self.c_rows, (span(0, msz), span(scale(n_slot, n.tile), nsz))), src)
            store = DmaCopy(Ref(self.c_hbm, (span(m.tile_start(gm), msz), span(col0, ncols))),
                            Ref(self.c_rows, (span(0, msz), span(0, ncols))))
            row = [Alloc(self.c_rows, comment="one row of output tiles, packed for a single store"),
                   *loop(nt_name, nt_trip, nt_max, [pack]), store]
            return loop(mt_name, mt_trip, mt_max, row)
        c_sb = Ref(self.c_tile, (span(0, msz), span(0, nsz)))
        tile = [Alloc(self.c_tile), Copy(c_sb, src),
                DmaCopy(Ref(self.c_hbm, (span(m.tile_start(gm), msz), span(n.tile_start(gn), nsz))), c_sb)]
        return loop(mt_name, mt_trip, mt_max, loop(nt_name, nt_trip, nt_max, tile))

    # ------------------------------------------------------------------ nest
    def nest(self, pos: int, blocks: dict[str, Expr]) -> list[Stmt]:
        order = self.s.loop_order
        if pos == len(order):
            return self.compute(blocks)
        d = order[pos]
        dim = self.dims[d]
        blocks = {**blocks, d: iv(f"{d}_blk", dim.blocks)}
        body = self.level_body(pos, blocks)
        sequential = d == "k" and self.s.accumulate == "sbuf"
        # An M or N block loop outside the K loop (or any, when each output tile is finished inside the K loop)
        # writes its own output blocks: the programs of a logical core may divide it.
        split = (d,) if d != "k" and (d in self.outer_dims or self.per_tile_psum) else ()
        return loop(f"{d}_blk", Lin(dim.blocks), dim.blocks, body, sequential=sequential, split=split)

    def level_body(self, pos: int, blocks: dict[str, Expr]) -> list[Stmt]:
        body: list[Stmt] = []
        for operand in ("a", "b"):
            if self.level[operand] == pos + 1:
                body += self.block_alloc(operand, hoisted=True)
        if self.level["a"] == pos:
            body += self.load_a(blocks["m"], blocks["k"])
        if self.level["b"] == pos:
            body += self.load_b(blocks["k"], blocks["n"])
        acc_here = self.hoisted_acc and self.level["acc"] == pos
        if acc_here:
            what = "partial sums" if self.s.accumulate == "sbuf" else "PSUM accumulators"
            body.append(Alloc(self.acc, zero=self.s.accumulate == "sbuf", accumulator=self.s.accumulate == "psum",
                              comment=f"{what} of every output tile the K loop revisits"))
        body += self.nest(pos + 1, blocks)
        if acc_here:
            body += self.store_acc(blocks)
        return body

    def program(self) -> Program:
        zero = {"m": Lin(0), "n": Lin(0), "k": Lin(0)}
        body: list[Stmt] = [Comment(f"schedule: {self.s.describe()}")]
        body += self.level_body(-1, zero)
        a = "a[M, K]" if self.p.a_layout == ALayout.MK else "a_t[K, M] (A stored transposed)"
        doc = (f"C[M, N] = A[M, K] @ B[K, N] with M={self.p.m}, N={self.p.n}, K={self.p.k} ({self.p.dtype}).\n"
               f"Arguments: {a}, b[K, N]. Returns c[M, N].")
        return Program("gemm_kernel", [self.a_hbm, self.b_hbm], [self.c_hbm], body, doc=doc)


def lower_gemm(problem: GemmProblem, schedule: GemmSchedule, target: Target) -> Program:
    """The loop-nest program of ``schedule`` for ``problem`` on ``target`` (the schedule is normalized
    first). PSUM accumulators held across the K loop take one bank of the target each. On an LNC=2 target
    the program's work is divided by ``lnc_split`` (:func:`~neuronmm_compiler.kernel_ir.lnc.distribute`)."""
    return fold_unit_loops(distribute(_GemmLowering(problem, schedule, target).program(), schedule.lnc_split,
                                      target.lnc))

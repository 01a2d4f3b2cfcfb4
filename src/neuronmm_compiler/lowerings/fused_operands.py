"""The operands of a fused kernel's matmuls: weight blocks and strips loaded into SBUF, and the
matmuls that accumulate each group's PSUM tiles from them.

Part of the fused lowering (:mod:`.lower_fused`); :class:`FusedState` declares the lowering's state
the parts share, :class:`OperandLoads` the loads and matmul tiles every kind of group uses.
Contraction tiles are ``pmax`` rows of the target (the partitions a matmul contracts over).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import IRError
from ..ir import Graph, Node
from ..ir.fp8 import is_fp8
from ..ir.mx import is_mx
from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Expr, Lin, scale
from ..kernel_ir.program import (
    DTYPE_BYTES,
    Alloc,
    Buffer,
    Copy,
    DmaCopy,
    Matmul,
    PerfMode,
    PeTranspose,
    Point,
    Ref,
    Stmt,
    span,
)
from ..schedule.fused import FusedSchedule, tiles_per_weight_block
from ..schedule.params import usable_column_tiles
from ..vocab import ElementwiseOp, Layout, NodeKind
from .fused_groups import Group, Term
from .mx import MxGroups
from .pe_tiles import column_dst, column_matmuls, column_sum, column_tile

if TYPE_CHECKING:
    from ..targets import Target


class FusedState:
    """What the parts of the fused lowering share (set by :class:`~.lower_fused._FusedLowering`)."""

    g: Graph
    name: str
    target: Target
    nodes: dict[str, Node]
    s: FusedSchedule  # normalized to the kernel's tokens
    tok: Dim  # the token dimension: tiles of token_tile, blocks of tokens_per_block
    dtype: str
    dtype_bytes: int
    hbm: dict[str, Buffer]  # kernel input id -> its HBM array
    out_hbm: dict[str, list[tuple[Node, Buffer]]]  # value id -> its outputs and their HBM arrays
    strips: dict[str, Buffer]  # value or input id -> its SBUF strip (held transposed)
    cached: dict[str, Buffer]  # matmul id -> its weight, resident across token blocks
    group_list: list[Group]
    # the group whose contraction the programs of a logical core divide, summing their partial results
    # (lnc_split=intermediate; None otherwise), and the values whose strips then hold only this program's half
    reducing: list[Group]
    halved: set[str]

    def _reduces(self, group: Group) -> bool:
        """Whether the programs of a logical core divide ``group``'s contraction and add their partial sums."""
        return any(group is r for r in self.reducing)

    def _users(self, node_id: str) -> list[Node]:
        return [self.nodes[u] for u in self.g.users(node_id)]

    def _stored(self, node: Node) -> bool:
        """Whether the kernel stores ``node`` to HBM: its ``place`` annotation (``hbm``), which must
        agree with the kernel graph having outputs of it (split_kernels gives those to every value
        placed in HBM)."""
        place = node.annotations["place"]
        outputs = node.id in self.out_hbm
        if (place == "hbm") != outputs:
            has = "has outputs" if outputs else "has no output"
            raise IRError(f"kernel {self.name}: %{node.id} is annotated place={place} but {has} in the kernel graph; "
                          "rerun the place pass and split_kernels")
        return outputs


class OperandLoads(FusedState, MxGroups):
    """Weights (streamed per block, or resident), input strips, and the PSUM tiles of groups' terms."""

    def _matmuls(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == NodeKind.MATMUL]

    def _weight(self, mm: Node) -> Node:
        """The weight of ``mm``: its right operand, a kernel input (passes/legality.py's rules)."""
        return self.nodes[mm.operands[1]]

    def _kdim(self, size: int, per_block: int = 0) -> Dim:
        """A contraction of ``size`` rows in tiles of the target's partitions, ``per_block`` tiles per block (0: all
        in one block)."""
        pmax = self.target.pmax
        tiles = -(-size // pmax)
        return Dim("k", size, min(pmax, size), tiles, per_block or tiles, block_name="K_BLOCK")

    def _strip(self, node_id: str, features: int) -> Buffer:
        """The SBUF strip holding a value transposed: [features (tiles of pmax), tiles, tokens of a block], in the
        kernel's dtype, FP8 for a quantized value, or float32 for a computed value only quantizations read (the
        normalized x of a norm prologue, as h: rounded once, into FP8; docs/quantization.md)."""
        if node_id not in self.strips:
            pmax = self.target.pmax
            tiles = -(-features // pmax)
            shape = (min(pmax, features), tiles, self.s.tokens_per_block)
            node = self.nodes[node_id]
            dtype = node.dtype if is_fp8(node.dtype) or is_mx(node.dtype) else self.dtype
            users = self._users(node_id)
            if node.kind != NodeKind.INPUT and users and all(u.kind == NodeKind.ELEMENTWISE and u.attrs["op"] in (
                    ElementwiseOp.QUANTIZE, ElementwiseOp.ROW_SCALE) for u in users):
                dtype = "float32"
            self.strips[node_id] = Buffer(f"{node_id}_strip", shape, dtype, "sbuf")
        return self.strips[node_id]

    def _perf_mode(self, mm: Node) -> PerfMode:
        """``double_row`` for an FP8 matmul on a target that documents it (never in a PE column tile: the callers
        that tile columns do not ask), else ``none``."""
        fp8 = is_fp8(self.nodes[mm.operands[0]].dtype)
        return "double_row" if fp8 and "double_row" in self.target.matmul_perf_modes else "none"

    def _cache(self, mm: Node) -> bool:
        stage1 = self.nodes[mm.operands[0]].kind == NodeKind.INPUT
        return self.s.cache_weights == "all" or (self.s.cache_weights == "stage1" and stage1)

    def _weight_dma(self, w: Node, dst: Ref, k0: Expr, ksz: Expr, c0: Expr, csz: Expr) -> DmaCopy:
        """Load weight rows ``k0:k0+ksz``, columns ``c0:c0+csz`` into ``dst`` [ksz, csz]; a weight stored
        transposed in HBM (W^T [N, K]) is read with a transposing DMA."""
        hbm = self.hbm[w.id]
        if w.layout == Layout.TRANSPOSED:
            return DmaCopy(dst, Ref(hbm, (span(c0, csz), span(k0, ksz))), transpose=True)
        return DmaCopy(dst, Ref(hbm, (span(k0, ksz), span(c0, csz))))

    def _load_k_block(self, w: Node, buf: Buffer, kdim: Dim, kblk: Expr, fdim: Dim, blk: Expr) -> list[Stmt]:
        """DMAs filling ``buf[k, kt, :]`` with the weight rows of K block ``kblk`` and the columns of block ``blk`` of
        ``fdim``: one per 128 rows (one per block once ``coalesce_slab_loads`` joins them, ``weight_dma=block``), and
        an MX weight's scales of the K block unless they are hoisted before the K-block loop (lowerings/mx.py)."""
        kt = iv("kt", kdim.tiles_in_block)
        gk = kdim.tile_index(kblk, kt)
        ksz, cols = kdim.tile_size(gk), fdim.block_size(blk)
        dma = self._weight_dma(w, Ref(buf, (span(0, ksz), Point(kt), span(0, cols))), kdim.tile_start(gk), ksz,
                               fdim.block_start(blk), cols)
        return loop("kt", kdim.tiles_in(kblk), kdim.tiles_in_block, [dma]) + self._k_block_scales(w, buf, kdim, kblk,
                                                                                                 fdim, blk)

    def _k_block_scales(self, w: Node, buf: Buffer, kdim: Dim, kblk: Expr, fdim: Dim, blk: Expr) -> list[Stmt]:
        """An MX weight's scales of K block ``kblk`` into the scale buffer of ``buf`` (lowerings/mx.py); nothing when
        they are hoisted before the K-block loop (``mx_scales=hoisted``: :meth:`~.mx.MxGroups.mx_hoisted_scales`)."""
        if self.mx_hoists(w):
            return []
        return self.mx_weight_scales(w, buf, Lin(0), kdim.tile_index(kblk, Lin(0)), kdim.tiles_in(kblk),
                                     fdim.block_start(blk), fdim.block_size(blk))

    def _load_block(self, w: Node, buf: Buffer, kdim: Dim, fdim: Dim, blk: Expr, max_tiles: int,
                    split: tuple[str, ...] = ()) -> list[Stmt]:
        """DMAs filling ``buf[k, kt, :]`` with the weight columns of feature block ``blk`` (``split``: the work-split
        families the contraction loop belongs to, kernel_ir/lnc.py), and an MX weight's scales (lowerings/mx.py)."""
        return self._load_slabs(w, buf, kdim, fdim, blk, max_tiles, split) + self.mx_weight_scales(
            w, buf, Lin(0), Lin(0), Lin(kdim.tiles), fdim.block_start(blk), fdim.block_size(blk))

    def _load_slabs(self, w: Node, buf: Buffer, kdim: Dim, fdim: Dim, blk: Expr, max_tiles: int,
                    split: tuple[str, ...]) -> list[Stmt]:
        kt = iv("kt", kdim.tiles)
        ksz, k0 = kdim.tile_size(kt), kdim.tile_start(kt)
        if self.s.weight_dma != "tile" or max_tiles == 1:
            cols = fdim.block_size(blk)
            dma = self._weight_dma(w, Ref(buf, (span(0, ksz), Point(kt), span(0, cols))), k0, ksz,
                                   fdim.block_start(blk), cols)
            return loop("kt", Lin(kdim.tiles), kdim.tiles, [dma], split=split)
        wt = iv("wt", max_tiles)
        g = fdim.tile_index(blk, wt)
        csz = fdim.tile_size(g)
        dma = self._weight_dma(w, Ref(buf, (span(0, ksz), Point(kt), span(scale(wt, fdim.tile), csz))), k0, ksz,
                               fdim.tile_start(g), csz)
        return loop("wt", fdim.tiles_in(blk), max_tiles, loop("kt", Lin(kdim.tiles), kdim.tiles, [dma], split=split))

    def _weights(self, mm: Node, fdim: Dim, blk: Expr, split: tuple[str, ...] = ()) -> tuple[list[Stmt], Buffer, bool]:
        """(statements loading the weight block, the buffer to read, whether it holds all columns)."""
        w = self._weight(mm)
        if self._cache(mm):
            return [], self.cached[mm.id], True
        kdim = self._kdim(w.shape[0])
        buf = Buffer(f"{w.attrs['name']}_block", (kdim.tile, kdim.tiles, fdim.block_elems), w.dtype, "sbuf")
        return [Alloc(buf), *self._load_block(w, buf, kdim, fdim, blk, fdim.tiles_in_block, split)], buf, False

    def cached_weights(self) -> list[Stmt]:
        """Loads, before the token loop, of the weights ``cache_weights`` keeps resident in SBUF."""
        out: list[Stmt] = []
        for mm in self._matmuls():
            if not self._cache(mm):
                continue
            w = self._weight(mm)
            kdim = self._kdim(w.shape[0])
            n = w.shape[1]
            buf = Buffer(f"{w.attrs['name']}_resident", (kdim.tile, kdim.tiles, n), w.dtype, "sbuf")
            self.cached[mm.id] = buf
            whole = Dim("w", n, n, 1, 1)
            out += [Alloc(buf, comment=f"{w.attrs['name']} stays in SBUF across token blocks"),
                    *self._load_block(w, buf, kdim, whole, Lin(0), 1)]
        return out

    def load_strip(self, inp: Node, mb: Expr) -> list[Stmt]:
        """X^T strip of a kernel input: [K on partitions (tiles), tokens of the block]."""
        tok, s = self.tok, self.s
        k = inp.shape[1]
        kdim = self._kdim(k)
        buf = self._strip(inp.id, k)
        hbm = self.hbm[inp.id]
        t0, bm = tok.block_start(mb), tok.block_size(mb)
        kt = iv("kt", kdim.tiles)
        ksz, k0 = kdim.tile_size(kt), kdim.tile_start(kt)
        out: list[Stmt] = [Alloc(buf, comment=f"{inp.attrs['name']}^T strip: features on partitions, tokens free")]
        split = self._strip_split(inp)
        if inp.layout == Layout.TRANSPOSED:
            dma = DmaCopy(Ref(buf, (span(0, ksz), Point(kt), span(0, bm))), Ref(hbm, (span(k0, ksz), span(t0, bm))))
            return out + loop("kt", Lin(kdim.tiles), kdim.tiles, [dma], split=split)
        if s.x_transpose == "dma":
            real = self.mx_tokens(t0, bm)  # bm but in an MX kernel padded to an even count (lowerings/mx.py)
            dma = DmaCopy(Ref(buf, (span(0, ksz), Point(kt), span(0, real))),
                          Ref(hbm, (span(t0, real), span(k0, ksz))), transpose=True)
            out += self.mx_zeroed(Ref(buf, (span(0, buf.shape[0]), span(0, kdim.tiles), span(0, bm))))
            return out + loop("kt", Lin(kdim.tiles), kdim.tiles, [dma], split=split)
        tt = iv("tt", tok.tiles_in_block)
        tg = tok.tile_index(mb, tt)
        tsz = tok.tile_size(tg)
        rows = Buffer(f"{inp.attrs['name']}_rows", (tok.tile, k), inp.dtype, "sbuf")
        tp = Buffer(f"{inp.attrs['name']}_tpsum", (kdim.tile, tok.tile), inp.dtype, "psum")
        out += self.alloc_row_parts(inp, 1)
        real = self.mx_tokens(tok.tile_start(tg), tsz)
        body: list[Stmt] = [
            Alloc(rows, comment="tokens on partitions, as stored"),
            *self.mx_zeroed(Ref(rows, (span(0, tsz), span(0, k)))),
            DmaCopy(Ref(rows, (span(0, real), span(0, k))), Ref(hbm, (span(tok.tile_start(tg), real), span(0, k)))),
            # a per-token FP8 scale's maxima, reduced on the rows before their transposes (lowerings/row_scales.py)
            *self.row_parts_from_rows(inp, Ref(rows, (span(0, tsz), span(0, k))), Lin(0), tt),
            *loop("kt", Lin(kdim.tiles), kdim.tiles, [
                Alloc(tp),
                PeTranspose(Ref(tp, (span(0, ksz), span(0, tsz))), Ref(rows, (span(0, tsz), span(k0, ksz)))),
                Copy(Ref(buf, (span(0, ksz), Point(kt), span(scale(tt, tok.tile), tsz))),
                     Ref(tp, (span(0, ksz), span(0, tsz)))),
            ], split=split),
        ]
        return out + loop("tt", tok.tiles_in(mb), tok.tiles_in_block, body)

    def _tiles_per_block(self, group: Group, tile: int, ntiles: int) -> int:
        """Output tiles per weight block of a group: as many as ``weight_block_kib`` holds with all the
        contraction rows of its longest matmul; all of them when the group has no matmul."""
        if not group.matmuls:
            return ntiles
        k_tiles = max(-(-self.nodes[mm.operands[0]].shape[1] // self.target.pmax) for mm in group.matmuls)
        return tiles_per_weight_block(self.s, k_tiles, tile, self._weight_bytes(group), ntiles)

    def _weight_bytes(self, group: Group) -> int:
        """Bytes per element of the group's weights: the kernel's dtype, or 1 for FP8 weights (a weight block of
        ``weight_block_kib`` then holds twice the columns; docs/quantization.md), or for MX weights a packed element
        and its
        scale tile's byte (5 for MXFP8, 3 for MXFP4: docs/mx.md)."""
        dtypes = {self._weight(mm).dtype for mm in group.matmuls}
        if dtypes and all(is_mx(d) for d in dtypes):  # a packed element and its tile's byte of scale (lowerings/mx.py)
            return max(DTYPE_BYTES[d] for d in dtypes) + 1
        return 1 if dtypes and all(is_fp8(d) for d in dtypes) else self.dtype_bytes

    def _weight_sources(self, group: Group, fdim: Dim, blk: Expr) -> tuple[list[Stmt], dict[str, tuple[Buffer, bool]]]:
        """(loads of the block's weights, matmul id -> (buffer, whether it holds all columns))."""
        loads: list[Stmt] = []
        sources: dict[str, tuple[Buffer, bool]] = {}
        for mm in group.matmuls:
            more, buf, whole = self._weights(mm, fdim, blk, self._contraction_split(group))
            loads += more
            sources[mm.id] = (buf, whole)
        return loads, sources

    def _term_tiles(self, group: Group, sources: dict[str, tuple[Buffer, bool]], fdim: Dim, g: Expr,
                    local: Expr, nsz: Expr, tile: Expr, tsz: Expr, row_major: bool, result: Ref | None = None
                    ) -> tuple[list[Stmt], dict[str, Ref]]:
        """PSUM tiles of every term of the group for one output tile. ``result``: where a row-major group without
        elementwise ops puts its value, which the partial sums of PE column tiles are added into directly."""
        out: list[Stmt] = []
        values: dict[str, Ref] = {}
        s = self.s
        for term in group.terms:
            columns = self._column_tiles(group, term) if row_major else 1
            if columns > 1:
                direct = result if not group.tree and term.node is group.root else None
                out += self._column_term(term, sources, fdim, g, local, nsz, tile, tsz, columns, values, direct)
                continue
            if row_major:
                psum = Buffer(f"{term.node.id}_psum", (self.tok.tile, fdim.tile), "float32", "psum")
                dst = Ref(psum, (span(0, tsz), span(0, nsz)))
            else:
                psum = Buffer(f"{term.node.id}_psum", (fdim.tile, s.tokens_per_block), "float32", "psum")
                dst = Ref(psum, (span(0, nsz), span(0, tsz)))
            out.append(Alloc(psum, accumulator=True))
            for mm in term.matmuls:
                buf, whole = sources[mm.id]
                col = fdim.tile_start(g) if whole else local
                lhs = self.nodes[mm.operands[0]]
                kdim = self._kdim(lhs.shape[1])
                kt = iv("kt", kdim.tiles)
                ksz = kdim.tile_size(kt)
                w = Ref(buf, (span(0, ksz), Point(kt), span(col, nsz)))
                if row_major:
                    x = Ref(self.strips[lhs.id], (span(0, ksz), Point(kt), span(scale(tile, self.tok.tile), tsz)))
                    mmul = Matmul(dst, x, w, perf_mode=self._perf_mode(mm))
                else:
                    x = Ref(self.strips[lhs.id], (span(0, ksz), Point(kt), span(0, tsz)))
                    mmul = Matmul(dst, w, x, perf_mode=self._perf_mode(mm))
                out += loop("kt", Lin(kdim.tiles), kdim.tiles, [mmul], split=self._contraction_split(group))
            values[term.node.id] = dst
        return out, values

    def _column_tiles(self, group: Group, term: Term) -> int:
        """The PE column tiles a row-major term's matmuls go round (:mod:`.pe_tiles`): the schedule's
        ``column_tiles`` narrowed to the contraction tiles of its shortest matmul; 1 when the contraction loop is
        divided between the programs of a logical core (its K tiles are then the programs' to share)."""
        if self.s.column_tiles == 1 or self._contraction_split(group) or self.mx:  # MX: row tiling only
            return 1
        k_tiles = min(self._kdim(self.nodes[mm.operands[0]].shape[1]).tiles for mm in term.matmuls)
        return usable_column_tiles(self.s.column_tiles, self.tok.tile, k_tiles, self.target.gemm_stationary_fmax)

    def _column_term(self, term: Term, sources: dict[str, tuple[Buffer, bool]], fdim: Dim, g: Expr, local: Expr,
                     nsz: Expr, tile: Expr, tsz: Expr, columns: int, values: dict[str, Ref],
                     result: Ref | None) -> list[Stmt]:
        """A row-major term's matmuls in ``columns`` PE column tiles, their partial sums added into an fp32 SBUF
        tile, which the epilogue reads, or with the last add writing ``result`` (:mod:`.pe_tiles`)."""
        array = self.target.gemm_stationary_fmax
        width = array // columns
        name = term.node.id
        psum = Buffer(f"{name}_psum", (array, fdim.tile), "float32", "psum")
        out: list[Stmt] = [Alloc(psum, accumulator=True)]
        for mm in term.matmuls:
            buf, whole = sources[mm.id]
            col = fdim.tile_start(g) if whole else local
            lhs = self.nodes[mm.operands[0]]
            kdim = self._kdim(lhs.shape[1])
            strip = self.strips[lhs.id]

            def matmul(kt: Expr, ct: Expr, buf: Buffer = buf, col: Expr = col, kdim: Dim = kdim,
                       strip: Buffer = strip) -> Matmul:
                ksz = kdim.tile_size(kt)
                x = Ref(strip, (span(0, ksz), Point(kt), span(scale(tile, self.tok.tile), tsz)))
                w = Ref(buf, (span(0, ksz), Point(kt), span(col, nsz)))
                return Matmul(column_dst(psum, ct, width, tsz, nsz), x, w,
                              tile=column_tile(ct, width, self.target.pmax))

            out += column_matmuls(kdim.tiles, columns, width, matmul)
        total = Buffer(f"{name}_sum", (self.tok.tile, fdim.tile), "float32", "sbuf")
        summed = result if result is not None else Ref(total, (span(0, tsz), span(0, nsz)))
        values[name] = summed
        return out + column_sum(psum, total, summed, columns, width, tsz, nsz)

    def _contraction_split(self, group: Group) -> tuple[str, ...]:
        """The split families that divide ``group``'s contraction between the programs of a logical core: the
        reducing groups of the ``hidden`` and ``intermediate`` splits (:meth:`~.lower_fused._FusedLowering.
        reducing_groups`)."""
        return (self.s.lnc_split,) if self._reduces(group) else ()

    def _strip_split(self, inp: Node) -> tuple[str, ...]:
        """A kernel input only reducing groups read: each program loads the half of its strip it contracts over."""
        readers = [g for g in self.group_list if any(mm.operands[0] == inp.id for mm in g.matmuls)
                   or any(op.id == inp.id for op in g.operands)]
        return (self.s.lnc_split,) if readers and all(self._reduces(g) for g in readers) else ()

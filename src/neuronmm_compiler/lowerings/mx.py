"""MX values in a fused kernel: scale tiles beside every MX tile, the on-chip quantization, the MX matmuls
(docs/mx.md).

Part of the fused lowering (:mod:`.lower_fused`). An MX value is held as the hardware holds it (ir/mx.py): its strip
or weight block is the usual ``[128, tiles, free]`` buffer of the packed ``_x4`` dtype, each tile 128 packed rows (512
contraction positions, one ``nc_matmul_mx``), so the fused lowering tiles, blocks, caches and divides it as any other
value; what MX adds is here:

- **Scale tiles.** Every MX buffer has a ``uint8`` scale buffer of its shape (:meth:`MxGroups.mx_scale_buffer`): the
  scale of group ``g`` of a tile on partition ``32 (g // 4) + g % 4`` ("If P > 32 (Oversize required) MX Quantized
  Scale = [P, F//4] UINT8 in SBUF", each group's scale in its quadrant: "MXFP Matrix Multiplication with NKI on AWS
  Neuron", "Scale Tensor"; rule NKI-MX-SCALE-LAYOUT). A weight block's scales are loaded with it, one DMA per quadrant
  of the ``[16, K/512, N]`` argument (rows ``4q .. 4q + 4`` to partitions ``32q .. 32q + 4``, as the guide's
  ``load_scales_scattered`` and nki-library's gate/up projection load them: aws-neuron/nki-library@d2ad3a57,
  src/nkilib_src/nkilib/core/mlp/mlp_tkg/gate_up_projection_mx_shard_H.py:115-131).
- **Hoisted scales** (``mx_scales=hoisted``, :meth:`MxGroups.mx_hoisted_scales`): a weight streamed in K blocks loads
  the scales of every K tile of its column block once, before the K-block loop, into a scale buffer
  ``[128, K tiles, columns]``: 4 DMAs per column block instead of 4 per K block. One DMA per quadrant holds them all:
  the quadrant layout fixes only the partitions (the first 4 of each quadrant), the K tiles are a free axis of the
  scale tile, so rows ``4q .. 4q + 4`` of the ``[16, K/512, N]`` argument over every K tile are one 3-D region of
  contiguous column runs, as nki-library's gate/up projection loads every K tile of its scales in one DMA per
  quadrant (aws-neuron/nki-library@d2ad3a57, gate_up_projection_mx_shard_H.py:115-131, "Load 4 partitions of scales
  for every quadrant": a ``[_pmax, n_H512_tile_sharded, I]`` buffer, every K tile and column of it in each DMA). The
  matmuls of the K block read the scale tile at the global K tile (:meth:`MxGroups.mx_matmuls`). The buffer sits
  beside the weight block (``weight_block_kib`` does not count it; the footprint does), so the search costs it beside
  each schedule.
- **Quantization** (:meth:`MxGroups.mx_quantize_group`, a ``quantize_mx`` group): the bf16 strip of the value, per
  512-position tile, copied into an interleaved tile ``[128, tokens, 4]`` (element ``j`` of partition ``p`` from the
  strip's tile ``4 kt + j``: the "VectorE/ScalarE Strided Access" technique of the guide, "SBUF Layout Using Strided
  Access"), then ``nisa.quantize_mx`` into the MX strip and its scales, which it writes in the quadrant layout itself
  ("Quantize-MX will correctly spread the data across SBUF partition-dim quadrants").
- **Matmuls.** Every ``Matmul`` of two MX tiles becomes a :class:`~..kernel_ir.mx.MatmulMx` reading the scale tile at
  the same index of each operand's scale buffer, or for a hoisted weight block at its global K tile
  (:meth:`MxGroups.mx_matmuls`): the dequantization is inside the instruction.
- **Even stationary.** "The free dimension size of stationary must be even" (nki.isa.nc_matmul_mx, "Tile size"): a
  row-major MX matmul's stationary is a token tile of the strip, so an MX kernel over an odd token count T computes
  ``T + 1`` token columns, the last of zeros: its activation loads zero their target first and stop at ``T``, as do
  its stores (:meth:`MxGroups.mx_tokens`, :meth:`MxGroups.mx_zeroed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..errors import ScheduleError
from ..ir import Node
from ..ir.mx import MX_PACK, MX_TILE, QUADRANT, SCALES_PER_QUADRANT, is_mx
from ..ir.mx_graph import scale_name
from ..ir.mx_quantized import is_mx_graph
from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Expr, Lin, minimum, scale, sub
from ..kernel_ir.mx import Interleave, InterleavedLoad, MatmulMx, QuantizeMx
from ..kernel_ir.program import Alloc, Buffer, DmaCopy, Loop, Matmul, Memset, Point, Ref, Stmt, span
from ..schedule.fused import FusedSchedule
from ..vocab import ElementwiseOp, Layout, NodeKind
from .fused_groups import Group

__all__ = ["MxGroups", "check_mx_schedule"]


def check_mx_schedule(params: Mapping[str, str | int]) -> None:
    """ScheduleError for a ``--param`` an MX kernel cannot take: PE column tiles ("For nc_matmul_mx, Tensor Engine
    supports only row tiling mode", NKI ISA reference; rule NKI-MX-MATMUL-TILE) and ``mlp=split`` (h handed between
    two kernels in HBM: an MX MLP quantizes h on chip, not built)."""
    if int(params.get("column_tiles", 1)) > 1:
        raise ScheduleError("NKI-MX-MATMUL-TILE: column_tiles > 1: 'For nc_matmul_mx, Tensor Engine supports only row "
                            "tiling mode' (NKI ISA reference, nki.isa.nc_matmul_mx); drop the column_tiles parameter")
    if params.get("mlp") == "split":
        raise ScheduleError("mlp=split: an MX MLP quantizes h on chip with nisa.quantize_mx; handing h between two "
                            "kernels is not built (docs/mx.md)")


class MxGroups:
    """The MX parts of the fused lowering (module docstring): a mixin of its operand loads
    (:class:`~.fused_operands.OperandLoads`), whose state (``FusedState``) it reads."""

    mx: bool
    mx_padded: bool
    mx_scale_hbm: dict[str, Buffer]
    mx_scale_buffers: dict[str, Buffer]
    #: weight block name -> (its hoisted scale buffer, the contraction's Dim, the K-block loop's index)
    mx_hoisted: dict[str, tuple[Buffer, Dim, Expr]]
    mx_true_tokens: int

    def mx_init(self, tokens: int) -> int:
        """Set up MX for a kernel over ``tokens``; return the token count the program computes (``tokens`` rounded up
        to even in an MX kernel, so that every row-major MX stationary is even: module docstring)."""
        self.mx = is_mx_graph(self.g)
        self.mx_scale_hbm, self.mx_scale_buffers, self.mx_hoisted = {}, {}, {}
        self.mx_true_tokens = tokens
        self.mx_padded = self.mx and tokens % 2 == 1
        return tokens + 1 if self.mx_padded else tokens

    def mx_even(self, s: FusedSchedule) -> FusedSchedule:
        """The normalized schedule ``s`` with an even token tile and block in an MX kernel (module docstring), else
        ``s``."""
        if not self.mx:
            return s
        tile = s.token_tile + s.token_tile % 2
        block = max(s.tokens_per_block + s.tokens_per_block % 2, tile)
        return replace(s, token_tile=tile, tokens_per_block=block // tile * tile)

    def mx_arguments(self, inputs: list[Node], hbm: dict[str, Buffer]) -> None:
        """The scale argument of every MX input (``<name>_scale`` [16, K/512, N] uint8: ir/mx.py, "Storage")."""
        for node in inputs:
            if is_mx(node.dtype):
                rows, cols = node.shape
                self.mx_scale_hbm[node.id] = Buffer(scale_name(hbm[node.id].name), (16, rows // 128, cols), "uint8",
                                                    "hbm")

    def mx_params(self, params: list[Buffer]) -> list[Buffer]:
        """The kernel's parameters with each MX input's scale argument right after it."""
        scales = {self.hbm[i].name: b for i, b in self.mx_scale_hbm.items()}
        return [p for param in params for p in (param, *([scales[param.name]] if param.name in scales else []))]

    def mx_scale_buffer(self, buf: Buffer) -> Buffer:
        """The scale buffer of the MX buffer ``buf``: its shape, uint8, same memory."""
        found = self.mx_scale_buffers.get(buf.name)
        if found is None:
            found = self.mx_scale_buffers[buf.name] = Buffer(f"{buf.name}_scale", buf.shape, "uint8", buf.memory,
                                                             buf.entries)
        return found

    def mx_weight_scales(self, w: Node, buf: Buffer, slot0: Expr, tile0: Expr, tiles: Expr, col0: Expr,
                         cols: Expr) -> list[Stmt]:
        """Allocate the scale buffer of the weight block ``buf`` (when ``w`` is an MX weight) and load the scales of
        its K tiles ``tile0 .. tile0 + tiles`` (into slots ``slot0 ..``) and columns ``col0 .. col0 + cols``: one DMA
        per SBUF quadrant (module docstring). Nothing for another weight."""
        if not is_mx(w.dtype):
            return []
        return self._mx_scale_loads(w, self.mx_scale_buffer(buf), slot0, tile0, tiles, col0, cols)

    def _mx_scale_loads(self, w: Node, sbuf: Buffer, slot0: Expr, tile0: Expr, tiles: Expr, col0: Expr,
                        cols: Expr, what: str = "") -> list[Stmt]:
        """Allocate ``sbuf`` and load ``w``'s scales of K tiles ``tile0 ..`` (slots ``slot0 ..``), columns ``col0 ..``
        into the first 4 partitions of each quadrant, one DMA per quadrant."""
        q = iv("q", 4)
        dma = DmaCopy(Ref(sbuf, (span(scale(q, QUADRANT), SCALES_PER_QUADRANT), span(slot0, tiles), span(0, cols))),
                      Ref(self.mx_scale_hbm[w.id], (span(scale(q, SCALES_PER_QUADRANT), SCALES_PER_QUADRANT),
                                                    span(tile0, tiles), span(col0, cols))))
        return [Alloc(sbuf, comment=f"{w.attrs['name']} scales{what}: groups of 8 partitions x 4, in the first 4 "
                                    "partitions of each quadrant"),
                *loop("q", Lin(4), 4, [dma], comment="one DMA per SBUF quadrant")]

    def mx_hoists(self, w: Node) -> bool:
        """Whether the scales of ``w`` streamed in K blocks are loaded once per column block (``mx_scales=hoisted``,
        an MX weight), not with each K block."""
        return self.s.mx_scales == "hoisted" and is_mx(w.dtype)

    def mx_hoisted_scales(self, w: Node, buf: Buffer, kdim: Dim, kblk: Expr, fdim: Dim, blk: Expr) -> list[Stmt]:
        """For a K-block loop over ``kblk`` streaming ``w``'s weight block ``buf`` (column block ``blk`` of
        ``fdim``): the statements placed before that loop that allocate a scale buffer of every K tile of the column
        block and load it, one DMA per quadrant over all K tiles (module docstring, "Hoisted scales"); the MX
        matmuls reading ``buf`` then read it at the global K tile (:meth:`mx_matmuls`). Nothing unless
        :meth:`mx_hoists`."""
        if not self.mx_hoists(w):
            return []
        sbuf = Buffer(f"{w.attrs['name']}_scales_hoisted", (kdim.tile, kdim.tiles, fdim.block_elems), "uint8", "sbuf")
        self.mx_hoisted[buf.name] = (sbuf, kdim, kblk)
        return self._mx_scale_loads(w, sbuf, Lin(0), Lin(0), Lin(kdim.tiles), fdim.block_start(blk),
                                    fdim.block_size(blk), f" of all {kdim.tiles} K tiles, before the K blocks")

    def mx_tokens(self, start: Expr, size: Expr) -> Expr:
        """The tokens of ``size`` from ``start`` that exist in HBM: ``size`` clipped at the true token count of a
        padded MX kernel (module docstring)."""
        return minimum(size, sub(Lin(self.mx_true_tokens), start)) if self.mx_padded else size

    def mx_zeroed(self, region: Ref) -> list[Stmt]:
        """A padded MX kernel's load target zeroed before its tokens are loaded, so that the pad token's column holds
        zeros (its outputs are never stored); nothing otherwise."""
        return [Memset(region, 0.0)] if self.mx_padded else []

    def mx_quantize_group(self, group: Group, mb: Expr) -> list[Stmt]:
        """A ``quantize_mx`` group for token block ``mb``: the value's bf16 strip interleaved per 512-position tile and
        quantized into the MX strip and its scales (module docstring)."""
        root = group.root
        value = self.nodes[root.operands[0]]
        source = self.strips.get(value.id)
        pmax = self.target.pmax
        tiles = root.shape[1] // pmax  # 512-position tiles
        strip = self._strip(root.id, root.shape[1])
        scales = self.mx_scale_buffer(strip)
        bm = self.tok.block_size(mb)
        kq = iv("kq", tiles)
        staged = Buffer(f"{root.id}_interleaved", (pmax, self.s.tokens_per_block, MX_PACK), "bfloat16", "sbuf")
        body: list[Stmt] = [Alloc(staged, comment="4 elements 128 apart on the contraction, innermost")]
        if self.mx_loads_itself(value):  # straight from HBM by DMA (x_transpose=dma)
            t0 = self.tok.block_start(mb)
            real = self.mx_tokens(t0, bm)
            body += self.mx_zeroed(Ref(staged, (span(0, pmax), span(0, bm), span(0, MX_PACK))))
            body.append(InterleavedLoad(Ref(staged, (span(0, pmax), span(0, real), span(0, MX_PACK))),
                                        Ref(self.hbm[value.id], (span(t0, real), span(scale(kq, MX_TILE), MX_TILE)))))
        else:
            body.append(Interleave(Ref(staged, (span(0, pmax), span(0, bm), span(0, MX_PACK))),
                                   Ref(source, (span(0, pmax), span(scale(kq, MX_PACK), MX_PACK), span(0, bm)))))
        body.append(QuantizeMx(Ref(strip, (span(0, pmax), Point(kq), span(0, bm))),
                               Ref(staged, (span(0, pmax), span(0, bm), span(0, MX_PACK))),
                               Ref(scales, (span(0, pmax), Point(kq), span(0, bm)))))
        split = (self.s.lnc_split,) if root.id in self.halved else ()
        what = " (this program's half)" if split else ""
        return [Alloc(strip, comment=f"{root.id}^T: {value.id} in {root.dtype}{what}, kept in SBUF"), Alloc(scales),
                *loop("kq", Lin(tiles), tiles, body, comment=f"quantize_mx of {value.id}, 512 positions per tile",
                      split=split)]

    def mx_loads_itself(self, node: Node) -> bool:
        """Whether the row-major input ``node`` is loaded by the quantize_mx groups that read it, straight into their
        interleaved tiles by DMA (``x_transpose=dma`` in an MX kernel: :class:`~..kernel_ir.mx.InterleavedLoad`), so
        no strip of it is loaded."""
        users = self._users(node.id) if self.mx else []
        return (self.s.x_transpose == "dma" and node.kind == NodeKind.INPUT and node.layout == Layout.ROW_MAJOR
                and bool(users) and all(u.attrs.get("op") == ElementwiseOp.QUANTIZE_MX for u in users))

    def mx_halved(self, halved: set[str]) -> set[str]:
        """The values a halved ``quantize_mx`` reads where nothing else reads them (the h of an MX MLP under
        ``lnc_split=intermediate``): halved too, each program computing the half it quantizes."""
        out: set[str] = set()
        for value_id in halved:
            node = self.nodes[value_id]
            if node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.QUANTIZE_MX:
                source = self.nodes[node.operands[0]]
                if source.kind != NodeKind.INPUT and self.g.users(source.id) == [value_id]:
                    out.add(source.id)
        return out

    def mx_matmuls(self, body: list[Stmt]) -> list[Stmt]:
        """``body`` with every matmul of two MX tiles an :class:`MatmulMx` reading their scale tiles."""
        out: list[Stmt] = []
        for stmt in body:
            if isinstance(stmt, Loop):
                stmt = replace(stmt, body=self.mx_matmuls(stmt.body))
            elif isinstance(stmt, Matmul) and not isinstance(stmt, MatmulMx) and is_mx(stmt.stationary.buffer.dtype):
                st, mv = stmt.stationary, stmt.moving
                stmt = MatmulMx(stmt.dst, st, mv, overwrite=stmt.overwrite, tile=stmt.tile,
                                stationary_scale=self._mx_scale_tile(st), moving_scale=self._mx_scale_tile(mv))
            out.append(stmt)
        return out

    def _mx_scale_tile(self, operand: Ref) -> Ref:
        """The scale tile of an MX matmul operand: the same index of its buffer's scale buffer, or, for a weight block
        whose scales are hoisted, the hoisted buffer at the global K tile of the operand's K tile in its block."""
        hoisted = self.mx_hoisted.get(operand.buffer.name)
        if hoisted is None:
            return Ref(self.mx_scale_buffer(operand.buffer), operand.index, operand.entry)
        sbuf, kdim, kblk = hoisted
        rows, kt, cols = operand.index
        if not isinstance(kt, Point):
            raise ValueError(f"{operand.buffer.name}: an MX operand reads one K tile of its block")
        return Ref(sbuf, (rows, Point(kdim.tile_index(kblk, kt.index)), cols))

"""Per-token FP8 activation scales computed in the kernel (``--act-scale row``; docs/quantization.md, "Per-token
activation
scales").

Part of the fused lowering (:mod:`.lower_fused`). The quantized graph scales every value ``v`` an FP8 matmul reads by
``row_scale(v)``: each token's ``max(max|v[t, :]| / max, 1e-6)`` (``ir/fp8.py``), nki-library's dynamic
``QuantizationType.ROW``. nmmc holds ``v`` transposed (features on partitions, tokens along the free axis), so a
token's absolute maximum is a reduction across partitions and feature tiles. A ``row_scale`` group, lowered here after
the group that computes ``v`` and before the quantization that reads it, makes each token's scale once per token
block, in fp32, as the graph's ``row_scale`` computes it:

1. the *partial maxima*: one per token and part of the features, each a ``tensor_scalar_reduce(op0=nl.abs,
   reduce_op=nl.maximum)`` over a row tile with the token on a partition. Where the rows exist anyway they are reduced
   where they are made (:meth:`RowScales.row_parts_from_rows`): ``x``'s row tile before its TensorE transposes
   (``x_transpose=pe``), each output tile of a group computed with the activations stationary
   (:mod:`.fused_stationary`) before its transpose into the strip, as nki-library reduces the row-major intermediate
   (aws-neuron/nki-library@d2ad3a579498d1888aa8740af97fd325dd5f2740,
   src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte_quantization.py, ``perform_intermediate_row_quantization``) and the
   normalized rows (``core/rmsnorm/rmsnorm_quant.py``, ``_row_quantize_tile``). Otherwise from the strip: TensorE
   transposes of its feature tiles side by side into one PSUM bank per chunk, each chunk reduced where it lands (the
   partition reduction the NKI ISA reference gives for ``nki.isa.tensor_reduce``: "invoke a nisa.nc_transpose
   instruction on the input tile and then this nisa.tensor_reduce on the transposed tile");
2. the token's maximum over its parts (``tensor_reduce(op=nl.maximum, axis=1)``, when there are several), and the
   scale ``max(amax / max, 1e-6)`` in one ``tensor_scalar`` (divide, maximum): the graph's fp32 division and floor,
   so the kernel's scale is bit-equal to ``ir.fp8.row_scale`` of the value it reduces;
3. the scale in the two layouts its readers need: a column per token tile (``<rs>_cols``, tokens on partitions:
   the per-partition ``scale=`` / ``tensor_scalar`` operand of a row-major eviction, the down projection's) and, where
   a reader holds tokens along the free axis (the quantization of the strip, the gate/up evictions of weights
   stationary), a row of the block's tokens on every partition (``<rs>_bcast``): the column times a tile of ones
   (``tensor_scalar``), transposed on the TensorEngine (exact: an fp32 transpose moves bits) and copied out.

Readers use it through :meth:`RowScales._fp8_op`: quantizing ``v`` divides by the broadcast row (``tensor_tensor``
divide, the graph's fp32 quotient) and clamps (one ``tensor_scalar``); a dequantization with tokens along the free
axis multiplies by it (``tensor_tensor``) and by the weight scale column (``tensor_scalar``); with tokens on
partitions the column is an ordinary per-partition operand (:class:`~.fused_epilogue.Epilogues`).

The strip of a value only row scales and quantizations read is held in fp32 (:meth:`~.fused_operands.OperandLoads.
_strip`), as h is never rounded to bf16 before its FP8 rounding in the static path. The interpreter gives each row
scale the unit of the tile its maxima are reduced into (rule NMMC-FP8-SCALE-ONCE, ``interpreter/scale_units.py``).
"""

from __future__ import annotations

from ..ir import Node
from ..ir.fp8 import FP8_FORMATS, ROW_SCALE_FLOOR
from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Expr, Lin, add, scale, var
from ..kernel_ir.lnc import PROGRAM_ID, divisible_blocking
from ..kernel_ir.program import (
    Activation,
    Alloc,
    Buffer,
    Comment,
    Copy,
    Memset,
    PeTranspose,
    Point,
    Ref,
    SendRecv,
    Stmt,
    TensorReduce,
    TensorScalar,
    TensorScalarReduce,
    TensorTensor,
    span,
)
from ..vocab import ElementwiseOp, NodeKind, Orient
from .fused_epilogue import Epilogues
from .fused_groups import Group


def _own_half(fdim: Dim) -> tuple[int, int] | None:
    """(stride, tiles) of the tiles a program of two computes when they divide ``fdim``'s blocks or shares: tiles
    ``stride * pid`` onwards (None when its blocks do not halve into whole tiles)."""
    if fdim.share_tiles:
        return fdim.share_step or fdim.share_tiles, fdim.share_tiles
    if fdim.blocks % 2 or fdim.tiles % fdim.tiles_in_block or fdim.size % fdim.tile:
        return None
    return fdim.tiles // 2, fdim.tiles // 2


def is_row_scale(node: Node) -> bool:
    """True for a ``row_scale`` node (a value's per-token FP8 scale, computed on chip)."""
    return node.kind == NodeKind.ELEMENTWISE and node.attrs.get("op") == ElementwiseOp.ROW_SCALE


class RowScales(Epilogues):
    """The ``row_scale`` groups of a fused kernel and how the other groups read their scales (module docstring)."""

    row_scales: dict[str, Node]  # row_scale node id -> node (set by the lowering)

    def _init_row_scales(self, compute: list[Node]) -> None:
        self.row_scales = {n.id: n for n in compute if is_row_scale(n)}
        self.row_parts: dict[str, Buffer] = {}  # value id -> its partial maxima [token_tile, token tiles, parts]
        self.scale_cols: dict[str, Buffer] = {}  # row_scale id -> [token_tile, token tiles] (tokens on partitions)
        self.scale_rows: dict[str, Buffer] = {}  # row_scale id -> [pmax, tokens_per_block] (tokens on the free axis)
        self.row_ones: Buffer | None = None
        self.row_halved: dict[str, tuple[int, int]] = {}  # value id -> (stride, tiles) of a program's half

    # --- which reader needs which layout ------------------------------------------------------------------------
    def _row_scale_of(self, value_id: str) -> Node | None:
        """The row_scale computed from ``value_id``, if any."""
        return next((u for u in self._users(value_id) if is_row_scale(u)), None)

    def _is_scale_operand(self, node_id: str) -> bool:
        """A scale a group reads: a scale input or a row scale computed in the kernel (never a strip)."""
        return node_id in self.scales or node_id in self.row_scales

    def _row_scaled(self, group: Group) -> bool:
        """Whether every FP8 op of ``group`` scales its activations per token: its dequantizations read row scales
        and it holds no quantization (a row-scaled quantization is a group of its own, after the row scale)."""
        fp8 = [n for n in group.tree if ElementwiseOp(n.attrs["op"]).scaled]
        return bool(fp8) and all(ElementwiseOp(n.attrs["op"]) == ElementwiseOp.DEQUANTIZE and
                                 n.operands[1] in self.row_scales for n in fp8)

    def _tokens_free(self, group: Group) -> bool:
        """Whether ``group`` holds its tokens along the free axis: a transposed group computed weights stationary."""
        return group.orient == Orient.TRANSPOSED and not self._token_stationary(group)

    def _needs_row(self, rs: Node) -> bool:
        """Whether a reader of row scale ``rs`` holds its tokens along the free axis (it then reads ``<rs>_bcast``)."""
        readers = {u.id for u in self._users(rs.id)}
        return any(self._tokens_free(g) for g in self.group_list if readers & {n.id for n in g.tree})

    # --- constants ------------------------------------------------------------------------------------------
    def row_scale_constants(self) -> list[Stmt]:
        """Before the token loop: the tile of ones a scale column is broadcast with (only where some reader needs the
        broadcast row)."""
        if not any(self._needs_row(rs) for rs in self.row_scales.values()):
            return []
        ones = self.row_ones = Buffer("row_scale_ones", (self.tok.tile, self.target.pmax), "float32", "sbuf")
        return [Alloc(ones, comment="ones: a token's scale times them is its row, transposed into a broadcast row"),
                Memset(Ref(ones, (span(0, ones.shape[0]), span(0, ones.shape[1]))), 1.0)]

    # --- partial maxima where the rows are made -------------------------------------------------------------------
    def alloc_row_parts(self, value: Node, parts: int) -> list[Stmt]:
        """The allocation of ``value``'s partial maxima, ``parts`` per token, when a row scale reads it and its
        producer reduces its rows (:meth:`row_parts_from_rows`); nothing otherwise."""
        rs = self._row_scale_of(value.id)
        if rs is None:
            return []
        buf = self.row_parts[value.id] = Buffer(f"{rs.id}_parts", (self.tok.tile, self.tok.tiles_in_block, parts),
                                                "float32", "sbuf")
        return [Alloc(buf, comment=f"{rs.id}: each token's absolute maximum over {parts} part(s) of {value.id}")]

    def row_parts_from_rows(self, value: Node, rows: Ref, part: Expr, tt: Expr) -> list[Stmt]:
        """The absolute maximum of each token of a row tile of ``value`` (tokens on partitions) into part ``part`` of
        token tile ``tt``: one ``tensor_scalar_reduce`` (nothing when no row scale reads ``value``)."""
        parts, rs = self.row_parts.get(value.id), self._row_scale_of(value.id)
        if parts is None or rs is None:
            return []
        tsz, width = rows.shape
        scratch = Buffer(f"{rs.id}_abs", (self.tok.tile, rows.buffer.shape[-1]), "float32", "sbuf")
        return [Alloc(scratch),
                TensorScalarReduce(Ref(scratch, (span(0, tsz), span(0, width))), rows,
                                   Ref(parts, (span(0, tsz), Point(tt), span(part, 1))))]

    # --- the row_scale group ------------------------------------------------------------------------------------
    def row_scale_group(self, group: Group, mb: Expr) -> list[Stmt]:
        """Token block ``mb``'s scales of row scale ``group.root``: its column per token tile, and its broadcast row
        where a reader needs one (module docstring)."""
        rs, tok, pmax = group.root, self.tok, self.target.pmax
        (value,) = group.operands
        fmax = FP8_FORMATS[rs.attrs["dtype"]].max
        cols = self.scale_cols[rs.id] = Buffer(f"{rs.id}_cols", (tok.tile, tok.tiles_in_block), "float32", "sbuf")
        out: list[Stmt] = [Comment(f"{rs.id} = max(max|{value.id}[t, :]| / {fmax!r}, {ROW_SCALE_FLOOR!r}) per token "
                                   "(fp32, as the graph's row_scale)"),
                           Alloc(cols, comment=f"{rs.id}: one column per token tile, tokens on partitions")]
        row = None
        if self._needs_row(rs):
            row = self.scale_rows[rs.id] = Buffer(f"{rs.id}_bcast", (pmax, self.s.tokens_per_block), "float32", "sbuf")
            out.append(Alloc(row, comment=f"{rs.id} of every token of the block, on every partition"))
        tt = iv("tt", tok.tiles_in_block)
        tsz = tok.tile_size(tok.tile_index(mb, tt))
        produced = self.row_parts.get(value.id)
        if produced is not None:
            body: list[Stmt] = []
            count = produced.shape[2]
            parts = Ref(produced, (span(0, tsz), Point(tt), span(0, count)))
        else:
            body, parts, count = self._parts_from_strip(rs, value, tt, tsz)
        source = parts
        if count > 1:
            amax = Buffer(f"{rs.id}_amax", (tok.tile, 1), "float32", "sbuf")
            source = Ref(amax, (span(0, tsz), span(0, 1)))
            body += [Alloc(amax), TensorReduce(source, parts)]
        if value.id in self.row_halved:  # this program reduced its half of the features: the other's maxima
            other = Buffer(f"{rs.id}_other", (tok.tile, 1), "float32", "sbuf")
            whole = Buffer(f"{rs.id}_both", (tok.tile, 1), "float32", "sbuf")
            theirs, both = Ref(other, (span(0, tsz), span(0, 1))), Ref(whole, (span(0, tsz), span(0, 1)))
            body += [Comment(f"exchange the maxima over this program's half of {value.id} (not its fp32 strip)"),
                     Alloc(other), SendRecv(theirs, source), Alloc(whole),
                     TensorTensor(both, source, theirs, "maximum")]
            source = both
        column = Ref(cols, (span(0, tsz), span(tt, 1)))
        body.append(TensorScalar(column, source, "divide", fmax, "maximum", ROW_SCALE_FLOOR))
        if row is not None:
            body += self._broadcast_row(rs, column, row, tt, tsz)
        return out + loop("tt", tok.tiles_in(mb), tok.tiles_in_block, body)

    def _parts_from_strip(self, rs: Node, value: Node, tt: Expr, tsz: Expr) -> tuple[list[Stmt], Ref, int]:
        """(statements, parts, count): the partial maxima of token tile ``tt`` from ``value``'s strip: its feature
        tiles transposed side by side into one PSUM bank per chunk, each chunk's absolute maximum per token."""
        strip, tok, pmax = self.strips[value.id], self.tok, self.target.pmax
        n = value.shape[1]
        ftile = min(pmax, n)
        per_chunk = max(1, self.target.psum_bank_bytes // (strip.itemsize * ftile))
        stride, tiles = self.row_halved.get(value.id, (0, -(-n // ftile)))  # a program's own tiles: its half
        size = n if not stride else tiles * ftile
        fdim = Dim("f", size, ftile, tiles, min(per_chunk, tiles))
        parts = Buffer(f"{rs.id}_parts", (tok.tile, fdim.blocks), "float32", "sbuf")
        fb, ft = iv("c_blk", fdim.blocks), iv("ft", fdim.tiles_in_block)
        g = fdim.tile_index(fb, ft)
        ksz, width = fdim.tile_size(g), fdim.block_size(fb)
        g = add(g, scale(var(PROGRAM_ID), stride)) if stride else g
        tp = Buffer(f"{rs.id}_tpsum", (tok.tile, fdim.block_elems), strip.dtype, "psum")
        scratch = Buffer(f"{rs.id}_abs", (tok.tile, fdim.block_elems), "float32", "sbuf")
        transpose = PeTranspose(Ref(tp, (span(0, tsz), span(scale(ft, ftile), ksz))),
                                Ref(strip, (span(0, ksz), Point(g), span(scale(tt, tok.tile), tsz))))
        chunk: list[Stmt] = [
            Alloc(tp), *loop("ft", fdim.tiles_in(fb), fdim.tiles_in_block, [transpose]),
            Alloc(scratch),
            TensorScalarReduce(Ref(scratch, (span(0, tsz), span(0, width))), Ref(tp, (span(0, tsz), span(0, width))),
                               Ref(parts, (span(0, tsz), span(fb, 1)))),
        ]
        note = (f"{value.id}^T transposed back {fdim.tiles_in_block} tile(s) at a time (tokens on partitions), each "
                "chunk's absolute maximum per token")
        body: list[Stmt] = [Alloc(parts, comment=note),
                            *loop("c_blk", Lin(fdim.blocks), fdim.blocks, chunk)]
        return body, Ref(parts, (span(0, tsz), span(0, fdim.blocks))), fdim.blocks

    def _broadcast_row(self, rs: Node, column: Ref, row: Buffer, tt: Expr, tsz: Expr) -> list[Stmt]:
        """Token tile ``tt``'s scales (``column``) into the broadcast row: the column times a tile of ones, so each
        token's row holds its scale, transposed on the TensorEngine and copied into the row's columns of the tile."""
        assert self.row_ones is not None
        tok, pmax = self.tok, self.target.pmax
        expand = Buffer(f"{rs.id}_expand", (tok.tile, pmax), "float32", "sbuf")
        tp = Buffer(f"{rs.id}_bpsum", (pmax, tok.tile), "float32", "psum")
        wide = Ref(expand, (span(0, tsz), span(0, pmax)))
        return [Alloc(expand), TensorScalar(wide, Ref(self.row_ones, (span(0, tsz), span(0, pmax))), "multiply",
                                            column),
                Alloc(tp), PeTranspose(Ref(tp, (span(0, pmax), span(0, tsz))), wide),
                Copy(Ref(row, (span(0, pmax), span(scale(tt, tok.tile), tsz))), Ref(tp, (span(0, pmax), span(0, tsz))))]

    def row_half(self, root: Node, fdim: Dim) -> bool:
        """Whether ``root``, a strip the programs of a logical core divide (each computes its ``fdim`` half), stays
        halved instead of being exchanged: when only a row scale and the quantization by it read it, and that
        quantization divides the features the same way, each program reduces its half, the programs exchange the
        maxima (a column per token tile) and each quantizes its half, whose FP8 strip is then exchanged as a static
        quantization's is. Records (stride, tiles) of a program's half (:data:`row_halved`)."""
        users = self._users(root.id)
        rs = [u for u in users if is_row_scale(u)]
        quant = [u for u in users if u.kind == NodeKind.ELEMENTWISE and u.attrs["op"] == ElementwiseOp.QUANTIZE]
        if len(users) != 2 or len(rs) != 1 or len(quant) != 1 or quant[0].operands[1] != rs[0].id:
            return False
        group = next((g for g in self.group_list if g.root is quant[0]), None)
        if group is None or group.matmuls or group.orient != Orient.TRANSPOSED or not self._divides_features(group):
            return False
        own = _own_half(fdim)
        n = root.shape[1]
        ntiles, ftile = fdim.tiles, fdim.tile  # the quantization's feature tiles: as transposed_group blocks them
        qshares = self._shares(group, n, ftile, ntiles, ntiles)
        share_tiles, share_step = Dim.overlapping_shares(ntiles, qshares) if qshares else (0, 0)
        per_block = share_tiles or divisible_blocking(ntiles, ntiles, self.target.lnc)
        qdim = Dim("f", n, ftile, ntiles, per_block, share_tiles=share_tiles,
                   share_step=0 if share_step == share_tiles else share_step)
        if own is None or _own_half(qdim) != own or not self._divided(group, qdim, False, False):
            return False
        self.row_halved[root.id] = own
        return True

    # --- readers -----------------------------------------------------------------------------------------------
    def row_scale_refs(self, group: Group, parts: Expr, tokens: Expr, tt: Expr) -> dict[str, Ref]:
        """The row scales ``group`` reads, for an output tile of ``parts`` partitions: the broadcast row over the
        block's ``tokens`` where the group holds tokens along the free axis, else token tile ``tt``'s column."""
        out: dict[str, Ref] = {}
        free = self._tokens_free(group)
        for op in group.operands:
            if op.id not in self.row_scales:
                continue
            if free:
                out[op.id] = Ref(self.scale_rows[op.id], (span(0, parts), span(0, tokens)))
            else:
                out[op.id] = Ref(self.scale_cols[op.id], (span(0, parts), span(tt, 1)))
        return out

    def _fp8_op(self, node: Node, op: ElementwiseOp, dst: Ref, ops: list[Ref], scratch: Ref) -> list[Stmt]:
        """A quantization or dequantization by a row scale's broadcast row (tokens along the free axis): the scale is
        then a tile, not a per-partition column, so its division or product is a ``tensor_tensor``, and the clamp or
        the weight scale a ``tensor_scalar``. Anything else as :meth:`Epilogues._fp8_op`."""
        rs = self.row_scales.get(node.operands[1])
        if rs is None or ops[1].buffer is not self.scale_rows.get(rs.id):
            return super()._fp8_op(node, op, dst, ops, scratch)
        if op == ElementwiseOp.QUANTIZE:
            fmax = FP8_FORMATS[node.attrs["dtype"]].max
            return [TensorTensor(scratch, ops[0], ops[1], "divide"),
                    TensorScalar(dst, scratch, "minimum", fmax, "maximum", -fmax)]
        acc, x_scale, w_scale = ops
        return [TensorTensor(scratch, acc, x_scale, ElementwiseOp.MULTIPLY),
                Activation(dst, scratch, "copy", scale=w_scale)]

    def _prefold(self, node: Node, values: dict[str, Ref], dst: Ref) -> tuple[list[Stmt], tuple[Ref, Ref]] | None:
        """A dequantization by a row scale read only by a ScalarE function (``silu(gate)``): one scale applied on the
        VectorEngine into ``dst``, the other by the function's ``scale=`` (one instruction fewer than a product and
        the function). Tokens along the free axis: ``acc * row`` (``tensor_tensor``), then the weight scale column;
        on partitions: ``acc * weight scales`` (their broadcast rows: ``tensor_tensor``; a [1, 1] scale's column:
        ``tensor_scalar``), then the token's column."""
        if ElementwiseOp.lookup(node.attrs.get("op")) != ElementwiseOp.DEQUANTIZE or node.operands[1] not in \
                self.row_scales:
            return None
        users = self._users(node.id)
        op = ElementwiseOp.lookup(users[0].attrs.get("op")) if len(users) == 1 else None
        if op is None or not op.unary or op.fp8:
            return None
        acc, x_scale, w_scale = (values[o] for o in node.operands)
        if x_scale.buffer is self.scale_rows.get(node.operands[1]):
            return [TensorTensor(dst, acc, x_scale, ElementwiseOp.MULTIPLY)], (dst, w_scale)
        if w_scale.buffer.name.endswith("_col"):
            return [TensorScalar(dst, acc, "multiply", w_scale)], (dst, x_scale)
        return [TensorTensor(dst, acc, w_scale, ElementwiseOp.MULTIPLY)], (dst, x_scale)

    def stationary_scale_refs(self, group: Group, tsz: Expr, at: Expr, width: Expr, tt: Expr) -> dict[str, Ref]:
        """The scales a group computed with the activations stationary reads (tokens on partitions): a per-channel
        weight scale as its broadcast rows of ``width`` channels from channel ``at``, a [1, 1] one as its column, a
        row scale as token tile ``tt``'s column."""
        out: dict[str, Ref] = {}
        for op in group.operands:
            if op.id in self.row_scales:
                out[op.id] = Ref(self.scale_cols[op.id], (span(0, tsz), span(tt, 1)))
            elif op.id in self.scales and op.shape[0] == 1:
                out[op.id] = Ref(self.scale_bufs[(op.id, "col")], (span(0, tsz), span(0, 1)))
            elif op.id in self.scales:
                out[op.id] = Ref(self.scale_bufs[(op.id, "row")], (span(0, tsz), span(at, width)))
        return out

    def _stationary_reader(self, scale_id: str) -> bool:
        """Whether a group computed with the activations stationary reads scale input ``scale_id`` (its per-channel
        scales are then loaded as rows too)."""
        return any(self._token_stationary(g) for g in self.group_list if any(op.id == scale_id for op in g.operands))

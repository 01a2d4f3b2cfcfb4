"""A value held transposed, computed with the activations stationary (schedule ``stationary=tokens``).

Part of the fused lowering (:mod:`.lower_fused`). A group held transposed (its strip is a later matmul's operand,
e.g. gate and up of an MLP) is normally computed with each 128-feature weight tile stationary and the block's tokens
moving: one matmul per feature tile and contraction tile, each accumulating a [128, tokens] PSUM tile. For a few
tokens that is many short matmuls, and each feature tile holds its own accumulator. With ``stationary=tokens`` the
roles swap, as nki-library's decode MLP computes gate and up (aws-neuron/nki-library@d2ad3a57:
src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py): the strip slice of a token tile is stationary
and ``out_tile`` (up to 512) weight columns move, accumulating a [tokens, out_tile] tile in one PSUM bank; the
group's epilogue is evaluated on those rows, and the row is transposed back into the strip on the TensorEngine,
128 features at a time (a matmul with an identity: the same ``PeTranspose`` as ``x_transpose=pe``). The weight
blocks, their loads and the strip are the transposed form's; only the matmuls and the eviction differ, so the
cost model and the interpreter see the form through the program as they see any other.
"""

from __future__ import annotations

from ..kernel_ir.dims import Dim, balanced_block, iv, loop
from ..kernel_ir.expr import Expr, Lin, scale
from ..kernel_ir.program import Alloc, Buffer, Comment, Copy, Matmul, PeTranspose, Point, Ref, Stmt, span
from ..schedule.fused import tiles_per_weight_block
from .fused_groups import Group
from .fused_operands import OperandLoads
from .limits import constant_name, k_blocked_group_banks, psum_bank_fp32

#: How a group in this form is computed, as the kernel's comments say it.
TOKEN_STATIONARY = "activations stationary, weights moving, each row transposed into the strip on the TensorEngine"


class TokenStationaryGroups(OperandLoads):
    """The token-stationary form of a group held transposed."""

    def token_stationary_group(self, group: Group, mb: Expr, kb: int = 0) -> list[Stmt]:
        """The statements computing ``group`` for token block ``mb`` into its strip, activations stationary; ``kb``:
        contraction tiles per weight block when the contraction is blocked (0: not), which needs one token tile per
        block."""
        s, tok, root = self.s, self.tok, group.root
        n = root.shape[1]
        pmax = self.target.pmax
        tile_n = min(s.out_tile, n)
        if tile_n < n and tile_n % pmax:  # whole strip tiles per output tile: each is transposed into its own
            tile_n = min(n, max(pmax, tile_n - tile_n % pmax))
        ntiles = -(-n // tile_n)
        kb = kb if tok.tiles_in_block == 1 else 0
        if kb:  # each output tile's accumulators live across the K blocks: a PSUM bank per term and tile
            per_block = max(1, min(tiles_per_weight_block(s, kb, tile_n, self._weight_bytes(group), ntiles),
                                   k_blocked_group_banks(self.target) // len(group.terms)))
        else:
            per_block = self._tiles_per_block(group, tile_n, ntiles)
        odim = Dim("o", n, tile_n, ntiles, balanced_block(ntiles, per_block),
                   block_name=constant_name(root.id, "BLOCK"))
        chunk = min(pmax, n)  # features per strip tile (the strip's partitions)
        cdim = Dim("c", n, chunk, -(-n // chunk), -(-tile_n // chunk))  # tile_n is n or a multiple of chunk
        strip = self._strip(root.id, n)
        ob = iv("o_blk", odim.blocks)
        tt = iv("tt", tok.tiles_in_block)
        tsz = tok.tile_size(tok.tile_index(mb, tt))
        bn = iv("bn", odim.tiles_in_block)
        g = odim.tile_index(ob, bn)
        nsz = odim.tile_size(g)
        parts = self.alloc_row_parts(root, odim.tiles)
        rows = Buffer(f"{root.id}_rows", (tok.tile, tile_n), strip.dtype, "sbuf")
        result = Ref(rows, (span(0, tsz), span(0, nsz)))
        per_tile: list[Stmt] = [Alloc(rows, comment=f"one output tile of {root.id}, tokens on partitions")]
        if kb:
            values, loads = self._k_blocked_rows_of(group, odim, ob, bn, nsz, tsz, kb)
        else:
            loads, sources = self._weight_sources(group, odim, ob)
            matmuls, values = self._term_tiles(group, sources, odim, g, scale(bn, tile_n), nsz, tt, tsz,
                                               row_major=True, result=result)
            per_tile += matmuls
        values.update(self.stationary_scale_refs(group, tsz, odim.tile_start(g), nsz, tt))
        per_tile += self._evaluated(group, values, result, (tok.tile, tile_n), (tsz, nsz))
        per_tile += self.row_parts_from_rows(root, result, g, tt)  # a per-token FP8 scale's maxima (row_scales.py)
        per_tile += self._transpose_into_strip(rows, strip, cdim, g, tt, tsz)
        how = f"; {TOKEN_STATIONARY}" if group.tree else ""  # a group without an epilogue says it in its description
        body = loads + loop("tt", tok.tiles_in(mb), tok.tiles_in_block,
                            loop("bn", odim.tiles_in(ob), odim.tiles_in_block, per_tile))
        return [Alloc(strip, comment=f"{root.id}^T strip of this token block, kept in SBUF"),
                *parts,
                Comment(f"{self._describe_group(group)}{how}; {tile_n} weight columns per matmul"
                        + (f", weight rows in blocks of {kb} K tiles" if kb else "")),
                *loop("o_blk", Lin(odim.blocks), odim.blocks, body)]

    def _transpose_into_strip(self, rows: Buffer, strip: Buffer, cdim: Dim, g: Expr, tt: Expr,
                              tsz: Expr) -> list[Stmt]:
        """The row of output tile ``g`` transposed into the strip, one strip tile (``cdim.tile`` features) at a
        time: a TensorE transpose into PSUM, copied into the strip's columns of token tile ``tt``."""
        tok = self.tok
        ct = iv("ct", cdim.tiles_in_block)
        gc = cdim.tile_index(g, ct)
        csz = cdim.tile_size(gc)
        tp = Buffer(f"{rows.name}_tpsum", (cdim.tile, tok.tile), rows.dtype, "psum")
        body: list[Stmt] = [
            Alloc(tp),
            PeTranspose(Ref(tp, (span(0, csz), span(0, tsz))), Ref(rows, (span(0, tsz), span(scale(ct, cdim.tile),
                                                                                           csz)))),
            Copy(Ref(strip, (span(0, csz), Point(gc), span(scale(tt, tok.tile), tsz))),
                 Ref(tp, (span(0, csz), span(0, tsz)))),
        ]
        return loop("ct", cdim.tiles_in(g), cdim.tiles_in_block, body)

    def _k_blocked_rows_of(self, group: Group, odim: Dim, ob: Expr, bn: Expr, nsz: Expr, tsz: Expr,
                           kb: int) -> tuple[dict[str, Ref], list[Stmt]]:
        """(each term's accumulator of output tile ``bn``, the statements filling them): one PSUM bank per term and
        output tile of the block, held across the K-block loop, which loads each term's weight rows of the block
        (one DMA per 128 rows, or one per block with ``weight_dma=block``) and multiplies them into every tile."""
        lhs = self.nodes[group.matmuls[0].operands[0]]
        kdim = self._kdim(lhs.shape[1], kb)
        kblk, kt = iv("k_blk", kdim.blocks), iv("kt", kb)
        gk = kdim.tile_index(kblk, kt)
        ksz = kdim.tile_size(gk)
        allocs: list[Stmt] = []
        hoisted: list[Stmt] = []  # an MX weight's scales of every K tile, before the K blocks (lowerings/mx.py)
        k_body: list[Stmt] = []
        values: dict[str, Ref] = {}
        for term in group.terms:
            (mm,) = term.matmuls
            w = self._weight(mm)
            acc = Buffer(f"{term.node.id}_psum", (self.tok.tile, odim.tiles_in_block, psum_bank_fp32(self.target)),
                         "float32", "psum")
            allocs.append(Alloc(acc, accumulator=True, comment="one PSUM bank per output tile, across K blocks"))
            wbuf = Buffer(f"{w.attrs['name']}_block", (kdim.tile, kb, odim.block_elems), w.dtype, "sbuf")
            k_body += [Alloc(wbuf), *self._load_k_block(w, wbuf, kdim, kblk, odim, ob)]
            hoisted += self.mx_hoisted_scales(w, wbuf, kdim, kblk, odim, ob)
            bt = iv("bt", odim.tiles_in_block)
            bsz = odim.tile_size(odim.tile_index(ob, bt))
            strip = Ref(self.strips[lhs.id], (span(0, ksz), Point(gk), span(0, tsz)))
            mmul = Matmul(Ref(acc, (span(0, tsz), Point(bt), span(0, bsz))), strip,
                          Ref(wbuf, (span(0, ksz), Point(kt), span(scale(bt, odim.tile), bsz))),
                          perf_mode=self._perf_mode(mm))
            k_body += loop("bt", odim.tiles_in(ob), odim.tiles_in_block, loop("kt", kdim.tiles_in(kblk), kb, [mmul]))
            values[term.node.id] = Ref(acc, (span(0, tsz), Point(bn), span(0, nsz)))
        return values, allocs + hoisted + loop("k_blk", Lin(kdim.blocks), kdim.blocks, k_body)

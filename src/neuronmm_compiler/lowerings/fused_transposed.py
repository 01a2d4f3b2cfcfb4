"""Transposed groups of a fused kernel: values held feature-major (features on partitions, tokens
free), computed with the weight tile as the stationary operand and the strip as the moving one.

Part of the fused lowering (:mod:`.lower_fused`). Each group walks its output features in weight
blocks of ``gemm_stationary_fmax``-feature tiles, accumulates one PSUM tile per term and feature
tile over the contraction (or, with ``k_tiles_per_block``, over K blocks with one PSUM bank per
feature tile held across them, or, for narrow token blocks, the accumulators of up to ``512 // tokens`` feature
tiles packed side by side in one bank: :func:`packed_feature_tiles`), and evaluates its epilogue on the eviction into
its result strip.
"""

from __future__ import annotations

from ..ir import Node
from ..ir.fp8 import is_fp8
from ..kernel_ir.dims import Dim, balanced_block, iv, loop
from ..kernel_ir.expr import Expr, Lin, add, scale
from ..kernel_ir.lnc import divisible_blocking, halves
from ..kernel_ir.program import (
    Alloc,
    Buffer,
    Comment,
    Copy,
    DmaCopy,
    Matmul,
    Point,
    Ref,
    SendRecv,
    Stmt,
    TensorTensor,
    span,
)
from ..schedule.fused import tiles_per_weight_block
from ..vocab import ElementwiseOp, NodeKind
from .fused_groups import Group
from .fused_stationary import TokenStationaryGroups
from .limits import constant_name, feature_tile_size, k_blocked_group_banks, packed_feature_tiles, psum_bank_fp32


class TransposedGroups(TokenStationaryGroups):
    """The lowering of groups annotated ``orient=transposed``."""

    def _k_blocked(self, group: Group) -> int:
        """K tiles per weight block when the group's contraction is blocked (0: not blocked; nor is the contraction
        the programs of a logical core divide), balanced (:func:`~..kernel_ir.dims.balanced_block`)."""
        s = self.s
        matmuls = group.matmuls
        ks = {-(-self.nodes[mm.operands[0]].shape[1] // self.target.pmax) for mm in matmuls}
        if (s.k_tiles_per_block <= 0 or len(ks) != 1 or any(len(t.matmuls) > 1 for t in group.terms)
                or any(self._cache(mm) for mm in matmuls) or self._reduces(group)):
            return 0
        k_tiles = ks.pop()
        return balanced_block(k_tiles, s.k_tiles_per_block) if s.k_tiles_per_block < k_tiles else 0

    def _k_blocked_accumulators(self, group: Group) -> int:
        """How many feature tiles' accumulators a K-blocked group holds per term: one bank each out of the banks left
        for the group, or, where more fit that way, :func:`packed_feature_tiles` in one bank."""
        by_banks = k_blocked_group_banks(self.target) // len(group.terms)
        return max(by_banks, packed_feature_tiles(self.target, self.s.tokens_per_block))

    def transposed_group(self, group: Group, mb: Expr) -> list[Stmt]:
        """The statements computing ``group`` for token block ``mb`` into its strip (or streamed to HBM)."""
        if group.root.attrs.get("op") == ElementwiseOp.QUANTIZE_MX:  # an MX quantization (lowerings/mx.py)
            return self.mx_quantize_group(group, mb)
        if self._reduces(group):
            return self.reduced_groups([group], mb)
        if self._token_stationary(group):
            return self.token_stationary_group(group, mb, self._k_blocked(group))
        root, s = group.root, self.s
        n = root.shape[1]
        feature_tile = self.target.gemm_stationary_fmax  # output features per matmul: the stationary free size
        ntiles = -(-n // feature_tile)
        ftile = feature_tile_size(self.target, n)
        kb = self._k_blocked(group)
        if kb:
            # Contraction blocked: each feature tile's PSUM accumulator lives across the K blocks, so the feature
            # block is bounded by the accumulators the group may hold: a bank each, or packed into one bank per term
            by_sbuf = tiles_per_weight_block(s, kb, ftile, self._weight_bytes(group), ntiles)
            per_block = max(1, min(by_sbuf, self._k_blocked_accumulators(group)))
        else:
            per_block = self._tiles_per_block(group, ftile, ntiles)
        shares = self._shares(group, n, ftile, ntiles, per_block)
        if self._divides_features(group) and n % ftile == 0 and not shares:  # blocks the programs can divide
            per_block = divisible_blocking(ntiles, per_block, self.target.lnc)
        share_tiles, share_step = Dim.overlapping_shares(ntiles, shares) if shares else (0, 0)
        per_block = balanced_block(share_tiles or ntiles, min(per_block, share_tiles) if shares else per_block)
        fdim = Dim("f", n, ftile, ntiles, per_block, block_name=constant_name(root.id, "BLOCK"),
                   share_tiles=share_tiles, share_step=0 if share_step == share_tiles else share_step)
        bm = self.tok.block_size(mb)
        # A result placed in HBM that no matmul of this kernel reads (e.g. h^T of a split MLP's first
        # kernel) is stored tile by tile as it is produced, instead of being held whole in SBUF.
        stored = self._stored(root)
        streamed = stored and not any(u.kind != NodeKind.OUTPUT for u in self._users(root.id))
        if streamed:
            out_strip = Buffer(f"{root.id}_tile", (ftile, s.tokens_per_block), self.dtype, "sbuf")
            out: list[Stmt] = []
        else:
            out_strip = self._strip(root.id, n)
            out = [Alloc(out_strip, comment=f"{root.id}^T strip of this token block, kept in SBUF")]
        fb = iv("f_blk", fdim.blocks)
        ft = iv("ft", fdim.tiles_in_block)
        g = fdim.tile_index(fb, ft)
        nsz = fdim.tile_size(g)
        if streamed:
            result = Ref(out_strip, (span(0, nsz), span(0, bm)))
            store = [DmaCopy(Ref(hbm, (span(fdim.tile_start(g), nsz), span(self.tok.block_start(mb), bm))), result)
                     for _, hbm in self.out_hbm[root.id]]
        else:
            result = Ref(out_strip, (span(0, nsz), Point(g), span(0, bm)))
            store = []
        operands = {op.id: Ref(self.strips[op.id], (span(0, nsz), Point(g), span(0, bm))) for op in group.operands
                    if not self._is_scale_operand(op.id)}
        operands.update(self.scale_refs(group, nsz, g))
        operands.update(self.row_scale_refs(group, nsz, bm, Lin(0)))
        block: list[Stmt] = []
        if kb:
            values, accumulate = self._k_blocked_matmuls(group, fdim, fb, ft, nsz, bm, kb)
            block += accumulate
            tile = []
        else:
            loads, sources = self._weight_sources(group, fdim, fb)
            block += loads
            tile, values = self._term_tiles(group, sources, fdim, g, scale(ft, fdim.tile), nsz, Lin(0), bm,
                                            row_major=False)
        values.update(operands)
        # the epilogue's scratch is allocated in the body of the ft loop it is written in: allocated above an affine
        # loop and written in every iteration, it would be a loop-carried write race (rule NKI-AFFINE-WRITE-RACE,
        # verification/rules.py)
        tile += ([Alloc(out_strip)] if streamed else []) + self._evaluated(
            group, values, result, (fdim.tile, s.tokens_per_block), (nsz, bm)) + store
        block += loop("ft", fdim.tiles_in(fb), fdim.tiles_in_block, tile)
        out += [Comment(self._describe_group(group))]
        divided = self._divided(group, fdim, streamed, stored)
        split = (self.s.lnc_split,) if divided else ()
        if fdim.share_step:
            both = range(fdim.share_step, fdim.share_tiles)
            which = f"tile {both[0]} is" if len(both) == 1 else f"tiles {both[0]}-{both[-1]} are"
            out.append(Comment(f"{shares} shares of {fdim.share_tiles} of the {ntiles} feature tiles, "
                               f"{fdim.share_step} apart: {which} computed by both programs"))
        if shares:  # the programs divide the shares; each walks the blocks of its own share
            out += loop(fdim.share_var, Lin(shares), shares, loop("f_blk", Lin(fdim.blocks), fdim.blocks, block),
                        split=split)
        else:
            out += loop("f_blk", Lin(fdim.blocks), fdim.blocks, block, split=split)
        if divided and not streamed and root.id not in self.halved and not self.row_half(root, fdim):
            out += self._gather(out_strip, fdim, bm)
        if stored and not streamed:
            out += self._store_strip(root, out_strip, fdim, mb)
        return out

    def _token_stationary(self, group: Group) -> bool:
        """Whether ``group`` is computed with the activations stationary (:mod:`.fused_stationary`): asked for by the
        schedule, and a group of matmuls whose epilogue reads only its terms (no operand strip, no FP8 scale: those
        are held feature-major), in BF16/FP32, kept in SBUF (a value stored to HBM streams its tiles from the
        feature-major form), and computed whole by each program of a logical core (no divided features). An FP8 group
        only where its activations are scaled per token (--act-scale row: its dequantizations read each token's scale
        as a per-partition column of the rows, lowerings/row_scales.py), the scales then its only operands."""
        if self.s.stationary != "tokens" or not group.matmuls or self._stored(group.root):
            return False
        if any(not self._is_scale_operand(op.id) for op in group.operands):
            return False
        if any(is_fp8(self._weight(mm).dtype) for mm in group.matmuls) and not self._row_scaled(group):
            return False
        return not self._divides_features(group)

    def _divides_features(self, group: Group) -> bool:
        """Whether the split divides this group's output features between the programs of a logical core: every
        group under ``gather``, every group but the reducing ones under ``hidden`` and ``intermediate`` (when there are
        any)."""
        if self.target.lnc != 2 or self._reduces(group):
            return False
        return self.s.lnc_split == "gather" or (self.s.lnc_split in ("hidden", "intermediate") and bool(self.reducing))

    def _divided(self, group: Group, fdim: Dim, streamed: bool, stored: bool) -> bool:
        """Whether this group's feature blocks are divided (:meth:`_divides_features`) here: an even number of
        whole blocks of whole tiles, or one share of whole tiles per program (:meth:`_shares`), so both halves of the
        strip have one shape, as sendrecv needs; and a result either streamed to HBM or kept in SBUF only (a strip
        stored whole after the group would be stored by both programs). Otherwise both programs compute the whole
        group."""
        if not self._divides_features(group) or (fdim.blocks % 2 and not fdim.share_tiles):
            return False
        whole = (fdim.share_tiles or fdim.tiles % fdim.tiles_in_block == 0) and fdim.size % fdim.tile == 0
        return whole and (streamed or not stored)

    def _shares(self, group: Group, n: int, ftile: int, ntiles: int, per_block: int) -> int:
        """Shares the feature tiles are split into before they are blocked (0: none): the programs of a logical core
        when they divide this group's features and whole blocks of each program's share would be at most half the
        block the schedule asks for (Qwen3-4B's 76 tiles: a share of 38 = 2 x 19 tiles takes blocks of 2 where 9
        fit, 512-byte weight rows); each share is then blocked as asked, balanced (8, 8, 8, 8, 6 where 9s left a last 2:
        :func:`~..kernel_ir.dims.balanced_block`).

        A tile count the programs cannot halve (Qwen3-4B's rank 1664 at keep 0.8: 13 tiles) is shared with an overlap
        (:meth:`~..kernel_ir.dims.Dim.overlapping_shares`: tiles 0-6 and 6-12), each program computing one more tile
        than half instead of both computing all of them, when the strip is exchanged whole afterwards: kept in SBUF
        only (a stored tile would be stored by both) and not left halved for a divided contraction."""
        programs = self.target.lnc
        if not self._divides_features(group) or n % ftile:
            return 0
        if ntiles % programs:
            odd = group.root.id not in self.halved and not self._stored(group.root)
            return programs if odd and Dim.overlapping_shares(ntiles, programs)[0] else 0
        asked = min(per_block, ntiles // programs)  # a block never spans shares
        return programs if 2 * divisible_blocking(ntiles, per_block, programs) <= asked else 0

    def reduced_groups(self, groups: list[Group], mb: Expr) -> list[Stmt]:
        """Groups whose contraction the programs of a logical core divide (``reducing_groups``; several only when none
        reads another's value, :meth:`exchange_batches`): each program accumulates its half of the contraction into
        fp32 partial strips (one per term, every term of every group in one buffer), the programs exchange them whole
        in one nisa.sendrecv, and each adds the other's to its own, one instruction per group over its strip (the same
        two terms in the same order: identical sums on both); only then is a group's epilogue evaluated, tile by
        tile, from the sums; a group without one (x @ U of an SVD MLP) is written into its strip by that add. A result
        streamed to HBM is evaluated and stored by each program for its half of the tiles; one kept in SBUF by both,
        whole."""
        s, ftile = self.s, feature_tile_size(self.target, groups[0].root.shape[1])
        # every term's partial strip in one buffer, so that one sendrecv exchanges them all (as AWS's decode MLP sends
        # gate's and up's partial sums together: mlp_tkg_gate_up_projection.py:595-601, 938-948 of nki-library@d2ad3a57)
        bases, width = [], 0
        for group in groups:
            bases.append(width)
            width += len(group.terms) * (group.root.shape[1] // ftile)  # whole tiles (reducing_groups)
        terms = [t.node.id for t in groups[0].terms]
        name = (f"{groups[0].root.id}_partials" if len(terms) > 1 else f"{terms[0]}_partial") if len(groups) == 1 \
            else "_".join(g.root.id for g in groups) + "_partials"
        held = Buffer(name, (ftile, width, s.tokens_per_block), "float32", "sbuf")
        out: list[Stmt] = [Alloc(held, comment="this program's partial sums (its half of the contraction)")]
        for group, base in zip(groups, bases, strict=True):
            out += self._partial_sums(group, held, base, mb)
        whole = (span(0, ftile), span(0, width), span(0, self.tok.block_size(mb)))
        received = Buffer(f"{held.name}_other", held.shape, "float32", "sbuf")
        how = "one instruction over the whole strip" if len(groups) == 1 else "one instruction per value"
        out += [Comment(f"add the other program's partial sums (one exchange, {how}): both hold the whole sums"),
                Alloc(received), SendRecv(Ref(received, whole), Ref(held, whole))]
        strips: list[Stmt] = []
        for group, base in zip(groups, bases, strict=True):
            allocs, stmts = self._summed(group, held, received, base, mb)
            strips += allocs
            out += stmts
        return strips + out

    def _partial_sums(self, group: Group, held: Buffer, base: int, mb: Expr) -> list[Stmt]:
        """This program's partial sums of ``group`` (its half of the contraction) into ``held`` from tile ``base``:
        one tile per term and feature tile."""
        root, ftile = group.root, held.shape[0]
        n = root.shape[1]
        ntiles = n // ftile
        fdim = Dim("f", n, ftile, ntiles, balanced_block(ntiles, self._tiles_per_block(group, ftile, ntiles)),
                   block_name=constant_name(root.id, "BLOCK"))
        fb, ft = iv("f_blk", fdim.blocks), iv("ft", fdim.tiles_in_block)
        g = fdim.tile_index(fb, ft)
        bm = self.tok.block_size(mb)
        loads, sources = self._weight_sources(group, fdim, fb)
        tile, values = self._term_tiles(group, sources, fdim, g, scale(ft, ftile), Lin(ftile), Lin(0), bm,
                                        row_major=False)
        tile += [Copy(Ref(held, (span(0, ftile), Point(add(g, base + i * ntiles)), span(0, bm))), values[t.node.id])
                 for i, t in enumerate(group.terms)]
        return [Comment(self._describe_group(group) + "; partial sums over this program's half of the contraction"),
                *loop("f_blk", Lin(fdim.blocks), fdim.blocks, loads + loop("ft", fdim.tiles_in(fb),
                                                                             fdim.tiles_in_block, tile))]

    def _summed(self, group: Group, held: Buffer, received: Buffer, base: int,
                mb: Expr) -> tuple[list[Stmt], list[Stmt]]:
        """``group``'s sums (its tiles of ``held`` from ``base`` plus the other program's in ``received``) and then its
        value: written into its strip by the add when it has no epilogue, else evaluated tile by tile. Returns (the
        allocation of its strip, if kept in SBUF; the statements)."""
        root, s, tok, ftile = group.root, self.s, self.tok, held.shape[0]
        n = root.shape[1]
        ntiles = n // ftile
        bm = tok.block_size(mb)
        terms = [t.node.id for t in group.terms]
        mine = (span(0, ftile), span(base, len(terms) * ntiles), span(0, bm))
        streamed = self._stored(root)
        allocs: list[Stmt] = []
        if not streamed:
            strip = self._strip(root.id, n)
            allocs.append(Alloc(strip, comment=f"{root.id}^T strip of this token block, kept in SBUF"))
        if not group.tree and len(terms) == 1 and not streamed:
            # no epilogue: the sum is the value, cast into its strip by the add itself (no copy per tile)
            return allocs, [TensorTensor(Ref(strip, (span(0, ftile), span(0, ntiles), span(0, bm))), Ref(held, mine),
                                         Ref(received, mine), ElementwiseOp.ADD)]
        out: list[Stmt] = [TensorTensor(Ref(held, mine), Ref(held, mine), Ref(received, mine), ElementwiseOp.ADD)]
        nt = iv("nt", ntiles)
        at = (span(0, ftile), Point(nt), span(0, bm))
        body: list[Stmt] = []
        sums = {t: Ref(held, (span(0, ftile), Point(add(nt, base + i * ntiles)), span(0, bm)))
                for i, t in enumerate(terms)}
        sums.update({op.id: Ref(self.strips[op.id], at) for op in group.operands if not self._is_scale_operand(op.id)})
        sums.update(self.scale_refs(group, Lin(ftile), nt))
        sums.update(self.row_scale_refs(group, Lin(ftile), bm, Lin(0)))
        temps = {node.id: Buffer(f"{node.id}_f32", (ftile, s.tokens_per_block), "float32", "sbuf")
                 for node in group.tree if node is not root}
        body += [Alloc(b) for b in temps.values()]
        scratch = None
        if any(ElementwiseOp(node.attrs["op"]).scaled for node in group.tree):  # FP8 ops need fp32 scratch
            scratch = Buffer(f"{root.id}_spill", (ftile, s.tokens_per_block), "float32", "sbuf")
            body.append(Alloc(scratch))
        if streamed:
            result_tile = Buffer(f"{root.id}_tile", (ftile, s.tokens_per_block), self.dtype, "sbuf")
            result = Ref(result_tile, (span(0, ftile), span(0, bm)))
            body += [Alloc(result_tile), *self._epilogue(group, sums, result, temps, scratch or result_tile,
                                                          (Lin(ftile), bm))]
            body += [DmaCopy(Ref(hbm, (span(scale(nt, ftile), ftile), span(tok.block_start(mb), bm))), result)
                     for _, hbm in self.out_hbm[root.id]]
        else:
            body += self._epilogue(group, sums, Ref(strip, at), temps, scratch or strip, (Lin(ftile), bm))
        return allocs, out + loop("nt", Lin(ntiles), ntiles, body, split=(s.lnc_split,) if streamed else ())

    def _gather(self, strip: Buffer, fdim: Dim, bm: Expr) -> list[Stmt]:
        """Each program sends the tiles of the strip only it computed (its half; with overlapping shares, its share
        but the tiles both computed) to the other, which receives them in the same place: afterwards both hold the whole
        value (nisa.sendrecv, SBUF to SBUF)."""
        half = fdim.share_step or fdim.tiles // 2  # tiles only one program computed, each
        own, other = halves(half, fdim.share_tiles or half)
        rows = span(0, fdim.tile)
        what = f"the tiles of {strip.name} only it computed" if fdim.share_step else f"halves of {strip.name}"
        return [Comment(f"exchange {what} with the other program: both hold all {fdim.size} features"),
                SendRecv(Ref(strip, (rows, other, span(0, bm))), Ref(strip, (rows, own, span(0, bm))))]

    def _k_blocked_matmuls(self, group: Group, fdim: Dim, fb: Expr, ft: Expr, nsz: Expr, bm: Expr,
                           kb: int) -> tuple[dict[str, Ref], list[Stmt]]:
        """PSUM accumulators of the feature block, then the K-block loop: load weight rows, matmul."""
        lhs0 = self.nodes[group.matmuls[0].operands[0]]
        kdim = self._kdim(lhs0.shape[1], kb)
        kblk = iv("k_blk", kdim.blocks)
        kt = iv("kt", kdim.tiles_in_block)
        gk = kdim.tile_index(kblk, kt)
        ksz = kdim.tile_size(gk)
        allocs: list[Stmt] = []
        hoisted: list[Stmt] = []  # an MX weight's scales of every K tile, before the K blocks (lowerings/mx.py)
        loads: list[Stmt] = []
        tile: list[Stmt] = []
        values: dict[str, Ref] = {}
        for leaf in group.matmuls:
            w = self._weight(leaf)
            packed = fdim.tiles_in_block <= packed_feature_tiles(self.target, self.s.tokens_per_block)
            width = self.s.tokens_per_block if packed else psum_bank_fp32(self.target)
            psum = Buffer(f"{leaf.id}_psum", (fdim.tile, fdim.tiles_in_block, width), "float32", "psum")
            allocs.append(Alloc(psum, accumulator=True, comment=(
                "the feature tiles' accumulators side by side in one PSUM bank, across K blocks" if packed else
                "one PSUM bank per feature tile, across K blocks")))
            wbuf = Buffer(f"{w.attrs['name']}_block", (kdim.tile, kb, fdim.block_elems), w.dtype, "sbuf")
            loads.append(Alloc(wbuf))
            if self.s.weight_dma != "tile" or fdim.tiles_in_block == 1:
                loads += self._load_k_block(w, wbuf, kdim, kblk, fdim, fb)
            else:
                wt = iv("wt", fdim.tiles_in_block)
                gw = fdim.tile_index(fb, wt)
                csz = fdim.tile_size(gw)
                dma = self._weight_dma(w, Ref(wbuf, (span(0, ksz), Point(kt), span(scale(wt, fdim.tile), csz))),
                                       kdim.tile_start(gk), ksz, fdim.tile_start(gw), csz)
                loads += loop("wt", fdim.tiles_in(fb), fdim.tiles_in_block, loop("kt", kdim.tiles_in(kblk), kb, [dma]))
                loads += self._k_block_scales(w, wbuf, kdim, kblk, fdim, fb)  # an MX weight's, for the whole block
            hoisted += self.mx_hoisted_scales(w, wbuf, kdim, kblk, fdim, fb)
            dst = Ref(psum, (span(0, nsz), Point(ft), span(0, bm)))
            mm = Matmul(dst, Ref(wbuf, (span(0, ksz), Point(kt), span(scale(ft, fdim.tile), nsz))),
                        Ref(self.strips[self.nodes[leaf.operands[0]].id], (span(0, ksz), Point(gk), span(0, bm))),
                        perf_mode=self._perf_mode(leaf))
            tile += loop("kt", kdim.tiles_in(kblk), kb, [mm])
            values[leaf.id] = dst
        body = loads + loop("ft", fdim.tiles_in(fb), fdim.tiles_in_block, tile)
        return values, allocs + hoisted + loop("k_blk", Lin(kdim.blocks), kdim.blocks, body)

    def _store_strip(self, node: Node, strip: Buffer, fdim: Dim, mb: Expr) -> list[Stmt]:
        """Store the strip of ``node`` to each of its outputs (declared transposed: the legality rules)."""
        out: list[Stmt] = []
        for out_node, hbm in self.out_hbm[node.id]:
            nt = iv("nt", fdim.tiles)
            nsz = fdim.tile_size(nt)
            t0, bm = self.tok.block_start(mb), self.tok.block_size(mb)
            dma = DmaCopy(Ref(hbm, (span(fdim.tile_start(nt), nsz), span(t0, bm))),
                          Ref(strip, (span(0, nsz), Point(nt), span(0, bm))))
            out += [Comment(f"store {out_node.attrs['name']} (transposed in HBM)"),
                    *loop("nt", Lin(fdim.tiles), fdim.tiles, [dma])]
        return out


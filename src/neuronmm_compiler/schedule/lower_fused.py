"""Lower one fused kernel (a kernel subgraph after the fusion passes) to a loop-nest program.

The kernel graph's compute nodes carry the passes' decisions: ``orient`` (``transposed``: held
feature-major, the layout the next matmul contracts over; ``normal``: row-major) and ``place``
(``sbuf``: stays on chip inside the kernel). The program, for each block of tokens:

1. loads the X^T strip of every kernel input used as a matmul's left operand, once, shared by all
   its users (a transposing DMA or TensorE transposes for a row-major input; a plain load for an
   input already stored transposed, e.g. h^T handed over by a previous kernel);
2. for each *group* in dependency order — a transposed matmul, or the transposed matmuls feeding
   one elementwise tree (e.g. gate and up under ``silu(gate) * up``) — walks the output features in
   weight blocks, accumulates each matmul's ``[128 features, tokens]`` PSUM tile over the
   contraction, and evaluates the elementwise tree while evicting, writing the group's result
   strip in SBUF; a result that is a kernel output is stored from the strip (transposed in HBM);
3. for the row-major matmul feeding an output: per weight block and token tile, accumulates
   ``[tokens, out_tile]`` PSUM tiles, packs a row and stores it.

Nothing here is specific to SVD: the same rules lower X·U·V, the gated MLP (whole or split) and
any chain of matmuls with elementwise epilogues whose weights are kernel inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ScheduleError
from ..ir import Graph, Node
from .dims import Dim, iv, loop
from .expr import Expr, Lin, scale
from .fused import FusedSchedule, normalize_fused, tiles_per_weight_block
from .program import (
    DTYPE_BYTES,
    Activation,
    Alloc,
    Buffer,
    Comment,
    Copy,
    DmaCopy,
    Matmul,
    PeTranspose,
    Point,
    Program,
    Ref,
    Stmt,
    TensorTensor,
    span,
)

FEATURE_TILE = 128  # output features per transposed matmul (stationary free size)
K_TILE = 128  # contraction rows per matmul (partitions)
PSUM_BANK_FP32 = 512  # fp32 values per partition in one PSUM bank
GROUP_PSUM_BANKS = 6  # banks a K-blocked group may hold: 8, less one for the row-major matmul, one for transposes


def annotation(node: Node, key: str) -> str | None:
    return node.annotations.get(key)


@dataclass
class _Group:
    """Transposed matmuls evaluated together, and the elementwise tree over them."""

    root: Node
    leaves: list[Node]
    tree: list[Node] = field(default_factory=list)  # elementwise nodes, operands before users


class _FusedLowering:
    def __init__(self, graph: Graph, schedule: FusedSchedule, name: str):
        self.g = graph
        self.name = name
        self.nodes = {n.id: n for n in graph.nodes()}
        self.inputs = graph.inputs()
        self.outputs = graph.outputs()
        lhs_inputs = self._lhs_inputs()
        if not lhs_inputs:
            raise ScheduleError(f"kernel {name}: no matmul reads a kernel input as its left operand")
        self.lhs_inputs = lhs_inputs
        self.tokens = lhs_inputs[0].shape[0]
        self.s = normalize_fused(schedule, self.tokens)
        s = self.s
        self.tok = Dim("t", self.tokens, s.token_tile, -(-self.tokens // s.token_tile),
                       max(1, s.tokens_per_block // s.token_tile))
        self.dtype = lhs_inputs[0].dtype
        self.dtype_bytes = DTYPE_BYTES[self.dtype]
        self.hbm = {n.id: Buffer(n.attrs["name"], n.storage_shape, n.dtype, "hbm") for n in self.inputs}
        self.out_hbm = {n.operands[0]: (n, Buffer(n.attrs["name"], n.storage_shape, n.dtype, "hbm"))
                        for n in self.outputs}
        self.strips: dict[str, Buffer] = {}
        self.cached: dict[str, Buffer] = {}

    # ------------------------------------------------------------------ analysis
    def _matmuls(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "matmul"]

    def _lhs_inputs(self) -> list[Node]:
        seen: list[Node] = []
        for mm in self._matmuls():
            lhs = self.nodes[mm.operands[0]]
            if lhs.kind == "input" and lhs not in seen:
                seen.append(lhs)
        return seen

    def _weight(self, mm: Node) -> Node:
        rhs = self.nodes[mm.operands[1]]
        if rhs.kind != "input" or rhs.attrs.get("layout", "row_major") != "row_major":
            raise ScheduleError(f"kernel {self.name}: matmul %{mm.id} needs a row-major weight input as its right "
                                "operand; fused kernels take weights from HBM")
        return rhs

    def _users(self, node_id: str) -> list[Node]:
        return [self.nodes[u] for u in self.g.users(node_id)]

    def groups(self) -> list[_Group | Node]:
        """Transposed groups and row-major matmuls, in dependency order."""
        out: list[_Group | Node] = []
        claimed: set[str] = set()
        for node in self.g.nodes():
            if node.kind == "transpose":
                raise ScheduleError(f"kernel {self.name}: transpose %{node.id} survived the passes; fused kernels "
                                    "contain no transpose instruction")
            if node.kind == "elementwise":
                if any(u.kind == "elementwise" for u in self._users(node.id)):
                    continue  # not a root: evaluated inside its root's tree
                if annotation(node, "orient") != "transposed":
                    raise ScheduleError(f"kernel {self.name}: elementwise %{node.id} on a row-major value is not "
                                        "supported; only epilogues of transposed matmuls fuse")
                group = _Group(node, [])
                self._collect(node, group)
                claimed.update(leaf.id for leaf in group.leaves)
                out.append(group)
            elif node.kind == "matmul":
                if annotation(node, "orient") == "transposed":
                    if any(u.kind == "elementwise" for u in self._users(node.id)):
                        continue  # a leaf: evaluated with its tree (placed at the root)
                    out.append(_Group(node, [node]))
                else:
                    out.append(node)
        # A leaf must come after everything its inputs need: roots are in topological order and
        # leaves precede their root, so placing the whole group at the root keeps the order valid.
        return out

    def _collect(self, node: Node, group: _Group) -> None:
        for op_id in node.operands:
            op = self.nodes[op_id]
            if op.kind == "elementwise":
                self._collect(op, group)
            elif op.kind == "matmul" and annotation(op, "orient") == "transposed":
                if op not in group.leaves:
                    group.leaves.append(op)
            else:
                raise ScheduleError(f"kernel {self.name}: elementwise %{node.id} reads %{op_id}, which is not a "
                                    "transposed matmul result; it cannot be fused on the PSUM eviction")
        group.tree.append(node)

    # ------------------------------------------------------------------ helpers
    def _kdim(self, size: int) -> Dim:
        tiles = -(-size // K_TILE)
        return Dim("k", size, min(K_TILE, size), tiles, tiles)

    def _strip(self, node_id: str, features: int) -> Buffer:
        """The SBUF strip holding a value transposed: [features (tiles of 128), tiles, tokens of a block]."""
        if node_id not in self.strips:
            tiles = -(-features // K_TILE)
            shape = (min(K_TILE, features), tiles, self.s.tokens_per_block)
            self.strips[node_id] = Buffer(f"{node_id}_strip", shape, self.dtype, "sbuf")
        return self.strips[node_id]

    def _cache(self, mm: Node) -> bool:
        stage1 = self.nodes[mm.operands[0]].kind == "input"
        return self.s.cache_weights == "all" or (self.s.cache_weights == "stage1" and stage1)

    def _load_block(self, w: Node, buf: Buffer, kdim: Dim, fdim: Dim, blk: Expr, max_tiles: int) -> list[Stmt]:
        """DMAs filling ``buf[k, kt, :]`` with the weight columns of feature block ``blk``."""
        hbm = self.hbm[w.id]
        kt = iv("kt", kdim.tiles)
        ksz, k0 = kdim.tile_size(kt), kdim.tile_start(kt)
        if self.s.weight_dma == "row" or max_tiles == 1:
            cols = fdim.block_size(blk)
            dma = DmaCopy(Ref(buf, (span(0, ksz), Point(kt), span(0, cols))),
                          Ref(hbm, (span(k0, ksz), span(fdim.block_start(blk), cols))))
            return loop("kt", Lin(kdim.tiles), kdim.tiles, [dma])
        wt = iv("wt", max_tiles)
        g = fdim.tile_index(blk, wt)
        csz = fdim.tile_size(g)
        dma = DmaCopy(Ref(buf, (span(0, ksz), Point(kt), span(scale(wt, fdim.tile), csz))),
                      Ref(hbm, (span(k0, ksz), span(fdim.tile_start(g), csz))))
        return loop("wt", fdim.tiles_in(blk), max_tiles, loop("kt", Lin(kdim.tiles), kdim.tiles, [dma]))

    def _weights(self, mm: Node, fdim: Dim, blk: Expr) -> tuple[list[Stmt], Buffer, bool]:
        """(statements loading the weight block, the buffer to read, whether it holds all columns)."""
        w = self._weight(mm)
        if self._cache(mm):
            return [], self.cached[mm.id], True
        kdim = self._kdim(w.shape[0])
        buf = Buffer(f"{w.attrs['name']}_block", (kdim.tile, kdim.tiles, fdim.block_elems), w.dtype, "sbuf")
        return [Alloc(buf), *self._load_block(w, buf, kdim, fdim, blk, fdim.tiles_in_block)], buf, False

    # ------------------------------------------------------------------ program parts
    def cached_weights(self) -> list[Stmt]:
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
        if inp.attrs.get("layout") == "transposed":
            dma = DmaCopy(Ref(buf, (span(0, ksz), Point(kt), span(0, bm))), Ref(hbm, (span(k0, ksz), span(t0, bm))))
            return out + loop("kt", Lin(kdim.tiles), kdim.tiles, [dma])
        if s.x_transpose == "dma":
            dma = DmaCopy(Ref(buf, (span(0, ksz), Point(kt), span(0, bm))),
                          Ref(hbm, (span(t0, bm), span(k0, ksz))), transpose=True)
            return out + loop("kt", Lin(kdim.tiles), kdim.tiles, [dma])
        tt = iv("tt", tok.tiles_in_block)
        tg = tok.tile_index(mb, tt)
        tsz = tok.tile_size(tg)
        rows = Buffer(f"{inp.attrs['name']}_rows", (tok.tile, k), inp.dtype, "sbuf")
        tp = Buffer(f"{inp.attrs['name']}_t_psum", (kdim.tile, tok.tile), inp.dtype, "psum")
        body: list[Stmt] = [
            Alloc(rows, comment="tokens on partitions, as stored"),
            DmaCopy(Ref(rows, (span(0, tsz), span(0, k))), Ref(hbm, (span(tok.tile_start(tg), tsz), span(0, k)))),
            *loop("kt", Lin(kdim.tiles), kdim.tiles, [
                Alloc(tp),
                PeTranspose(Ref(tp, (span(0, ksz), span(0, tsz))), Ref(rows, (span(0, tsz), span(k0, ksz)))),
                Copy(Ref(buf, (span(0, ksz), Point(kt), span(scale(tt, tok.tile), tsz))),
                     Ref(tp, (span(0, ksz), span(0, tsz)))),
            ]),
        ]
        return out + loop("tt", tok.tiles_in(mb), tok.tiles_in_block, body)

    def _k_blocked(self, group: _Group) -> int:
        """K tiles per weight block when the group's contraction is blocked (0: not blocked)."""
        s = self.s
        ks = {-(-self.nodes[leaf.operands[0]].shape[1] // K_TILE) for leaf in group.leaves}
        if s.k_tiles_per_block <= 0 or len(ks) != 1 or any(self._cache(leaf) for leaf in group.leaves):
            return 0
        k_tiles = ks.pop()
        return s.k_tiles_per_block if s.k_tiles_per_block < k_tiles else 0

    def transposed_group(self, group: _Group, mb: Expr) -> list[Stmt]:
        root, s = group.root, self.s
        n = root.shape[1]
        ntiles = -(-n // FEATURE_TILE)
        ftile = min(FEATURE_TILE, n)
        kb = self._k_blocked(group)
        if kb:
            # Contraction blocked: each feature tile's PSUM accumulator (a bank) lives across the
            # K blocks, so the feature block is bounded by the banks left for this group.
            by_sbuf = tiles_per_weight_block(s, kb, ftile, self.dtype_bytes, ntiles)
            per_block = max(1, min(by_sbuf, GROUP_PSUM_BANKS // len(group.leaves)))
        else:
            k_tiles = max(-(-self.nodes[leaf.operands[0]].shape[1] // K_TILE) for leaf in group.leaves)
            per_block = tiles_per_weight_block(s, k_tiles, ftile, self.dtype_bytes, ntiles)
        fdim = Dim("f", n, ftile, ntiles, per_block)
        bm = self.tok.block_size(mb)
        # A result no matmul of this kernel reads (e.g. h^T of a split MLP's first kernel) is stored
        # tile by tile as it is produced, instead of being held whole in SBUF.
        streamed = root.id in self.out_hbm and not any(u.kind != "output" for u in self._users(root.id))
        if streamed:
            out_strip = Buffer(f"{root.id}_tile", (min(FEATURE_TILE, n), s.tokens_per_block), self.dtype, "sbuf")
            out: list[Stmt] = []
        else:
            out_strip = self._strip(root.id, n)
            out = [Alloc(out_strip, comment=f"{root.id}^T strip of this token block, kept in SBUF")]
        temps = {node.id: Buffer(f"{node.id}_f32", (fdim.tile, s.tokens_per_block), "float32", "sbuf")
                 for node in group.tree if node is not root}
        spill = Buffer(f"{root.id}_operand_f32", (fdim.tile, s.tokens_per_block), "float32", "sbuf")
        out += [Alloc(t) for t in temps.values()]
        if any(self._two_psum_operands(node, group) for node in group.tree):
            out.append(Alloc(spill))
        fb = iv("f_blk", fdim.blocks)
        ft = iv("ft", fdim.tiles_in_block)
        g = fdim.tile_index(fb, ft)
        nsz = fdim.tile_size(g)
        if streamed:
            result = Ref(out_strip, (span(0, nsz), span(0, bm)))
            hbm = self.out_hbm[root.id][1]
            store = [DmaCopy(Ref(hbm, (span(fdim.tile_start(g), nsz), span(self.tok.block_start(mb), bm))), result)]
        else:
            result = Ref(out_strip, (span(0, nsz), Point(g), span(0, bm)))
            store = []
        block: list[Stmt] = []
        if kb:
            values, accumulate = self._k_blocked_matmuls(group, fdim, fb, ft, nsz, bm, kb)
            block += accumulate
            tile = ([Alloc(out_strip)] if streamed else []) + self._epilogue(group, values, result, temps, spill,
                                                                              nsz, bm) + store
        else:
            sources: dict[str, tuple[Buffer, bool]] = {}
            for leaf in group.leaves:
                loads, buf, whole = self._weights(leaf, fdim, fb)
                block += loads
                sources[leaf.id] = (buf, whole)
            tile = []
            values = {}
            for leaf in group.leaves:
                lhs = self.nodes[leaf.operands[0]]
                kdim = self._kdim(lhs.shape[1])
                kt = iv("kt", kdim.tiles)
                ksz = kdim.tile_size(kt)
                buf, whole = sources[leaf.id]
                col = fdim.tile_start(g) if whole else scale(ft, fdim.tile)
                psum = Buffer(f"{leaf.id}_psum", (fdim.tile, s.tokens_per_block), "float32", "psum")
                dst = Ref(psum, (span(0, nsz), span(0, bm)))
                mm = Matmul(dst, Ref(buf, (span(0, ksz), Point(kt), span(col, nsz))),
                            Ref(self.strips[lhs.id], (span(0, ksz), Point(kt), span(0, bm))))
                tile += [Alloc(psum, accumulator=True), *loop("kt", Lin(kdim.tiles), kdim.tiles, [mm])]
                values[leaf.id] = dst
            tile += ([Alloc(out_strip)] if streamed else []) + self._epilogue(group, values, result, temps, spill,
                                                                               nsz, bm) + store
        block += loop("ft", fdim.tiles_in(fb), fdim.tiles_in_block, tile)
        out += [Comment(self._describe_group(group))]
        out += loop("f_blk", Lin(fdim.blocks), fdim.blocks, block)
        if root.id in self.out_hbm and not streamed:
            out += self._store_strip(root, out_strip, fdim, mb)
        return out

    def _k_blocked_matmuls(self, group: _Group, fdim: Dim, fb: Expr, ft: Expr, nsz: Expr, bm: Expr,
                           kb: int) -> tuple[dict[str, Ref], list[Stmt]]:
        """PSUM accumulators of the feature block, then the K-block loop: load weight rows, matmul."""
        lhs0 = self.nodes[group.leaves[0].operands[0]]
        k = lhs0.shape[1]
        kdim = Dim("k", k, min(K_TILE, k), -(-k // K_TILE), kb)
        kblk = iv("k_blk", kdim.blocks)
        kt = iv("kt", kdim.tiles_in_block)
        gk = kdim.tile_index(kblk, kt)
        ksz = kdim.tile_size(gk)
        allocs: list[Stmt] = []
        loads: list[Stmt] = []
        tile: list[Stmt] = []
        values: dict[str, Ref] = {}
        for leaf in group.leaves:
            w = self._weight(leaf)
            hbm = self.hbm[w.id]
            psum = Buffer(f"{leaf.id}_psum", (fdim.tile, fdim.tiles_in_block, PSUM_BANK_FP32), "float32", "psum")
            allocs.append(Alloc(psum, accumulator=True, comment="one PSUM bank per feature tile, across K blocks"))
            wbuf = Buffer(f"{w.attrs['name']}_block", (kdim.tile, kb, fdim.block_elems), w.dtype, "sbuf")
            loads.append(Alloc(wbuf))
            if self.s.weight_dma == "row" or fdim.tiles_in_block == 1:
                cols = fdim.block_size(fb)
                dma = DmaCopy(Ref(wbuf, (span(0, ksz), Point(kt), span(0, cols))),
                              Ref(hbm, (span(kdim.tile_start(gk), ksz), span(fdim.block_start(fb), cols))))
                loads += loop("kt", kdim.tiles_in(kblk), kb, [dma])
            else:
                wt = iv("wt", fdim.tiles_in_block)
                gw = fdim.tile_index(fb, wt)
                csz = fdim.tile_size(gw)
                dma = DmaCopy(Ref(wbuf, (span(0, ksz), Point(kt), span(scale(wt, fdim.tile), csz))),
                              Ref(hbm, (span(kdim.tile_start(gk), ksz), span(fdim.tile_start(gw), csz))))
                loads += loop("wt", fdim.tiles_in(fb), fdim.tiles_in_block, loop("kt", kdim.tiles_in(kblk), kb, [dma]))
            dst = Ref(psum, (span(0, nsz), Point(ft), span(0, bm)))
            mm = Matmul(dst, Ref(wbuf, (span(0, ksz), Point(kt), span(scale(ft, fdim.tile), nsz))),
                        Ref(self.strips[self.nodes[leaf.operands[0]].id], (span(0, ksz), Point(gk), span(0, bm))))
            tile += loop("kt", kdim.tiles_in(kblk), kb, [mm])
            values[leaf.id] = dst
        body = loads + loop("ft", fdim.tiles_in(fb), fdim.tiles_in_block, tile)
        return values, allocs + loop("k_blk", Lin(kdim.blocks), kdim.blocks, body)

    def _epilogue(self, group: _Group, values: dict[str, Ref], result: Ref, temps: dict[str, Buffer],
                  spill: Buffer, nsz: Expr, bm: Expr) -> list[Stmt]:
        """Evaluate the group's elementwise tree on its PSUM tiles, writing the root into ``result``."""
        out: list[Stmt] = []
        values = dict(values)
        root = group.root
        if not group.tree:
            return [Copy(result, values[root.id])]
        for node in group.tree:
            dst = result if node is root else Ref(temps[node.id], (span(0, nsz), span(0, bm)))
            ops = [values[o] for o in node.operands]
            op = node.attrs["op"]
            if op == "silu":
                out.append(Activation(dst, ops[0], "silu"))
            else:
                if all(r.buffer.memory == "psum" for r in ops):
                    moved = Ref(spill, (span(0, nsz), span(0, bm)))
                    out.append(Copy(moved, ops[1]))  # a vector op reads at most one PSUM operand
                    ops[1] = moved
                out.append(TensorTensor(dst, ops[0], ops[1], op))  # type: ignore[arg-type]
            values[node.id] = dst
        return out

    def _describe_group(self, group: _Group) -> str:
        """One line saying what the group computes and how (for the emitted kernel's readers)."""
        def product(leaf: Node) -> str:
            return f"{leaf.operands[0]} @ {self._weight(leaf).attrs['name']}"

        if not group.tree:
            leaf = group.leaves[0]
            return (f"{leaf.id}^T = ({product(leaf)})^T: weight tiles stationary, {leaf.operands[0]}^T strip moving "
                    "(implicit transposition)")
        terms = ", ".join(f"{leaf.id} = {product(leaf)}" for leaf in group.leaves)
        ops = " then ".join(f"{node.attrs['op']}" for node in group.tree)
        return f"{group.root.id}^T from the PSUM tiles of {terms} ({ops} on the eviction)"

    def _two_psum_operands(self, node: Node, group: _Group) -> bool:
        leaves = {leaf.id for leaf in group.leaves}
        return node.attrs.get("op") != "silu" and all(o in leaves for o in node.operands)

    def _store_strip(self, node: Node, strip: Buffer, fdim: Dim, mb: Expr) -> list[Stmt]:
        out_node, hbm = self.out_hbm[node.id]
        if out_node.attrs.get("layout") != "transposed":
            raise ScheduleError(f"kernel {self.name}: output {out_node.attrs['name']} is held transposed but "
                                "declared row-major; run the implicit-transpose pass")
        nt = iv("nt", fdim.tiles)
        nsz = fdim.tile_size(nt)
        t0, bm = self.tok.block_start(mb), self.tok.block_size(mb)
        dma = DmaCopy(Ref(hbm, (span(fdim.tile_start(nt), nsz), span(t0, bm))),
                      Ref(strip, (span(0, nsz), Point(nt), span(0, bm))))
        return [Comment(f"store {out_node.attrs['name']} (transposed in HBM)"),
                *loop("nt", Lin(fdim.tiles), fdim.tiles, [dma])]

    def normal_matmul(self, mm: Node, mb: Expr) -> list[Stmt]:
        s, tok = self.s, self.tok
        if mm.id not in self.out_hbm:
            raise ScheduleError(f"kernel {self.name}: row-major matmul %{mm.id} must feed a kernel output")
        out_node, hbm = self.out_hbm[mm.id]
        lhs = self.nodes[mm.operands[0]]
        if lhs.id not in self.strips:
            raise ScheduleError(f"kernel {self.name}: %{lhs.id} is not held transposed for matmul %{mm.id}")
        n = mm.shape[1]
        tile_n = min(s.out_tile, n)
        ntiles = -(-n // tile_n)
        kdim = self._kdim(lhs.shape[1])
        odim = Dim("o", n, tile_n, ntiles, tiles_per_weight_block(s, kdim.tiles, tile_n, self.dtype_bytes, ntiles))
        ob = iv("o_blk", odim.blocks)
        loads, wbuf, whole = self._weights(mm, odim, ob)
        tt = iv("tt", tok.tiles_in_block)
        tg = tok.tile_index(mb, tt)
        tsz = tok.tile_size(tg)
        bn = iv("bn", odim.tiles_in_block)
        g = odim.tile_index(ob, bn)
        nsz = odim.tile_size(g)
        kt = iv("kt", kdim.tiles)
        ksz = kdim.tile_size(kt)
        psum = Buffer(f"{mm.id}_psum", (tok.tile, tile_n), "float32", "psum")
        rows = Buffer(f"{out_node.attrs['name']}_rows", (tok.tile, odim.block_elems), out_node.dtype, "sbuf")
        col = odim.tile_start(g) if whole else scale(bn, tile_n)
        matmul = Matmul(Ref(psum, (span(0, tsz), span(0, nsz))),
                        Ref(self.strips[lhs.id], (span(0, ksz), Point(kt), span(scale(tt, tok.tile), tsz))),
                        Ref(wbuf, (span(0, ksz), Point(kt), span(col, nsz))))
        per_tile = [Alloc(psum, accumulator=True), *loop("kt", Lin(kdim.tiles), kdim.tiles, [matmul]),
                    Copy(Ref(rows, (span(0, tsz), span(scale(bn, tile_n), nsz))),
                         Ref(psum, (span(0, tsz), span(0, nsz))))]
        cols = odim.block_size(ob)
        store = DmaCopy(Ref(hbm, (span(tok.tile_start(tg), tsz), span(odim.block_start(ob), cols))),
                        Ref(rows, (span(0, tsz), span(0, cols))))
        token_tile = [Alloc(rows, comment="one packed row of output tiles"),
                      *loop("bn", odim.tiles_in(ob), odim.tiles_in_block, per_tile), store]
        body = loads + loop("tt", tok.tiles_in(mb), tok.tiles_in_block, token_tile)
        return [Comment(f"{out_node.attrs['name']} = {lhs.id} @ {self._weight(mm).attrs['name']} (row-major)"),
                *loop("o_blk", Lin(odim.blocks), odim.blocks, body)]

    def program(self) -> Program:
        tok = self.tok
        body: list[Stmt] = [Comment(f"schedule: {self.s.describe()}")]
        body += self.cached_weights()
        mb = iv("m_blk", tok.blocks)
        block: list[Stmt] = []
        for inp in self.lhs_inputs:
            block += self.load_strip(inp, mb)
        for item in self.groups():
            block += self.transposed_group(item, mb) if isinstance(item, _Group) else self.normal_matmul(item, mb)
        body += loop("m_blk", Lin(tok.blocks), tok.blocks, block, comment="blocks of tokens")
        params = [self.hbm[n.id] for n in self.inputs]
        outs = [self.out_hbm[n.operands[0]][1] for n in self.outputs]
        args = ", ".join(f"{p.name}{list(p.shape)}" for p in params)
        results = ", ".join(f"{o.name}{list(o.shape)}" for o in outs)
        doc = (f"Fused kernel {self.name} over {self.tokens} tokens ({self.dtype}).\n"
               f"Arguments: {args}. Returns {results}.")
        return Program(self.name, params, outs, body, doc=doc)


def lower_fused_kernel(graph: Graph, schedule: FusedSchedule, name: str | None = None) -> Program:
    """The loop-nest program of one kernel subgraph (annotated by the fusion passes)."""
    return _FusedLowering(graph, schedule, name or f"{graph.name}_kernel").program()

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
from .expr import Expr, Lin, add, scale
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
class _Term:
    """One PSUM accumulator: a matmul, or an ``add`` of products summed in place (``x W + h B``
    accumulates both products into the same PSUM tile, as a matmul over the joined contraction)."""

    node: Node
    matmuls: list[Node]


@dataclass
class _Group:
    """Values evaluated together, tile by tile: PSUM accumulators (``terms``), the elementwise tree
    over them evaluated on the PSUM eviction (``tree``, operands before users) and the other values
    it reads (``operands``: transposed values held in SBUF strips, or, for a row-major group,
    kernel inputs loaded tile by tile). ``orient`` is the orientation of every value of the group."""

    root: Node
    orient: str
    terms: list[_Term] = field(default_factory=list)
    tree: list[Node] = field(default_factory=list)
    operands: list[Node] = field(default_factory=list)

    @property
    def matmuls(self) -> list[Node]:
        return [mm for term in self.terms for mm in term.matmuls]


class _FusedLowering:
    def __init__(self, graph: Graph, schedule: FusedSchedule, name: str):
        self.g = graph
        self.name = name
        self.nodes = {n.id: n for n in graph.nodes()}
        self.inputs = graph.inputs()
        self.outputs = graph.outputs()
        compute = graph.compute_nodes()
        copied = [n for n in self.inputs if any(u.kind == "output" for u in self._users(n.id))]
        if not compute and not copied:
            raise ScheduleError(f"kernel {name}: nothing to compute")
        for node in compute:
            if node.kind == "transpose":
                raise ScheduleError(f"kernel {name}: transpose %{node.id} of a computed value survived the passes; "
                                    "fused kernels contain no transpose instruction (transposes of inputs become "
                                    "input layouts, and of outputs output layouts)")
            if len(node.shape) != 2:
                raise ScheduleError(f"kernel {name}: %{node.id} is not 2-D; fused kernels compute 2-D values")
        rows = {node.shape[0] for node in compute} or {copied[0].shape[0]}
        if len(rows) != 1:
            raise ScheduleError(f"kernel {name}: its values have different row counts ({sorted(rows)}); a fused "
                                "kernel blocks one token dimension")
        self.tokens = rows.pop()
        self.s = normalize_fused(schedule, self.tokens)
        s = self.s
        self.tok = Dim("t", self.tokens, s.token_tile, -(-self.tokens // s.token_tile),
                       max(1, s.tokens_per_block // s.token_tile))
        self.dtype = (compute or copied)[0].dtype
        self.dtype_bytes = DTYPE_BYTES[self.dtype]
        aliases = graph.hbm_aliases
        self.hbm = {n.id: Buffer(aliases.get(n.id, n.attrs["name"]), n.storage_shape, n.dtype, "hbm")
                    for n in self.inputs}
        self.out_hbm: dict[str, list[tuple[Node, Buffer]]] = {}
        for n in self.outputs:
            self.out_hbm.setdefault(n.operands[0], []).append(
                (n, Buffer(n.attrs["name"], n.storage_shape, n.dtype, "hbm")))
        self.strips: dict[str, Buffer] = {}
        self.cached: dict[str, Buffer] = {}
        self.group_list = self._groups()
        # An output that returns an input (e.g. x^T, once the transpose became x's layout) is a copy,
        # made outside the token blocks, in row tiles of its own.
        self.copies = [_Group(n, "normal", operands=[n]) for n in copied]
        self.strip_inputs = self._strip_inputs()

    # ------------------------------------------------------------------ analysis
    def _matmuls(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "matmul"]

    def _weight(self, mm: Node) -> Node:
        rhs = self.nodes[mm.operands[1]]
        if rhs.kind != "input":
            raise ScheduleError(f"kernel {self.name}: matmul %{mm.id} needs a kernel input as its right operand; "
                                "fused kernels take weights from HBM (run the fuse pass to split kernels)")
        return rhs

    def _users(self, node_id: str) -> list[Node]:
        return [self.nodes[u] for u in self.g.users(node_id)]

    def _absorbed(self, node: Node) -> bool:
        """True when ``node`` is evaluated inside its only user's group (a PSUM term or a tree node)."""
        if node.kind not in ("matmul", "elementwise"):
            return False
        users = self._users(node.id)
        return (len(users) == 1 and users[0].kind == "elementwise"
                and annotation(users[0], "orient") == annotation(node, "orient"))

    def _term(self, node: Node) -> _Term | None:
        """The PSUM accumulator ``node`` can be, if it is a matmul or an add of such (else None)."""
        if node.kind == "matmul":
            return _Term(node, [node])
        if node.kind == "elementwise" and node.attrs["op"] == "add" and len(set(node.operands)) == 2:
            parts = [self.nodes[o] for o in node.operands]
            terms = [self._term(p) if self._absorbed(p) else None for p in parts]
            if all(terms):
                return _Term(node, [mm for t in terms for mm in t.matmuls])  # type: ignore[union-attr]
        return None

    def _groups(self) -> list[_Group]:
        """The groups, one per root (a value not absorbed into its user's group), in dependency order."""
        groups: list[_Group] = []
        done: set[str] = set()
        for node in self.g.compute_nodes():
            if self._absorbed(node):
                continue
            orient = annotation(node, "orient") or "normal"
            group = _Group(node, orient)
            term = self._term(node)
            if term is not None:
                group.terms.append(term)
            else:
                self._collect(node, group, done)
            if orient == "normal":
                users = self._users(node.id)
                if any(u.kind != "output" for u in users):
                    raise ScheduleError(f"kernel {self.name}: row-major %{node.id} is read inside the kernel; a "
                                        "row-major value can only be stored (run the fuse pass to split kernels)")
            done.add(node.id)
            groups.append(group)
        return groups

    def _collect(self, node: Node, group: _Group, done: set[str]) -> None:
        """Add ``node`` (an elementwise node of the group) and what it reads to ``group``."""
        for op_id in dict.fromkeys(node.operands):
            op = self.nodes[op_id]
            term = self._term(op) if self._absorbed(op) else None
            if term is not None:
                group.terms.append(term)
            elif op.kind == "elementwise" and self._absorbed(op):
                self._collect(op, group, done)
            elif op.kind == "input" or (group.orient == "transposed" and op.id in done
                                        and annotation(op, "orient") == "transposed"):
                if op not in group.operands:
                    group.operands.append(op)
            else:
                raise ScheduleError(f"kernel {self.name}: elementwise %{node.id} reads %{op_id}, which is neither "
                                    f"a matmul result, a kernel input nor a value held {group.orient}")
        group.tree.append(node)

    def _strip_inputs(self) -> list[Node]:
        """Kernel inputs held as transposed strips: matmul left operands and transposed groups' operands."""
        seen: dict[str, Node] = {}
        for group in self.group_list:
            for mm in group.matmuls:
                lhs = self.nodes[mm.operands[0]]
                if lhs.kind == "input":
                    seen.setdefault(lhs.id, lhs)
                elif annotation(lhs, "orient") != "transposed":
                    raise ScheduleError(f"kernel {self.name}: %{lhs.id} is not held transposed for matmul %{mm.id}")
            if group.orient == "transposed":
                for op in group.operands:
                    if op.kind == "input":
                        seen.setdefault(op.id, op)
        return list(seen.values())

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

    def _weight_dma(self, w: Node, dst: Ref, k0: Expr, ksz: Expr, c0: Expr, csz: Expr) -> DmaCopy:
        """Load weight rows ``k0:k0+ksz``, columns ``c0:c0+csz`` into ``dst`` [ksz, csz]; a weight stored
        transposed in HBM (W^T [N, K]) is read with a transposing DMA."""
        hbm = self.hbm[w.id]
        if w.attrs.get("layout") == "transposed":
            return DmaCopy(dst, Ref(hbm, (span(c0, csz), span(k0, ksz))), transpose=True)
        return DmaCopy(dst, Ref(hbm, (span(k0, ksz), span(c0, csz))))

    def _load_block(self, w: Node, buf: Buffer, kdim: Dim, fdim: Dim, blk: Expr, max_tiles: int) -> list[Stmt]:
        """DMAs filling ``buf[k, kt, :]`` with the weight columns of feature block ``blk``."""
        kt = iv("kt", kdim.tiles)
        ksz, k0 = kdim.tile_size(kt), kdim.tile_start(kt)
        if self.s.weight_dma == "row" or max_tiles == 1:
            cols = fdim.block_size(blk)
            dma = self._weight_dma(w, Ref(buf, (span(0, ksz), Point(kt), span(0, cols))), k0, ksz,
                                   fdim.block_start(blk), cols)
            return loop("kt", Lin(kdim.tiles), kdim.tiles, [dma])
        wt = iv("wt", max_tiles)
        g = fdim.tile_index(blk, wt)
        csz = fdim.tile_size(g)
        dma = self._weight_dma(w, Ref(buf, (span(0, ksz), Point(kt), span(scale(wt, fdim.tile), csz))), k0, ksz,
                               fdim.tile_start(g), csz)
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
        tp = Buffer(f"{inp.attrs['name']}_tpsum", (kdim.tile, tok.tile), inp.dtype, "psum")
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
        matmuls = group.matmuls
        ks = {-(-self.nodes[mm.operands[0]].shape[1] // K_TILE) for mm in matmuls}
        if (s.k_tiles_per_block <= 0 or len(ks) != 1 or any(len(t.matmuls) > 1 for t in group.terms)
                or any(self._cache(mm) for mm in matmuls)):
            return 0
        k_tiles = ks.pop()
        return s.k_tiles_per_block if s.k_tiles_per_block < k_tiles else 0

    def _tiles_per_block(self, group: _Group, tile: int, ntiles: int) -> int:
        """Output tiles per weight block of a group: as many as ``weight_block_kib`` holds with all the
        contraction rows of its longest matmul; all of them when the group has no matmul."""
        if not group.matmuls:
            return ntiles
        k_tiles = max(-(-self.nodes[mm.operands[0]].shape[1] // K_TILE) for mm in group.matmuls)
        return tiles_per_weight_block(self.s, k_tiles, tile, self.dtype_bytes, ntiles)

    def _weight_sources(self, group: _Group, fdim: Dim, blk: Expr) -> tuple[list[Stmt], dict[str, tuple[Buffer, bool]]]:
        """(loads of the block's weights, matmul id -> (buffer, whether it holds all columns))."""
        loads: list[Stmt] = []
        sources: dict[str, tuple[Buffer, bool]] = {}
        for mm in group.matmuls:
            more, buf, whole = self._weights(mm, fdim, blk)
            loads += more
            sources[mm.id] = (buf, whole)
        return loads, sources

    def _term_tiles(self, group: _Group, sources: dict[str, tuple[Buffer, bool]], fdim: Dim, g: Expr,
                    local: Expr, nsz: Expr, tile: Expr, tsz: Expr, row_major: bool
                    ) -> tuple[list[Stmt], dict[str, Ref]]:
        """PSUM tiles of every term of the group for one output tile."""
        out: list[Stmt] = []
        values: dict[str, Ref] = {}
        s = self.s
        for term in group.terms:
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
                    mmul = Matmul(dst, x, w)
                else:
                    x = Ref(self.strips[lhs.id], (span(0, ksz), Point(kt), span(0, tsz)))
                    mmul = Matmul(dst, w, x)
                out += loop("kt", Lin(kdim.tiles), kdim.tiles, [mmul])
            values[term.node.id] = dst
        return out, values

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
            per_block = max(1, min(by_sbuf, GROUP_PSUM_BANKS // len(group.terms)))
        else:
            per_block = self._tiles_per_block(group, ftile, ntiles)
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
        spill = Buffer(f"{root.id}_spill", (fdim.tile, s.tokens_per_block), "float32", "sbuf")
        out += [Alloc(t) for t in temps.values()]
        if any(self._two_psum_operands(node, group) for node in group.tree):
            out.append(Alloc(spill))
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
        operands = {op.id: Ref(self.strips[op.id], (span(0, nsz), Point(g), span(0, bm))) for op in group.operands}
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
        tile += ([Alloc(out_strip)] if streamed else []) + self._epilogue(group, values, result, temps, spill,
                                                                          (nsz, bm)) + store
        block += loop("ft", fdim.tiles_in(fb), fdim.tiles_in_block, tile)
        out += [Comment(self._describe_group(group))]
        out += loop("f_blk", Lin(fdim.blocks), fdim.blocks, block)
        if root.id in self.out_hbm and not streamed:
            out += self._store_strip(root, out_strip, fdim, mb)
        return out

    def _k_blocked_matmuls(self, group: _Group, fdim: Dim, fb: Expr, ft: Expr, nsz: Expr, bm: Expr,
                           kb: int) -> tuple[dict[str, Ref], list[Stmt]]:
        """PSUM accumulators of the feature block, then the K-block loop: load weight rows, matmul."""
        lhs0 = self.nodes[group.matmuls[0].operands[0]]
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
        for leaf in group.matmuls:
            w = self._weight(leaf)
            psum = Buffer(f"{leaf.id}_psum", (fdim.tile, fdim.tiles_in_block, PSUM_BANK_FP32), "float32", "psum")
            allocs.append(Alloc(psum, accumulator=True, comment="one PSUM bank per feature tile, across K blocks"))
            wbuf = Buffer(f"{w.attrs['name']}_block", (kdim.tile, kb, fdim.block_elems), w.dtype, "sbuf")
            loads.append(Alloc(wbuf))
            if self.s.weight_dma == "row" or fdim.tiles_in_block == 1:
                cols = fdim.block_size(fb)
                dma = self._weight_dma(w, Ref(wbuf, (span(0, ksz), Point(kt), span(0, cols))), kdim.tile_start(gk),
                                       ksz, fdim.block_start(fb), cols)
                loads += loop("kt", kdim.tiles_in(kblk), kb, [dma])
            else:
                wt = iv("wt", fdim.tiles_in_block)
                gw = fdim.tile_index(fb, wt)
                csz = fdim.tile_size(gw)
                dma = self._weight_dma(w, Ref(wbuf, (span(0, ksz), Point(kt), span(scale(wt, fdim.tile), csz))),
                                       kdim.tile_start(gk), ksz, fdim.tile_start(gw), csz)
                loads += loop("wt", fdim.tiles_in(fb), fdim.tiles_in_block, loop("kt", kdim.tiles_in(kblk), kb, [dma]))
            dst = Ref(psum, (span(0, nsz), Point(ft), span(0, bm)))
            mm = Matmul(dst, Ref(wbuf, (span(0, ksz), Point(kt), span(scale(ft, fdim.tile), nsz))),
                        Ref(self.strips[self.nodes[leaf.operands[0]].id], (span(0, ksz), Point(gk), span(0, bm))))
            tile += loop("kt", kdim.tiles_in(kblk), kb, [mm])
            values[leaf.id] = dst
        body = loads + loop("ft", fdim.tiles_in(fb), fdim.tiles_in_block, tile)
        return values, allocs + loop("k_blk", Lin(kdim.blocks), kdim.blocks, body)

    def _epilogue(self, group: _Group, values: dict[str, Ref], result: Ref, temps: dict[str, Buffer],
                  spill: Buffer, sizes: tuple[Expr, Expr]) -> list[Stmt]:
        """Evaluate the group's elementwise tree on its tiles (PSUM terms, SBUF operands), writing the
        root into ``result``."""
        out: list[Stmt] = []
        values = dict(values)
        root = group.root
        rows, cols = sizes
        if not group.tree:
            return [Copy(result, values[root.id])]
        for node in group.tree:
            dst = result if node is root else Ref(temps[node.id], (span(0, rows), span(0, cols)))
            ops = [values[o] for o in node.operands]
            op = node.attrs["op"]
            if op == "silu":
                out.append(Activation(dst, ops[0], "silu"))
            else:
                if all(r.buffer.memory == "psum" for r in ops):
                    moved = Ref(spill, (span(0, rows), span(0, cols)))
                    out.append(Copy(moved, ops[1]))  # a vector op reads at most one PSUM operand
                    ops[1] = moved
                out.append(TensorTensor(dst, ops[0], ops[1], op))  # type: ignore[arg-type]
            values[node.id] = dst
        return out

    def _describe_group(self, group: _Group) -> str:
        """One line saying what the group computes and how (for the emitted kernel's readers)."""
        def product(term: _Term) -> str:
            return " + ".join(f"{mm.operands[0]} @ {self._weight(mm).attrs['name']}" for mm in term.matmuls)

        how = ("weight tiles stationary, strips moving (implicit transposition)" if group.orient == "transposed"
               else "strips stationary, weights moving")
        mark = "^T" if group.orient == "transposed" else ""
        if not group.terms and not group.tree:
            return f"{group.root.id} copied"
        if not group.tree:
            term = group.terms[0]
            summed = " (summed in one PSUM accumulator)" if len(term.matmuls) > 1 else ""
            return f"{term.node.id}{mark} = ({product(term)}){mark}{summed}: {how}"
        terms = ", ".join(f"{t.node.id} = {product(t)}" for t in group.terms)
        reads = ", ".join(op.id for op in group.operands)
        ops = " then ".join(f"{node.attrs['op']}" for node in group.tree)
        sources = "; ".join(part for part in (f"PSUM tiles of {terms}" if terms else "",
                                              f"tiles of {reads}" if reads else "") if part)
        return f"{group.root.id}{mark} from {sources} ({ops} on the eviction)"

    def _two_psum_operands(self, node: Node, group: _Group) -> bool:
        terms = {t.node.id for t in group.terms}
        return node.attrs.get("op") != "silu" and all(o in terms for o in node.operands)

    def _store_strip(self, node: Node, strip: Buffer, fdim: Dim, mb: Expr) -> list[Stmt]:
        out: list[Stmt] = []
        for out_node, hbm in self.out_hbm[node.id]:
            if out_node.attrs.get("layout") != "transposed":
                raise ScheduleError(f"kernel {self.name}: output {out_node.attrs['name']} is held transposed but "
                                    "declared row-major; run the implicit-transpose pass")
            nt = iv("nt", fdim.tiles)
            nsz = fdim.tile_size(nt)
            t0, bm = self.tok.block_start(mb), self.tok.block_size(mb)
            dma = DmaCopy(Ref(hbm, (span(fdim.tile_start(nt), nsz), span(t0, bm))),
                          Ref(strip, (span(0, nsz), Point(nt), span(0, bm))))
            out += [Comment(f"store {out_node.attrs['name']} (transposed in HBM)"),
                    *loop("nt", Lin(fdim.tiles), fdim.tiles, [dma])]
        return out

    def row_major_group(self, group: _Group, mb: Expr, tok: Dim | None = None,
                        outputs: list[tuple[Node, Buffer]] | None = None) -> list[Stmt]:
        """A group held row-major (tokens on partitions), stored row by row to its outputs (default:
        every output of its root) over the token dimension ``tok`` (default: the kernel's)."""
        s, root = self.s, group.root
        tok = tok or self.tok
        if outputs is None:
            if root.id not in self.out_hbm:
                raise ScheduleError(f"kernel {self.name}: row-major %{root.id} must feed a kernel output")
            outputs = self.out_hbm[root.id]
        stores = [(o, hbm) for o, hbm in outputs if o.attrs.get("layout") != "transposed"]
        flipped = [(o, hbm) for o, hbm in outputs if o.attrs.get("layout") == "transposed"]
        out_dtype = outputs[0][0].dtype
        n = root.shape[1]
        tile_n = min(s.out_tile, n)
        ntiles = -(-n // tile_n)
        odim = Dim("o", n, tile_n, ntiles, self._tiles_per_block(group, tile_n, ntiles))
        ob = iv("o_blk", odim.blocks)
        loads, sources = self._weight_sources(group, odim, ob)
        tt = iv("tt", tok.tiles_in_block)
        tg = tok.tile_index(mb, tt)
        tsz = tok.tile_size(tg)
        bn = iv("bn", odim.tiles_in_block)
        g = odim.tile_index(ob, bn)
        nsz = odim.tile_size(g)
        name = outputs[0][0].attrs["name"]
        rows = Buffer(f"{name}_rows", (tok.tile, odim.block_elems), out_dtype, "sbuf")
        per_tile, values = self._term_tiles(group, sources, odim, g, scale(bn, tile_n), nsz, tt, tsz, row_major=True)
        for op in group.operands:
            buf = Buffer(f"{op.attrs['name']}_rowtile", (tok.tile, tile_n), op.dtype, "sbuf")
            dst = Ref(buf, (span(0, tsz), span(0, nsz)))
            hbm = self.hbm[op.id]
            t0, c0 = tok.tile_start(tg), odim.tile_start(g)
            if op.attrs.get("layout") == "transposed":
                dma = DmaCopy(dst, Ref(hbm, (span(c0, nsz), span(t0, tsz))), transpose=True)
            else:
                dma = DmaCopy(dst, Ref(hbm, (span(t0, tsz), span(c0, nsz))))
            per_tile += [Alloc(buf), dma]
            values[op.id] = dst
        temps = {node.id: Buffer(f"{node.id}_f32", (tok.tile, tile_n), "float32", "sbuf")
                 for node in group.tree if node is not root}
        spill = Buffer(f"{root.id}_spill", (tok.tile, tile_n), "float32", "sbuf")
        per_tile += [Alloc(t) for t in temps.values()]
        if any(self._two_psum_operands(node, group) for node in group.tree):
            per_tile.append(Alloc(spill))
        result = Ref(rows, (span(0, tsz), span(scale(bn, tile_n), nsz)))
        per_tile += self._epilogue(group, values, result, temps, spill, (tsz, nsz))
        for out_node, hbm in flipped:
            per_tile += self._transposed_store(out_node, hbm, rows, odim, g, scale(bn, tile_n), tok, tg, tsz)
        cols = odim.block_size(ob)
        store = [DmaCopy(Ref(hbm, (span(tok.tile_start(tg), tsz), span(odim.block_start(ob), cols))),
                         Ref(rows, (span(0, tsz), span(0, cols)))) for _, hbm in stores]
        token_tile = [Alloc(rows, comment="one packed row of output tiles"),
                      *loop("bn", odim.tiles_in(ob), odim.tiles_in_block, per_tile), *store]
        body = loads + loop("tt", tok.tiles_in(mb), tok.tiles_in_block, token_tile)
        names = ", ".join(o.attrs["name"] for o, _ in outputs)
        return [Comment(f"{names} = {self._describe_group(group)}"),
                *loop("o_blk", Lin(odim.blocks), odim.blocks, body)]

    def _transposed_store(self, out_node: Node, hbm: Buffer, rows: Buffer, odim: Dim, g: Expr, col: Expr,
                          tok: Dim, tg: Expr, tsz: Expr) -> list[Stmt]:
        """Store output tile ``g`` of a row-major value to an output declared transposed: TensorE
        transposes of 128-column chunks of the packed row, each stored as rows of the output."""
        n = odim.size
        if odim.tile <= FEATURE_TILE:
            cdim = Dim("c", n, odim.tile, odim.tiles, 1)
        elif odim.tiles == 1 or odim.tile % FEATURE_TILE == 0:
            cdim = Dim("c", n, FEATURE_TILE, -(-n // FEATURE_TILE), -(-odim.tile // FEATURE_TILE))
        else:
            raise ScheduleError(f"kernel {self.name}: output {out_node.attrs['name']} is stored transposed from "
                                f"row-major tiles of {odim.tile} columns; use an out_tile of at most 128 or a "
                                "multiple of 128")
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
        rdim = Dim("r", rows, min(K_TILE, rows), -(-rows // K_TILE), 1)
        width = min(PSUM_BANK_FP32, cols)
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

    def program(self) -> Program:
        tok = self.tok
        body: list[Stmt] = [Comment(f"schedule: {self.s.describe()}")]
        body += self.cached_weights()
        mb = iv("m_blk", tok.blocks)
        block: list[Stmt] = []
        for inp in self.strip_inputs:
            block += self.load_strip(inp, mb)
        for group in self.group_list:
            block += (self.transposed_group(group, mb) if group.orient == "transposed"
                      else self.row_major_group(group, mb))
        if block:
            body += loop("m_blk", Lin(tok.blocks), tok.blocks, block, comment="blocks of tokens")
        outs = [hbm for n in self.outputs for node, hbm in self.out_hbm[n.operands[0]] if node is n]
        for copy in self.copies:
            inp = copy.root
            same = [(o, h) for o, h in self.out_hbm[inp.id] if o.attrs.get("layout") == inp.attrs.get("layout")]
            other = [(o, h) for o, h in self.out_hbm[inp.id] if o.attrs.get("layout") != inp.attrs.get("layout")]
            for out_node, hbm in same:
                body += self._plain_copy(inp, out_node, hbm)
            if other:  # the other layout: through row tiles, as a row-major group over the input's own rows
                rows = inp.shape[0]
                tiles = -(-rows // tok.tile)
                body += self.row_major_group(copy, Lin(0), Dim("t", rows, min(tok.tile, rows), tiles, tiles), other)
        params = list({self.hbm[n.id].name: self.hbm[n.id] for n in self.inputs}.values())  # views share arrays
        args = ", ".join(f"{p.name}{list(p.shape)}" for p in params)
        results = ", ".join(f"{o.name}{list(o.shape)}" for o in outs)
        doc = (f"Fused kernel {self.name} over {self.tokens} tokens ({self.dtype}).\n"
               f"Arguments: {args}. Returns {results}.")
        return Program(self.name, params, outs, body, doc=doc)


def lower_fused_kernel(graph: Graph, schedule: FusedSchedule, name: str | None = None) -> Program:
    """The loop-nest program of one kernel subgraph (annotated by the fusion passes)."""
    return _FusedLowering(graph, schedule, name or f"{graph.name}_kernel").program()

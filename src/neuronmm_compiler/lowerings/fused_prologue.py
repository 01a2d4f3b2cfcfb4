"""The norm prologue of a fused kernel: residual add, the sum stored, RMSNorm or LayerNorm, and the X^T strip.

Part of the fused lowering (:mod:`.lower_fused`). A ``norm`` node whose readers are matmuls (the gate and up
projections of an MLP) is held as a transposed strip like a kernel input, but its strip is made on chip, per
tile of ``token_tile`` tokens (docs/fusion.md, "The norm prologue"):

1. the row tile of ``x`` (tokens on partitions, all H columns on the free axis) is loaded as stored; with a
   residual, the residual's row tile too, and the VectorEngine adds them (``tensor_tensor``); the sum is stored
   to every output that returns it (under an LNC=2 split other than ``tokens``, each program stores its half of
   the columns, so no HBM element is written twice);
2. the per-token statistics are reduced along the free axis, each partition on its own: RMSNorm squares and
   sums in one ScalarEngine instruction (``activation_reduce``), then ``rsqrt(sum / H + eps)``
   (``activation`` with a scale and an ``eps`` column as bias); LayerNorm takes ``bn_stats`` of chunks of at
   most ``bn_stats_fmax`` columns, ``bn_aggr`` for mean and variance, then ``rsqrt(var + eps)``;
3. the rows are normalized in one instruction: ``x * rstd`` (``activation`` with a per-partition scale) or
   ``(x - mean) * rstd`` (``tensor_scalar``);
4. TensorE transposes each ``[tokens, 128]`` chunk into PSUM, and the eviction into the strip applies gamma
   (and beta): after the transpose the features are on partitions, so gamma is one value per partition, an
   ``activation`` scale (and bias) at no extra cost, as nki-library's CTE kernel applies it during its transpose
   (aws-neuron/nki-library@d2ad3a579498d1888aa8740af97fd325dd5f2740,
   src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte.py, "Apply norm weights (gamma) and norm bias").

The transposes are always TensorE transposes (the normalized tile is in SBUF; a transposing DMA reads HBM), so
``x_transpose`` does not apply to a normalized strip. gamma and beta are loaded once, before the token loop, as
``[128, H/128]`` columns (column ``kt`` holds the ``kt``-th 128 of them on partitions).
"""

from __future__ import annotations

from ..errors import ScheduleError
from ..ir import Node
from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Expr, Lin, scale
from ..kernel_ir.program import (
    Activation,
    ActivationReduce,
    Alloc,
    BnAggr,
    BnStats,
    Buffer,
    Copy,
    DmaCopy,
    Memset,
    PeTranspose,
    Point,
    Ref,
    Stmt,
    TensorScalar,
    TensorTensor,
    span,
)
from ..vocab import ElementwiseOp, Layout, NodeKind, NormOp
from .fused_groups import Group
from .fused_operands import OperandLoads

#: Values per partition of one bn_stats result and of bn_aggr's (NKI ISA reference, nki.isa.bn_stats / bn_aggr).
BN_STATS_WIDTH = 6
BN_AGGR_WIDTH = 2


class NormPrologue(OperandLoads):
    """The strips of ``norm`` nodes, made from row tiles (see the module docstring)."""

    prologues: list[Group]

    def _prologue_parts(self, group: Group) -> tuple[Node, Node | None, list[Node], list[Node]]:
        """(the norm, its residual add or None, the inputs whose rows it loads, gamma and beta)."""
        norm = group.root
        source = self.nodes[norm.operands[0]]
        add = source if source.kind == NodeKind.ELEMENTWISE else None
        rows = [self.nodes[o] for o in add.operands] if add is not None else [source]
        params = [self.nodes[o] for o in norm.operands[1:]]
        for node in (*rows, *params):
            if node.kind != NodeKind.INPUT:
                raise ScheduleError(f"kernel {self.name}: the norm prologue of %{norm.id} reads %{node.id}, which is "
                                    "not a kernel input (passes/legality.py, rule 'prologue')")
        for node in rows:
            if node.layout != Layout.ROW_MAJOR:
                raise ScheduleError(f"kernel {self.name}: the norm prologue of %{norm.id} reads rows of "
                                    f"{node.attrs['name']}, stored transposed; it normalizes row tiles (tokens on "
                                    "partitions), so the input must be row_major")
        return norm, add, rows, params

    def _param_cols(self, param: Node) -> Buffer:
        pmax = self.target.pmax
        h = param.shape[0]
        return Buffer(f"{param.attrs['name']}_cols", (min(pmax, h), -(-h // pmax)), param.dtype, "sbuf")

    def _eps_col(self, norm: Node) -> Buffer:
        return Buffer(f"{norm.id}_cols", (min(self.target.pmax, self.tok.tile), 1), "float32", "sbuf")

    def prologue_constants(self) -> list[Stmt]:
        """Before the token loop: each norm's eps column and its gamma/beta columns, loaded once."""
        out: list[Stmt] = []
        for group in self.prologues:
            norm, _, _, params = self._prologue_parts(group)
            eps = self._eps_col(norm)
            out += [Alloc(eps, comment=f"{norm.id}: eps = {norm.attrs['eps']} per partition (the rsqrt bias)"),
                    Memset(Ref(eps, (span(0, eps.shape[0]), span(0, 1))), float(norm.attrs["eps"]))]
            for param in params:
                cols = self._param_cols(param)
                if any(isinstance(s, Alloc) and s.buffer == cols for s in out):
                    continue
                kdim = self._kdim(param.shape[0])
                kt = iv("kt", kdim.tiles)
                ksz = kdim.tile_size(kt)
                dma = DmaCopy(Ref(cols, (span(0, ksz), Point(kt))),
                              Ref(self.hbm[param.id], (span(kdim.tile_start(kt), ksz),)))
                out += [Alloc(cols, comment=f"{param.attrs['name']}: column kt holds features kt*128.. on partitions"),
                        *loop("kt", Lin(kdim.tiles), kdim.tiles, [dma])]
        return out

    def _sum_stores(self, add: Node, rows: Buffer, t0: Expr, tsz: Expr) -> list[Stmt]:
        """Stores of the residual sum's row tile to every output returning it. Under an LNC=2 split other than
        ``tokens`` both programs compute the tile, so each stores its half of the columns."""
        h = add.shape[1]
        out: list[Stmt] = []
        halves = self.target.lnc == 2 and self.s.lnc_split not in ("none", "tokens") and h % 2 == 0
        for _, hbm in self.out_hbm.get(add.id, []):
            if not halves:
                out.append(DmaCopy(Ref(hbm, (span(t0, tsz), span(0, h))), Ref(rows, (span(0, tsz), span(0, h)))))
                continue
            half = h // 2
            hv = iv("hv", 2)
            c0 = scale(hv, half)
            dma = DmaCopy(Ref(hbm, (span(t0, tsz), span(c0, half))), Ref(rows, (span(0, tsz), span(c0, half))))
            out += loop("hv", Lin(2), 2, [dma], comment="each program of the logical core stores half the columns",
                        split=(self.s.lnc_split,))
        return out

    def _normalize(self, norm: Node, src: Buffer, normed: Buffer, tsz: Expr) -> list[Stmt]:
        """Statistics of each row of ``src`` and the normalized rows into ``normed`` (gamma not yet applied)."""
        h = norm.shape[1]
        op = NormOp(norm.attrs["norm"])
        rows = (span(0, tsz), span(0, h))
        eps = Ref(self._eps_col(norm), (span(0, tsz), span(0, 1)))
        if op is NormOp.RMSNORM:
            stats = Buffer(f"{norm.id}_stats", (self.tok.tile, 2), "float32", "sbuf")

            def col(i: int) -> Ref:
                return Ref(stats, (span(0, tsz), span(i, 1)))

            return [Alloc(stats, comment="per token: sum of squares, then 1/sqrt(mean + eps)"),
                    ActivationReduce(Ref(normed, rows), Ref(src, rows), "square", col(0)),
                    Activation(col(1), col(0), "rsqrt", scale=1.0 / h, bias=eps),
                    Activation(Ref(normed, rows), Ref(src, rows), "copy", scale=col(1))]
        fmax = self.target.bn_stats_fmax
        chunks = -(-h // fmax)
        width = chunks * BN_STATS_WIDTH
        stats = Buffer(f"{norm.id}_stats", (self.tok.tile, width + BN_AGGR_WIDTH + 1), "float32", "sbuf")

        def col(i: int, n: int = 1) -> Ref:
            return Ref(stats, (span(0, tsz), span(i, n)))

        cdim = Dim("c", h, min(fmax, h), chunks, chunks)
        ct = iv("ct", chunks)
        stat = BnStats(Ref(stats, (span(0, tsz), span(scale(ct, BN_STATS_WIDTH), BN_STATS_WIDTH))),
                       Ref(src, (span(0, tsz), span(cdim.tile_start(ct), cdim.tile_size(ct)))))
        mean, var, rstd = col(width), col(width + 1), col(width + 2)
        note = f"per token: bn_stats of {chunks} chunk(s), then mean, variance, 1/sqrt(var + eps)"
        return [Alloc(stats, comment=note),
                *loop("ct", Lin(chunks), chunks, [stat]),
                BnAggr(col(width, BN_AGGR_WIDTH), col(0, width)),
                Activation(rstd, var, "rsqrt", bias=eps),
                TensorScalar(Ref(normed, rows), Ref(src, rows), "subtract", mean, "multiply", rstd)]

    def load_normed_strip(self, group: Group, mb: Expr) -> list[Stmt]:
        """The strip of a norm: [H on partitions (tiles), tokens of the block], made per token tile."""
        norm, add, row_inputs, params = self._prologue_parts(group)
        tok = self.tok
        h = norm.shape[1]
        kdim = self._kdim(h)
        buf = self._strip(norm.id, h)
        tt = iv("tt", tok.tiles_in_block)
        tg = tok.tile_index(mb, tt)
        tsz, t0 = tok.tile_size(tg), tok.tile_start(tg)
        body: list[Stmt] = []
        loaded: list[Buffer] = []
        for inp in row_inputs:
            rows = Buffer(f"{inp.attrs['name']}_rows", (tok.tile, h), inp.dtype, "sbuf")
            loaded.append(rows)
            body += [Alloc(rows, comment="tokens on partitions, as stored"),
                     DmaCopy(Ref(rows, (span(0, tsz), span(0, h))), Ref(self.hbm[inp.id], (span(t0, tsz), span(0, h))))]
        src = loaded[0]
        if add is not None:
            src = Buffer(f"{add.id}_rows", (tok.tile, h), add.dtype, "sbuf")
            whole = (span(0, tsz), span(0, h))
            body += [Alloc(src, comment=f"{add.id} = residual sum (stored, then normalized)"),
                     TensorTensor(Ref(src, whole), Ref(loaded[0], whole), Ref(loaded[1], whole), ElementwiseOp.ADD),
                     *self._sum_stores(add, src, t0, tsz)]
        normed = Buffer(f"{norm.id}_rows", (tok.tile, h), buf.dtype, "sbuf")  # float32 when FP8 quantizes it
        body += [Alloc(normed, comment=f"{norm.id}: normalized rows (gamma applied on the transposes' eviction)"),
                 *self._normalize(norm, src, normed, tsz)]
        kt = iv("kt", kdim.tiles)
        ksz, k0 = kdim.tile_size(kt), kdim.tile_start(kt)
        tp = Buffer(f"{norm.id}_tpsum", (kdim.tile, tok.tile), buf.dtype, "psum")
        dst = Ref(buf, (span(0, ksz), Point(kt), span(scale(tt, tok.tile), tsz)))
        transposed = Ref(tp, (span(0, ksz), span(0, tsz)))
        if params:
            gamma = Ref(self._param_cols(params[0]), (span(0, ksz), span(kt, 1)))
            beta = Ref(self._param_cols(params[1]), (span(0, ksz), span(kt, 1))) if len(params) > 1 else None
            evict: Stmt = Activation(dst, transposed, "copy", scale=gamma, bias=beta)
        else:
            evict = Copy(dst, transposed)
        body += loop("kt", Lin(kdim.tiles), kdim.tiles, [
            Alloc(tp),
            PeTranspose(transposed, Ref(normed, (span(0, tsz), span(k0, ksz)))),
            evict,
        ], split=self._strip_split(norm))
        out: list[Stmt] = [Alloc(buf, comment=f"{norm.id}^T strip: normalized features on partitions, tokens free")]
        return out + loop("tt", tok.tiles_in(mb), tok.tiles_in_block, body)

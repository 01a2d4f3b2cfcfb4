"""The epilogue of a fused kernel's groups: the elementwise tree evaluated on the PSUM eviction, and the FP8 scales
it reads (docs/quantization.md, "The kernel").

Part of the fused lowering (:mod:`.lower_fused`), shared by transposed and row-major groups. Every scale is loaded
once per kernel (:meth:`Epilogues.scale_constants`). In a transposed group, where every scale is a per-partition
column, a dequantization whose value only feeds a ScalarE function (``silu(gate)``) or a requantization
(``quantize(dequantize(acc))``, ``quantize(a * dequantize(acc))``) is *folded* (:class:`ScaleFold`): its weight
and activation scales, and the static scale of that requantization, are combined into one column per feature tile
once per kernel, ``c = s_w * s_x`` (``/ s_q``). Each output tile then pays one multiply instead of a multiply, a
divide and a second clamp instruction: ``silu(acc * c)`` in the activation's own ``scale=`` (no VectorE
instruction), or ``acc * c`` on the ScalarE (an activation copy with ``scale=c``, as nki-library's FP8 prefill MLP
evicts its static dequantization: ``core/mlp/mlp_cte/mlp_cte_projection.py:453-460``) and then the clamp
``min(max)`` into the FP8 tile in one VectorE ``tensor_scalar``: the VectorE keeps the product and the clamp.

Each scale still reaches the product exactly once (rule NMMC-FP8-SCALE-ONCE: ``c`` carries the product of the
scales' units). The fp32 roundings move by an ulp, so a quantized element lying within that ulp of a rounding tie
can land on its other FP8 neighbour (verified against the float64 quantized graph). nki-library's FP8 QKV kernels
combine the same way, once per kernel: "pre-apply input scales onto the weight scaling" and "Compute reciprocal once
for quantization: 1/scale" (aws-neuron/nki-library@d2ad3a579498d1888aa8740af97fd325dd5f2740,
src/nkilib_src/nkilib/core/qkv/qkv_cte.py:686-690, qkv_tkg.py:304; the mlp_cte path above is in the same
repository). Row-major groups (per-channel scales along the free axis) keep :meth:`Epilogues._fp8_op`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir import Node
from ..ir.fp8 import FP8_FORMATS
from ..kernel_ir.expr import Expr
from ..kernel_ir.program import (
    Activation,
    Alloc,
    Buffer,
    Copy,
    DmaCopy,
    PeTranspose,
    Ref,
    Stmt,
    TensorScalar,
    TensorTensor,
    span,
)
from ..vocab import ElementwiseOp, NodeKind, Orient
from .fused_groups import Group
from .fused_operands import FusedState


@dataclass(frozen=True)
class ScaleFold:
    """A dequantize node of a transposed group evaluated with one combined scale column (module docstring):
    ``activation``, the ScalarE function that applies it with its ``scale=``; or ``quantize``, the requantization
    whose division it carries (that quantize is then the clamp only)."""

    dequantize: Node
    activation: Node | None = None
    quantize: Node | None = None

    @property
    def key(self) -> str:
        """The key of the combined column in an epilogue's values."""
        return f"{self.dequantize.id}@scale"


def _op(node: Node) -> ElementwiseOp | None:
    return ElementwiseOp.lookup(node.attrs.get("op")) if node.kind == NodeKind.ELEMENTWISE else None


class Epilogues(FusedState):
    """Scales on chip and the elementwise tree on the eviction."""

    scales: dict[str, Node]  # scale input id -> node (set by the lowering)
    folds: dict[str, ScaleFold]  # dequantize id -> its fold (empty until scale_constants plans them)

    def _static(self, scale_id: str) -> bool:
        return scale_id in self.scales and self.nodes[scale_id].shape == (1, 1)

    def _requantizes(self, value: Node, group_ids: set[str]) -> Node | None:
        """The static per-tensor quantize in the same group that is ``value``'s only user, if any."""
        users = self._users(value.id)
        if len(users) != 1 or users[0].id not in group_ids or _op(users[0]) != ElementwiseOp.QUANTIZE:
            return None
        quantize = users[0]
        return quantize if self._static(quantize.operands[1]) else None

    def plan_folds(self) -> dict[str, ScaleFold]:
        """The dequantizations of transposed groups that :class:`ScaleFold` applies to."""
        folds: dict[str, ScaleFold] = {}
        taken: set[str] = set()
        for group in self.group_list:
            if group.orient != Orient.TRANSPOSED:
                continue
            ids = {n.id for n in group.tree}
            terms = {t.node.id for t in group.terms}
            for node in group.tree:
                if _op(node) != ElementwiseOp.DEQUANTIZE:
                    continue
                acc, x_scale, w_scale = node.operands
                users = self._users(node.id)
                if acc not in terms or not self._static(x_scale) or w_scale not in self.scales or len(users) != 1 \
                        or users[0].id not in ids:
                    continue
                user, op = users[0], _op(users[0])
                if op is not None and op.unary and not op.fp8:  # a ScalarE function (silu)
                    folds[node.id] = ScaleFold(node, activation=user)
                    continue
                quantize = user if op == ElementwiseOp.QUANTIZE else (
                    self._requantizes(user, ids) if op == ElementwiseOp.MULTIPLY else None)
                if quantize is not None and self._static(quantize.operands[1]) and quantize.id not in taken:
                    taken.add(quantize.id)
                    folds[node.id] = ScaleFold(node, quantize=quantize)
        return folds

    def _evaluated(self, group: Group, values: dict[str, Ref], result: Ref, shape: tuple[int, int],
                   sizes: tuple[Expr, Expr]) -> list[Stmt]:
        """:meth:`_epilogue` with its scratch allocated: an fp32 tile of ``shape`` per intermediate node and, when an
        op reads two PSUM operands, the spill tile, then the ops writing ``result``."""
        root = group.root
        temps = {node.id: Buffer(f"{node.id}_f32", shape, "float32", "sbuf") for node in group.tree if node is not root}
        spill = Buffer(f"{root.id}_spill", shape, "float32", "sbuf")
        out: list[Stmt] = [Alloc(t) for t in temps.values()]
        if any(self._two_psum_operands(node, group) for node in group.tree):
            out.append(Alloc(spill))
        return out + self._epilogue(group, values, result, temps, spill, sizes)

    def _epilogue(self, group: Group, values: dict[str, Ref], result: Ref, temps: dict[str, Buffer],
                  spill: Buffer, sizes: tuple[Expr, Expr]) -> list[Stmt]:
        """Evaluate the group's elementwise tree on its tiles (PSUM terms, SBUF operands), writing the
        root into ``result``."""
        out: list[Stmt] = []
        values = dict(values)
        root = group.root
        rows, cols = sizes
        if not group.tree:  # the value itself (already there when PE column tiles' sums were added into it)
            return [] if values[root.id] is result else [Copy(result, values[root.id])]
        clamps = {f.quantize.id for f in self.folds.values() if f.quantize is not None}
        deferred: dict[str, tuple[Ref, Ref]] = {}  # a folded dequantize -> (its accumulator, its combined column)
        for node in group.tree:
            dst = result if node is root else Ref(temps[node.id], (span(0, rows), span(0, cols)))
            op = ElementwiseOp(node.attrs["op"])
            prefold = self._prefold(node, values, dst)
            if prefold is not None:  # a dequantization the activation reading it finishes with its scale=
                out += prefold[0]
                deferred[node.id] = prefold[1]
                continue
            fold = self.folds.get(node.id)
            if fold is not None and fold.activation is not None:  # applied by the activation's scale=
                deferred[node.id] = (values[node.operands[0]], values[fold.key])
                continue
            if op.unary and node.operands[0] in deferred:
                acc, combined = deferred[node.operands[0]]
                out.append(Activation(dst, acc, op, scale=combined))
                values[node.id] = dst
                continue
            ops = [values[o] for o in node.operands]
            if fold is not None:  # dequantized and divided by the requantization's scale in one ScalarE multiply
                out.append(Activation(dst, ops[0], "copy", scale=values[fold.key]))
            elif node.id in clamps:  # the division is in the folded column: only the clamp is left
                fmax = FP8_FORMATS[node.attrs["dtype"]].max
                out.append(TensorScalar(dst, ops[0], "minimum", fmax, "maximum", -fmax))
            elif op.scaled:
                out += self._fp8_op(node, op, dst, ops, Ref(spill, (span(0, rows), span(0, cols))))
            elif op.unary:
                out.append(Activation(dst, ops[0], op))
            else:
                if all(r.buffer.memory == "psum" for r in ops):
                    moved = Ref(spill, (span(0, rows), span(0, cols)))
                    out.append(Copy(moved, ops[1]))  # a vector op reads at most one PSUM operand
                    ops[1] = moved
                out.append(TensorTensor(dst, ops[0], ops[1], op))
            values[node.id] = dst
        return out

    def _prefold(self, node: Node, values: dict[str, Ref], dst: Ref) -> tuple[list[Stmt], tuple[Ref, Ref]] | None:
        """(statements, (source, scale)) when ``node`` is a dequantization whose reader, a ScalarE function, applies
        its last scale with its ``scale=`` after the statements wrote the rest into ``source`` (``dst``); None
        otherwise (here always: lowerings/row_scales.py has the ones of per-token scales)."""
        return None

    def _fp8_op(self, node: Node, op: ElementwiseOp, dst: Ref, ops: list[Ref], scratch: Ref) -> list[Stmt]:
        """``quantize``: ``(x / scale) min max`` into fp32 scratch, then ``max -max`` into the FP8 tile (a clamp
        before the cast, as nki-library's static quantization; rule NKI-FP8-SATURATE). ``dequantize``: the FP8
        matmul's PSUM tile times the weight scale (a column, or a broadcast row of per-channel scales along the
        free axis) and the activation scale, on its eviction: the scales applied once per output tile."""
        if op == ElementwiseOp.QUANTIZE:
            fmax = FP8_FORMATS[node.attrs["dtype"]].max
            return [TensorScalar(scratch, ops[0], "divide", ops[1], "minimum", fmax),
                    TensorScalar(dst, scratch, "maximum", -fmax)]
        acc, x_scale, w_scale = ops
        if w_scale.shape[-1] == x_scale.shape[-1]:  # a [P, 1] column
            return [TensorScalar(dst, acc, "multiply", w_scale, "multiply", x_scale)]
        return [TensorTensor(scratch, acc, w_scale, ElementwiseOp.MULTIPLY),
                TensorScalar(dst, scratch, "multiply", x_scale)]

    def scale_constants(self) -> list[Stmt]:
        """Every scale on chip, once per kernel, in fp32: a [1, 1] scale broadcast to a [pmax, 1] column; a per-channel
        [N, 1] scale read by a transposed group as one column per feature tile [pmax, tiles], by a row-major group
        as a row broadcast to the token partitions [token_tile, N]."""
        out: list[Stmt] = []
        pmax = self.target.pmax
        self.scale_bufs: dict[tuple[str, str], Buffer] = {}
        self.folds = self.plan_folds()
        # a fold's per-channel weight scale read by nothing else, in whole tiles: combined on the eviction of its
        # transpose (a tensor_scalar instead of the copy), so the combination costs no instruction of its own
        on_eviction = {f.dequantize.operands[2]: f for f in self.folds.values() if self._combined_on_eviction(f)}
        # the per-tensor scales first: a combination reads them
        for sid, node in sorted(self.scales.items(), key=lambda item: item[1].shape[0] > 1):
            hbm, n = self.hbm[sid], node.shape[0]
            name = node.attrs["name"]
            orients = {u.annotations.get("orient") for u in self._users(sid)}
            if n == 1:
                buf = self.scale_bufs[(sid, "col")] = Buffer(f"{name}_col", (pmax, 1), "float32", "sbuf")
                out += [Alloc(buf, comment=f"{name} on every partition"),
                        DmaCopy(Ref(buf, (span(0, pmax), span(0, 1))), Ref(hbm, (span(0, 1), span(0, 1))),
                                broadcast=True)]
                continue
            if Orient.TRANSPOSED in orients:
                tiles = -(-n // pmax)
                buf = self.scale_bufs[(sid, "cols")] = Buffer(f"{name}_cols", (min(pmax, n), tiles), "float32", "sbuf")
                fold = on_eviction.get(sid)
                what = f" times {self._combination(fold)}" if fold else ""
                out += [Alloc(buf, comment=f"{name}{what}: one column per tile of {pmax} channels"),
                        *self._scale_columns(name, hbm, buf, n, self._combining_ops(fold, pmax) if fold else None)]
                if fold:
                    self.scale_bufs[(fold.key, "col")] = buf
            if Orient.NORMAL in orients or self._stationary_reader(sid):
                rows = self.tok.tile
                buf = self.scale_bufs[(sid, "row")] = Buffer(f"{name}_row", (rows, n), "float32", "sbuf")
                out += [Alloc(buf, comment=f"{name} along the free axis, on every token partition"),
                        DmaCopy(Ref(buf, (span(0, rows), span(0, n))), Ref(hbm, (span(0, n), span(0, 1))),
                                broadcast=True)]
        for fold in self.folds.values():
            if fold.dequantize.operands[2] not in on_eviction:
                out += self._combined_column(fold)
        return out

    def _stationary_reader(self, scale_id: str) -> bool:
        """Whether a group computed with the activations stationary reads scale input ``scale_id`` (then also loaded
        as rows; lowerings/row_scales.py overrides it: only row-scaled groups are)."""
        return False

    def _combined_on_eviction(self, fold: ScaleFold) -> bool:
        w_scale = fold.dequantize.operands[2]
        n = self.nodes[w_scale].shape[0]
        return n > 1 and n % self.target.pmax == 0 and [u.id for u in self._users(w_scale)] == [fold.dequantize.id]

    def _combination(self, fold: ScaleFold) -> str:
        """The scales a fold's column multiplies the weight scale by (divides, for the requantization's)."""
        x_name = self.nodes[fold.dequantize.operands[1]].attrs["name"]
        return x_name + (f" / {self.nodes[fold.quantize.operands[1]].attrs['name']}" if fold.quantize else "")

    def _combining_ops(self, fold: ScaleFold, parts: int) -> tuple[Any, ...]:
        """``(op0, operand0, op1, operand1)`` of the tensor_scalar combining a weight scale's columns."""
        def column(scale_id: str) -> Ref:
            return Ref(self.scale_bufs[(scale_id, "col")], (span(0, parts), span(0, 1)))

        divide = ("divide", column(fold.quantize.operands[1])) if fold.quantize is not None else (None, None)
        return ("multiply", column(fold.dequantize.operands[1]), *divide)

    def _combined_column(self, fold: ScaleFold) -> list[Stmt]:
        """``s_w * s_x`` (``/ s_q``) of a folded dequantization, one column per feature tile, once per kernel."""
        w_scale = fold.dequantize.operands[2]
        w = self.scale_bufs[(w_scale, "cols" if self.nodes[w_scale].shape[0] > 1 else "col")]
        rows, tiles = w.shape
        combined = self.scale_bufs[(fold.key, "col")] = Buffer(f"{fold.dequantize.id}_dequant_cols", w.shape,
                                                                "float32", "sbuf")
        n = self.nodes[w_scale].shape[0]
        # the columns' written partitions: whole tiles, then a ragged last tile's channels (_scale_columns)
        whole, ragged = (tiles, 0) if n == 1 or n % rows == 0 else divmod(n, rows)
        parts = [(rows, 0, whole)] * bool(whole) + [(ragged, whole, 1)] * bool(ragged)

        out: list[Stmt] = [Alloc(combined, comment=(
            f"{self.nodes[w_scale].attrs['name']} * {self._combination(fold)}: the scales of {fold.dequantize.id}'s "
            "eviction combined once"))]
        for p, c0, count in parts:
            region = (span(0, p), span(c0, count))
            out.append(TensorScalar(Ref(combined, region), Ref(w, region), *self._combining_ops(fold, p)))
        return out

    def _scale_columns(self, name: str, hbm: Buffer, cols: Buffer, n: int,
                       combining: tuple[Any, ...] | None = None) -> list[Stmt]:
        """Fill ``cols`` [pmax, tiles] with a per-channel [N, 1] scale, channel ``128 t + p`` at partition p of column
        t: the whole tiles in chunks of up to pmax tiles, each one load of the chunk's channels as [tiles, pmax] rows
        (contiguous, one DMA), a TensorE transpose into PSUM and a copy, as nki-library's decode gate/up projection
        loads its per-row dequantization scale (aws-neuron/nki-library@d2ad3a57: src/nkilib_src/nkilib/core/mlp/
        mlp_tkg/mlp_tkg_gate_up_projection.py:375-420, dma_copy then nc_transpose where dma_transpose cannot serve;
        nmmc's dma_transpose takes 2-byte types only, rule NKI-DMA-TRANSPOSE-DTYPE); a ragged last tile's channels
        as one column DMA. One DMA per channel tile instead would pay a DMA fixed cost per 128 channels for a
        4-byte-per-partition transfer (benchmarks/results/fp8-history.md, "Cost: predictions of 2026-12-02").
        ``combining``: the eviction from PSUM is that tensor_scalar (:meth:`_combining_ops`) instead of a copy."""
        pmax = self.target.pmax
        whole, ragged = divmod(n, pmax)
        out: list[Stmt] = []
        for c0 in range(0, whole, pmax):
            count = min(pmax, whole - c0)
            suffix = f"_{c0 // pmax}" if whole > pmax else ""
            rows = Buffer(f"{name}_rows{suffix}", (count, pmax), "float32", "sbuf")
            tp = Buffer(f"{name}_tpsum{suffix}", (pmax, count), "float32", "psum")
            out += [Alloc(rows, comment=f"{count} tiles of {pmax} channels as rows (one contiguous load)"),
                    DmaCopy(Ref(rows, (span(0, count), span(0, pmax))),
                            Ref(hbm, (span(c0 * pmax, count * pmax), span(0, 1))), fold=True),
                    Alloc(tp), PeTranspose(Ref(tp, (span(0, pmax), span(0, count))), Ref(rows, (span(0, count),
                                                                                               span(0, pmax)))),
                    TensorScalar(Ref(cols, (span(0, pmax), span(c0, count))), Ref(tp, (span(0, pmax), span(0, count))),
                                 *combining) if combining else
                    Copy(Ref(cols, (span(0, pmax), span(c0, count))), Ref(tp, (span(0, pmax), span(0, count))))]
        if ragged:
            out.append(DmaCopy(Ref(cols, (span(0, ragged), span(whole, 1))),
                               Ref(hbm, (span(whole * pmax, ragged), span(0, 1)))))
        return out

    def scale_refs(self, group: Group, parts: Expr, at: Expr, width: Expr | None = None) -> dict[str, Ref]:
        """The scales ``group`` reads, for an output tile of ``parts`` partitions: columns (the feature tile ``at`` of a
        transposed group), or, in a row-major group, rows of ``width`` channels from channel ``at``."""
        out: dict[str, Ref] = {}
        for op in group.operands:
            if op.id not in self.scales:
                continue
            if op.shape[0] == 1:
                out[op.id] = Ref(self.scale_bufs[(op.id, "col")], (span(0, parts), span(0, 1)))
            elif group.orient == Orient.TRANSPOSED:
                out[op.id] = Ref(self.scale_bufs[(op.id, "cols")], (span(0, parts), span(at, 1)))
            else:
                out[op.id] = Ref(self.scale_bufs[(op.id, "row")], (span(0, parts), span(at, width or 1)))
        for node in group.tree:
            fold = self.folds.get(node.id)
            if fold is not None:
                combined = self.scale_bufs[(fold.key, "col")]
                out[fold.key] = Ref(combined, (span(0, parts), span(at, 1) if combined.shape[1] > 1 else span(0, 1)))
        return out

    def _two_psum_operands(self, node: Node, group: Group) -> bool:
        """Whether evaluating ``node`` needs the fp32 scratch tile: a vector op of two PSUM tiles (one is moved
        first), or an FP8 op (quantize's clamp, a per-channel dequantize)."""
        op = ElementwiseOp.lookup(node.attrs.get("op"))
        if op is not None and op.scaled:
            return True
        terms = {t.node.id for t in group.terms}
        return not (op is not None and op.unary) and all(o in terms for o in node.operands)


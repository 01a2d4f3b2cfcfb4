"""Lower one fused kernel (a kernel subgraph after the fusion passes) to a loop-nest program.

The lowering follows the passes' decisions, written on every compute node, and re-derives none:
``orient`` (``transposed``: held feature-major, the layout the next matmul contracts over;
``normal``: row-major), ``kernel`` (one per kernel subgraph), ``place`` (``hbm``: the kernel stores
the value; ``sbuf``: it stays on chip), and the epilogue groups of ``group-epilogues`` (``group``,
``acc``; read by :mod:`.fused_groups`). A graph missing any of them is an IRError naming the pass
that writes it, and a kernel breaking the rules of ``passes/legality.py`` (the ones ``fuse`` splits
kernels by) a ScheduleError. Hardware limits come from the :class:`~neuronmm_compiler.targets.Target`
(:mod:`.limits`). The program, for each block of tokens:

1. loads the X^T strip of every kernel input used as a matmul's left operand, once, shared by all
   its users (a transposing DMA or TensorE transposes for a row-major input; a plain load for an
   input already stored transposed, e.g. h^T handed over by a previous kernel; :mod:`.fused_operands`);
2. for each group in dependency order — a transposed matmul, or the transposed matmuls feeding
   one elementwise tree (e.g. gate and up under ``silu(gate) * up``) — walks the output features in
   weight blocks, accumulates each matmul's ``[features, tokens]`` PSUM tile over the contraction,
   and evaluates the elementwise tree while evicting (:mod:`.fused_epilogue`, with the FP8 scales), writing the
   group's result strip in SBUF; a result placed in HBM is stored from the strip (transposed in HBM;
   :mod:`.fused_transposed`);
   a ``norm`` read by matmuls is made into its strip by the prologue of :mod:`.fused_prologue` (row tiles
   loaded, residual added and stored, normalized, transposed on TensorE, gamma applied on the eviction);
3. for the row-major matmul feeding an output: per weight block and token tile, accumulates
   ``[tokens, out_tile]`` PSUM tiles, packs a row and stores it (:mod:`.fused_rows`).

Nothing here is specific to SVD: the same rules lower X·U·V, the gated MLP (whole or split) and
any chain of matmuls with elementwise epilogues whose weights are kernel inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..ir import Graph, Node
from ..ir.fp8 import is_fp8
from ..kernel_ir.coalesce import coalesce_slab_loads
from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Lin, traced
from ..kernel_ir.fold import fold_unit_loops
from ..kernel_ir.lnc import distribute
from ..kernel_ir.program import (
    DTYPE_BYTES,
    Buffer,
    Comment,
    Program,
    Stmt,
)
from ..kernel_ir.prune import drop_unused_allocs
from ..passes.legality import check_kernel
from ..schedule.fused import FusedSchedule, normalize_on
from ..vocab import ElementwiseOp, Layout, NodeKind, Orient
from .fused_groups import Group, Term, read_groups
from .fused_prologue import NormPrologue
from .fused_rows import RowMajorGroups
from .fused_stationary import TOKEN_STATIONARY
from .fused_tokens import token_dim, token_rows
from .fused_transposed import TransposedGroups
from .limits import named_limits
from .row_scales import RowScales, is_row_scale

if TYPE_CHECKING:
    from ..targets import Target

__all__ = ["KernelCache", "divided_fused_kernel", "finish_fused_kernel", "lower_fused_kernel"]

#: What the lowering reads of a kernel graph whatever the schedule (the named target limits, its nodes, inputs,
#: outputs, compute nodes, copied inputs and checked groups), by (graph id, kernel name, target id), for a search
#: that lowers the same kernels for every candidate (lowerings/fused.py); each entry holds its graph and target, so
#: their ids stay theirs. The lowering reads these and changes none of them (nor the graph).
KernelCache = dict[tuple[int, str, int], tuple[Graph, "Target", tuple]]


class _FusedLowering(TransposedGroups, RowMajorGroups, NormPrologue, RowScales):
    def __init__(self, graph: Graph, schedule: FusedSchedule, target: Target, name: str,
                 kernels: KernelCache | None = None):
        self.g = graph
        self.name = name
        given = target
        key = (id(graph), name, id(given))
        known = kernels.get(key) if kernels is not None else None
        if known is not None and known[0] is graph and known[1] is given:  # read before: the same kernel
            self.target, self.nodes, self.inputs, self.outputs, compute, copied, groups = known[2]
            target = self.target
        else:
            self.target = target = named_limits(target)
            self.nodes = {n.id: n for n in graph.nodes()}
            self.inputs = graph.inputs()
            self.outputs = graph.outputs()
            compute = graph.compute_nodes()
            copied = [n for n in self.inputs if any(u.kind == NodeKind.OUTPUT for u in self._users(n.id))]
            if not compute and not copied:
                raise ScheduleError(f"kernel {name}: nothing to compute")
            check_kernel(graph, name)
            groups = read_groups(graph, name)
            if kernels is not None:
                kernels[key] = (graph, given, (
                    self.target, self.nodes, self.inputs, self.outputs, compute, copied, groups))
        # a norm's group is its prologue (residual add, norm), which makes the norm's strip (fused_prologue.py)
        self.prologues = [g for g in groups if g.root.kind == NodeKind.NORM]
        self.group_list = [g for g in groups if g.root.kind != NodeKind.NORM]
        self.tokens = compute[0].shape[0] if compute else copied[0].shape[0]
        self.tokens = self.mx_init(self.tokens)  # an MX kernel computes an even count (lowerings/mx.py)
        # the scale inputs of quantize/dequantize nodes: loaded once, as per-partition columns or broadcast rows; the
        # per-token scales computed in the kernel (row_scale) apart (row_scales.py)
        self.scales = {o: self.nodes[o] for n in compute if n.kind == NodeKind.ELEMENTWISE
                       and ElementwiseOp(n.attrs["op"]).scaled for o in n.operands[1:]
                       if self.nodes[o].kind == NodeKind.INPUT}
        self._init_row_scales(compute)
        self.folds = {}
        aliases = graph.hbm_aliases
        s = self.mx_even(normalize_on(schedule, self.tokens, target))  # MX: even token tiles (lowerings/mx.py)
        # the tile sizes the printed kernel spells by name (kernel_ir/expr.py, Named); the token count read from the
        # arguments where the kernel can take any count up to the one it was built for (fused_tokens.py)
        weights = set(self.scales) | {n.operands[1] for n in compute if n.kind == NodeKind.MATMUL}
        rows = [] if self.mx else token_rows(graph, self.tokens, weights, aliases)  # MX: the count is the bucket
        self.tokdim = token_dim(self.tokens, s, rows, target.lnc, bool(copied))
        self.s = s = self.tokdim.schedule
        self.tok = self.tokdim.dim
        tokens = self.tokdim.count if traced(self.tokdim.count) else None
        # the kernel's dtype: its values' (an FP8 kernel's quantized values and fp32 accumulators aside,
        # docs/quantization.md)
        self.dtype = next((n.dtype for n in compute if n.dtype in ("bfloat16", "float32") and not (
            n.kind == NodeKind.MATMUL and is_fp8(self.nodes[n.operands[0]].dtype)) and not is_row_scale(n)),
            (compute or copied)[0].dtype)
        self.dtype_bytes = DTYPE_BYTES[self.dtype]

        def hbm(n: Node, name: str) -> Buffer:
            shape = n.storage_shape
            return Buffer(name, (tokens, *shape[1:]) if tokens and name in rows else shape, n.dtype, "hbm")

        self.hbm = {n.id: hbm(n, aliases.get(n.id, n.attrs["name"])) for n in self.inputs}
        self.mx_arguments(self.inputs, self.hbm)
        self.out_hbm: dict[str, list[tuple[Node, Buffer]]] = {}
        for n in self.outputs:
            self.out_hbm.setdefault(n.operands[0], []).append((n, hbm(n, n.attrs["name"])))
        self.strips: dict[str, Buffer] = {}
        self.cached: dict[str, Buffer] = {}
        # An output that returns an input (e.g. x^T, once the transpose became x's layout) is a copy,
        # made outside the token blocks, in row tiles of its own.
        self.copies = [Group(n, Orient.NORMAL, operands=[n]) for n in copied]
        self.strip_inputs = self._strip_inputs()
        self.reducing = self.reducing_groups()
        self.halved = self._halved()

    def reducing_groups(self) -> list[Group]:
        """The groups whose contraction the two programs of a logical core divide, each computing partial sums over
        its half, which they then add (the whole strip exchanged and added, an all-reduce, for a transposed group;
        each program the half of a block's columns it stores, a reduce-scatter, for a row-major one):

        - ``lnc_split=hidden``: every group contracting over a kernel input (the gate and up projections over the
          hidden dimension, as AWS's decode MLP divides them), and a transposed group reading the gated value (an
          SVD MLP's h @ U_down, over the intermediate dimension: its [rank, tokens] partial sums are exchanged
          instead of h's halves, and U_down's rows are divided whatever the rank's tile count, where dividing its
          rank tiles needs an even count); the other groups after them divide their features;
        - ``lnc_split=intermediate``: the group reading the gated value (h of an MLP), else the last group reading a
          computed value (V of a chain); the groups before it divide their features, and the value it reads, when
          nothing else reads it, stays halved: no exchange before the reduction.

        Empty (the split then divides nothing, see kernel_ir/lnc.py) where such a group cannot be reduced: a
        ragged last feature tile (the exchanged strip would be partly unwritten), a transposed result stored whole
        to HBM, a row-major group with an epilogue, several terms, or tiles that do not halve evenly."""
        split = self.s.lnc_split
        if split not in ("hidden", "intermediate") or self.target.lnc != 2:
            return []
        if split == "hidden":
            groups = [g for g in self.group_list if g.matmuls and all(
                self._reads_kernel_input(self.nodes[mm.operands[0]]) for mm in g.matmuls)]
            groups += [g for g in self._reading_gated() if g.orient == Orient.TRANSPOSED and self._reducible(g)]
        else:
            groups = self._reading_gated()
            if not groups:
                groups = [g for g in self.group_list if any(
                    self.nodes[mm.operands[0]].kind not in (NodeKind.INPUT, NodeKind.NORM) for mm in g.matmuls)][-1:]
        return groups if groups and all(self._reducible(g) for g in groups) else []

    def exchange_batches(self) -> list[list[Group]]:
        """The groups in order, consecutive transposed reducing groups that read none of each other's values (an SVD
        MLP's x @ U_gate and x @ U_up under ``hidden``) batched: their partial strips travel in one exchange, as the
        gate and up terms of one group do (one sendrecv fixed cost instead of one per group). Their partial tiles
        all have 128 features (``_reducible``: whole tiles), so they share one buffer."""
        batches: list[list[Group]] = []
        for group in self.group_list:
            prev = batches[-1] if batches else []
            if prev and self._exchanges(group) and self._exchanges(prev[0]) and not self._reads_any(group, prev):
                prev.append(group)
            else:
                batches.append([group])
        return batches

    def _exchanges(self, group: Group) -> bool:
        """Whether ``group`` is a transposed group whose partial strips the programs exchange."""
        return group.orient == Orient.TRANSPOSED and self._reduces(group)

    def _reads_any(self, group: Group, batch: list[Group]) -> bool:
        """Whether ``group`` reads a value computed by a group of ``batch``."""
        made = {node.id for g in batch for node in (g.root, *g.tree, *g.matmuls, *(t.node for t in g.terms))}
        reads = {mm.operands[0] for mm in group.matmuls} | {op.id for op in group.operands}
        return bool(reads & made)

    def _reading_gated(self) -> list[Group]:
        """The first group reading the gated value: the value of a group whose epilogue computes (silu, multiply),
        not of one that only rescales its accumulator (an FP8 group's dequantize/quantize: x_q, x @ U's
        requantization, docs/quantization.md)."""
        gated = {g.root.id for g in self.group_list if any(not ElementwiseOp(n.attrs["op"]).fp8 for n in g.tree)}
        return [g for g in self.group_list if any(mm.operands[0] in gated for mm in g.matmuls)][:1]

    def _reads_kernel_input(self, lhs: Node) -> bool:
        """A matmul operand over the hidden dimension: a kernel input or the norm prologue's value, or (FP8) the
        quantization of one (docs/quantization.md)."""
        if lhs.kind == NodeKind.ELEMENTWISE and lhs.attrs["op"] in (ElementwiseOp.QUANTIZE, ElementwiseOp.QUANTIZE_MX):
            lhs = self.nodes[lhs.operands[0]]
        return lhs.kind in (NodeKind.INPUT, NodeKind.NORM)

    def _reducible(self, group: Group) -> bool:
        root = group.root
        if any(self._kdim(self.nodes[mm.operands[0]].shape[1]).tiles < self.target.lnc for mm in group.matmuls):
            return False  # one contraction tile is no loop to divide: each program would add the whole product twice
        if group.orient == Orient.TRANSPOSED:
            streamed = self._stored(root) and all(u.kind == NodeKind.OUTPUT for u in self._users(root.id))
            return root.shape[1] % self.target.gemm_stationary_fmax == 0 and (streamed or not self._stored(root))
        n = root.shape[1]
        tile = min(self.s.out_tile, n)
        flipped = any(o.layout == Layout.TRANSPOSED for o, _ in self.out_hbm[root.id])
        return not (group.tree or group.operands or len(group.terms) != 1 or n % tile or tile % 2 or flipped)

    def _halved(self) -> set[str]:
        """lnc_split=intermediate or hidden: computed values only the reducing groups read, each program keeping the
        half of their strip it computed (the half of the contraction it reduces over): h for ``intermediate``; x's
        FP8 quantization for ``hidden``, each program quantizing the half of x it contracts over."""
        if self.s.lnc_split not in ("intermediate", "hidden") or not self.reducing:
            return set()
        inside = {mm.id for group in self.reducing for mm in group.matmuls}
        halved = {mm.operands[0] for group in self.reducing for mm in group.matmuls
                  if all(u in inside for u in self.g.users(mm.operands[0]))}
        return halved | self.mx_halved(halved)

    def _strip_inputs(self) -> list[Node]:
        """Kernel inputs held as transposed strips: matmul left operands and transposed groups' operands."""
        seen: dict[str, Node] = {}
        for group in self.group_list:
            for mm in group.matmuls:
                lhs = self.nodes[mm.operands[0]]
                if lhs.kind == NodeKind.INPUT:
                    seen.setdefault(lhs.id, lhs)
            if group.orient == Orient.TRANSPOSED:
                for op in group.operands:
                    if op.kind == NodeKind.INPUT and op.id not in self.scales:
                        seen.setdefault(op.id, op)
        return [node for node in seen.values() if not self.mx_loads_itself(node)]  # MX: lowerings/mx.py

    def _describe_group(self, group: Group) -> str:
        """One line saying what the group computes and how (for the emitted kernel's readers)."""
        def product(term: Term) -> str:
            return " + ".join(f"{mm.operands[0]} @ {self._weight(mm).attrs['name']}" for mm in term.matmuls)

        if group.orient != Orient.TRANSPOSED:
            how = "strips stationary, weights moving"
        elif self._token_stationary(group):
            how = TOKEN_STATIONARY
        else:
            how = "weight tiles stationary, strips moving (implicit transposition)"
        mark = "^T" if group.orient == Orient.TRANSPOSED else ""
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

    def program(self) -> Program:
        """The kernel: resident weights, then per token block the strips and every group in order,
        then the copies."""
        tok = self.tok
        body: list[Stmt] = [Comment(f"schedule: {self.s.describe()}")]
        body += self.cached_weights()
        body += self.prologue_constants()
        body += self.scale_constants()
        body += self.row_scale_constants()
        # the blocks of the bucket: a loop divided between programs stays a loop when each runs it once, as
        # kernel_ir/lnc.py's distribute leaves it (buffers used in it stay live across it)
        blocks = tok.blocks * (self.target.lnc if self.tokdim.divided else 1)
        mb = iv("m_blk", blocks)
        block: list[Stmt] = []
        for inp in self.strip_inputs:
            block += self.load_strip(inp, mb)
        for prologue in self.prologues:
            block += self.load_normed_strip(prologue, mb)
        for batch in self.exchange_batches():
            if len(batch) > 1:
                block += self.reduced_groups(batch, mb)
            else:
                group = batch[0]
                if is_row_scale(group.root):
                    block += self.row_scale_group(group, mb)
                else:
                    block += (self.transposed_group(group, mb) if group.orient == Orient.TRANSPOSED
                              else self.row_major_group(group, mb))
        if block and self.tokdim.divided:  # each program its share of the tokens (fused_tokens.py)
            body += loop("m_blk", tok.block_trip(), blocks, block,
                         comment="blocks of tokens (2 programs: each T_MINE tokens from T_HALF * pid)")
        elif block:
            body += loop("m_blk", tok.block_trip(), blocks, block, comment="blocks of tokens", split=("tokens",))
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
        params = self.mx_params(list({self.hbm[n.id].name: self.hbm[n.id] for n in self.inputs}.values()))
        body = self.mx_matmuls(body) if self.mx else body  # matmuls of MX tiles: nc_matmul_mx (lowerings/mx.py)
        args = ", ".join(f"{p.name}{list(p.shape)}" for p in params)
        results = ", ".join(f"{o.name}{list(o.shape)}" for o in outs)
        doc = (f"Fused kernel {self.name} over {self.tokens} tokens ({self.dtype}).\n"
               f"Arguments: {args}. Returns {results}.")
        if self.tokdim.divided:
            return Program(self.name, params, outs, body, doc=doc, programs=self.target.lnc, split="tokens",
                           checks=self.tokdim.checks)
        return Program(self.name, params, outs, body, doc=doc, checks=self.tokdim.checks)


def lower_fused_kernel(graph: Graph, schedule: FusedSchedule, target: Target, name: str | None = None) -> Program:
    """The loop-nest program of one kernel subgraph (annotated by the fusion pipeline, see the module
    docstring) under ``schedule`` on ``target``."""
    return finish_fused_kernel(divided_fused_kernel(graph, schedule, target, name), schedule)


def divided_fused_kernel(graph: Graph, schedule: FusedSchedule, target: Target, name: str | None = None,
                         kernels: KernelCache | None = None) -> Program:
    """:func:`lower_fused_kernel` before its last steps (:func:`finish_fused_kernel`): the program divided between the
    programs of a logical core, its slab loads not yet coalesced. Nothing before those steps reads ``weight_dma`` but
    to tell ``tile`` from the others, so ``row`` and ``block`` give this same program (its schedule comment aside): the
    search costs the block form of a row schedule from the row form's (lowerings/fused.py). ``kernels``: a search's
    :data:`KernelCache`, which keeps what the lowering reads of the kernel whatever the schedule."""
    lowering = _FusedLowering(graph, schedule, target, name or f"{graph.name}_kernel", kernels)
    program = drop_unused_allocs(lowering.program())
    return program if program.programs > 1 else distribute(program, schedule.lnc_split, target.lnc)


def finish_fused_kernel(program: Program, schedule: FusedSchedule) -> Program:
    """The last steps of :func:`lower_fused_kernel` on a :func:`divided_fused_kernel` program: each loop of slab loads
    made one DMA (``weight_dma=block``, kernel_ir/coalesce.py), then the loops that run once folded."""
    return fold_unit_loops(coalesce_slab_loads(program) if schedule.weight_dma == "block" else program)

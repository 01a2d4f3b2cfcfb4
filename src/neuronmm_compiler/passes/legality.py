"""What one fused kernel may hold: the rules the ``fuse`` pass splits kernels by, and the lowering checks.

A fused kernel (``lowerings/lower_fused.py``) blocks one token dimension, keeps every value it
computes on chip in one orientation (``orient``), reads its weights from HBM and stores its results
to HBM. So a value may be read on chip, inside the kernel that computes it, only where that works:

==========================  ========================================================================
rule                        a node breaks it when
==========================  ========================================================================
``rows``                    its rows differ from the kernel's (a kernel blocks one token dimension)
``computed weight``         it is a matmul whose right operand (weight) is computed in the kernel
``transpose``               it reads a transpose of a value computed in the kernel (a transpose is
                            never computed: it is a view of an HBM array)
``row-major lhs``           it is a matmul whose left operand is held row-major (``normal``); the
                            TensorEngine contracts over partitions, so it needs it transposed
``orientation``             it is an elementwise node reading a value held in the other orientation
``row-major reread``        it reads a row-major value that has other readers (a row-major value is
                            only ever stored, or absorbed by its single elementwise reader)
``prologue``                it is a ``norm`` reading, in the kernel, something other than a residual
                            ``add`` of two kernel inputs (or a computed gamma/beta): the norm prologue
                            loads its rows from HBM (docs/fusion.md, "The norm prologue")
==========================  ========================================================================

``fuse`` starts a new kernel where a node would break one (:func:`join_conflict`), so the value
crosses HBM instead. The lowering checks a kernel subgraph against the same rules, plus those no
split can fix (:func:`kernel_conflicts`: 2-D values, no transpose node computed, outputs of a value
held transposed declared transposed, no row-major value left unstored), and refuses a kernel that
breaks any (:func:`check_kernel`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ScheduleError
from ..ir.graph import COMPUTE_KINDS, Graph, Node
from ..vocab import ElementwiseOp, Layout, NodeKind, Orient

__all__ = ["RULES", "Conflict", "check_kernel", "join_conflict", "kernel_conflicts", "operand_conflict", "prologue_sum"]

#: Every rule, by name, and why a kernel cannot hold what breaks it.
RULES: Mapping[str, str] = {
    "rows": "its rows differ from the kernel's; a fused kernel blocks one token dimension",
    "computed weight": "it multiplies by a weight (right operand) computed in the kernel; fused kernels read "
                       "weights from HBM",
    "transpose": "it reads the transpose of a value computed in the kernel; a transpose is never computed, it is a "
                 "view of an HBM array written by an earlier kernel",
    "row-major lhs": "its left operand is held row-major; a matmul contracts over partitions, so it needs it "
                     "held transposed",
    "orientation": "it reads a value held in the other orientation; elementwise operands share one layout",
    "row-major reread": "it reads a row-major value that has other readers; a row-major value is only ever stored "
                        "or absorbed by its one elementwise reader",
    "prologue": "it normalizes a value computed in the kernel other than a residual add of two kernel inputs, or "
                "reads a computed gamma/beta; the norm prologue loads its rows (and gamma, beta) from HBM",
    "norm orientation": "it is a norm held row-major; the prologue holds the normalized value transposed, as the "
                        "strip its matmuls read (a norm feeds matmuls' left operands only)",
    "prologue sum": "it is the residual add of a norm prologue and is read by something other than its norm and "
                    "outputs; the prologue keeps the sum only to normalize and store it",
    "not 2-D": "it is not 2-D; fused kernels compute 2-D values",
    "transpose computed": "it is a transpose of a computed value; fused kernels contain no transpose instruction "
                          "(transposes of inputs become input layouts, and of outputs output layouts)",
    "transposed output": "it is held transposed but stored to an output declared row-major (run implicit-transpose)",
    "row-major unstored": "it is held row-major and nothing reads it; a row-major value must be stored",
    "row scale": "it is a per-token activation scale (row_scale, act_scale=row) another kernel would read through "
                 "HBM; the fused lowering computes a row scale in the kernel that quantizes and dequantizes with it "
                 "(mlp=whole; docs/quantization.md, 'Per-token activation scales')",
}

#: The rules ``fuse`` can resolve by starting a new kernel (the others no split fixes).
SPLIT_RULES: tuple[str, ...] = ("rows", "computed weight", "transpose", "row-major lhs", "orientation",
                                "row-major reread", "prologue")


@dataclass(frozen=True)
class Conflict:
    """A node breaking ``rule`` (a key of :data:`RULES`), reading ``operand`` where the rule is about one."""

    node: str
    rule: str
    operand: str | None = None

    def describe(self) -> str:
        """``%node (reading %operand): why``."""
        reading = f" (reading %{self.operand})" if self.operand else ""
        return f"%{self.node}{reading}: {RULES[self.rule]}"


def operand_conflict(graph: Graph, node: Node, position: int, operand: Node) -> str:
    """The rule ``node`` breaks by reading ``operand`` (its operand ``position``) on chip, when both are
    computed in one kernel; empty when it breaks none. Orientation rules apply once ``orient`` is
    decided (implicit-transpose has run); before that only the structural ones do."""
    if operand.kind == NodeKind.TRANSPOSE:
        return "transpose" if graph.node(operand.operands[0]).kind != NodeKind.INPUT else ""
    if _reads_row_scale(node, position, operand) or _row_scale(node):
        return ""  # a per-token scale: computed from, and read by, values in either layout (lowerings/row_scales.py)
    if node.kind == NodeKind.NORM:
        return "" if position == 0 and prologue_sum(graph, operand) else "prologue"
    if node.kind == NodeKind.MATMUL and position == 1:
        return "computed weight"
    held = operand.annotations.get("orient")
    if held is None:
        return ""
    if node.kind == NodeKind.MATMUL and held != Orient.TRANSPOSED:
        return "row-major lhs"
    if node.kind == NodeKind.ELEMENTWISE and held != node.annotations.get("orient"):
        return "orientation"
    if held == Orient.NORMAL and len(graph.users(operand.id)) > 1:
        return "row-major reread"
    return ""


def _row_scale(node: Node) -> bool:
    return node.kind == NodeKind.ELEMENTWISE and node.attrs.get("op") == ElementwiseOp.ROW_SCALE


def _reads_row_scale(node: Node, position: int, operand: Node) -> bool:
    """Whether ``node`` reads ``operand`` as a quantize's or dequantize's activation scale computed by a row_scale."""
    return position == 1 and _row_scale(operand) and node.kind == NodeKind.ELEMENTWISE and \
        ElementwiseOp(node.attrs["op"]).scaled


def prologue_sum(graph: Graph, node: Node) -> bool:
    """Whether ``node`` can be the residual sum of a norm prologue: an ``add`` of two different kernel inputs,
    read by norms and outputs only (the prologue loads both row tiles, adds them, stores the sum and normalizes
    it)."""
    if node.kind != NodeKind.ELEMENTWISE or node.attrs.get("op") != ElementwiseOp.ADD or len(set(node.operands)) != 2:
        return False
    if any(graph.node(operand).kind != NodeKind.INPUT for operand in node.operands):
        return False
    users = [graph.node(user) for user in graph.users(node.id)]
    return sum(u.kind == NodeKind.NORM for u in users) == 1 and all(
        u.kind in (NodeKind.NORM, NodeKind.OUTPUT) for u in users)


def join_conflict(graph: Graph, node_id: str, kernel: int, kernel_of: Mapping[str, int],
                  rows: Mapping[int, int]) -> Conflict | None:
    """Why ``node_id`` cannot join kernel ``kernel`` (None: it can), given the kernels of the nodes
    assigned so far (``kernel_of``) and each kernel's row count (``rows``). Used by ``fuse``."""
    node = graph.node(node_id)
    if rows.get(kernel, node.shape[0]) != node.shape[0]:
        return Conflict(node_id, "rows")
    for position, operand_id in enumerate(node.operands):
        if kernel_of.get(operand_id) != kernel:
            continue
        rule = operand_conflict(graph, node, position, graph.node(operand_id))
        if rule:
            return Conflict(node_id, rule, operand_id)
    return None


def kernel_conflicts(graph: Graph) -> list[Conflict]:
    """Every rule one kernel subgraph (every compute node in one kernel, as :func:`split_kernels`
    gives them) breaks, in node order."""
    conflicts: list[Conflict] = []
    compute = graph.compute_nodes()
    rows = compute[0].shape[0] if compute else None
    for node in compute:
        if node.kind == NodeKind.TRANSPOSE:
            conflicts.append(Conflict(node.id, "transpose computed"))
            continue
        if _row_scale(node) and any(graph.node(u).kind == NodeKind.OUTPUT for u in graph.users(node.id)):
            conflicts.append(Conflict(node.id, "row scale"))
            continue
        if node.kind == NodeKind.ELEMENTWISE and ElementwiseOp(node.attrs["op"]).scaled:
            x_scale = graph.node(node.operands[1])
            if x_scale.kind == NodeKind.INPUT and x_scale.shape[0] > 1:  # a row scale stored by another kernel
                conflicts.append(Conflict(node.id, "row scale", x_scale.id))
        if len(node.shape) != 2:
            conflicts.append(Conflict(node.id, "not 2-D"))
            continue
        if node.shape[0] != rows:
            conflicts.append(Conflict(node.id, "rows"))
        for position, operand_id in enumerate(node.operands):
            operand = graph.node(operand_id)
            if operand.kind in COMPUTE_KINDS:
                rule = operand_conflict(graph, node, position, operand)
                if rule:
                    conflicts.append(Conflict(node.id, rule, operand_id))
        users = [graph.node(user) for user in graph.users(node.id)]
        orient = node.annotations.get("orient")
        if orient == Orient.TRANSPOSED and any(u.kind == NodeKind.OUTPUT and u.layout != Layout.TRANSPOSED
                                               for u in users):
            conflicts.append(Conflict(node.id, "transposed output"))
        if orient == Orient.NORMAL and not users:
            conflicts.append(Conflict(node.id, "row-major unstored"))
        if node.kind == NodeKind.NORM and orient == Orient.NORMAL:
            conflicts.append(Conflict(node.id, "norm orientation"))
        if any(u.kind == NodeKind.NORM and u.operands[0] == node.id for u in users) and not prologue_sum(graph, node) \
                and node.kind != NodeKind.INPUT:
            conflicts.append(Conflict(node.id, "prologue sum"))
    return conflicts


def check_kernel(graph: Graph, name: str) -> None:
    """ScheduleError naming the first rule kernel ``name`` (the subgraph ``graph``) breaks, if any."""
    conflicts = kernel_conflicts(graph)
    if conflicts:
        first = conflicts[0]
        fix = " (run the fuse pass to split kernels)" if first.rule in SPLIT_RULES else ""
        more = f"; {len(conflicts) - 1} more conflict(s)" if len(conflicts) > 1 else ""
        raise ScheduleError(f"kernel {name} cannot hold {first.describe()}{fix}{more}")

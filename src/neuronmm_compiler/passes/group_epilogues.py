"""``group-epilogues``: which values a fused kernel evaluates together, on one PSUM eviction.

A fused kernel computes its values in *groups*, in dependency order. A value is *absorbed* into its
user's group when it is a matmul or elementwise result whose only reader is an elementwise node of
the same kernel and orientation: it is then never held in SBUF, but computed tile by tile where its
reader needs it. Every other value is the *root* of a group. A group has

- PSUM *accumulators*: a matmul, or an ``add`` of two different absorbed accumulators (``x W + h B``
  accumulates both products into one PSUM tile, a matmul over the joined contraction);
- an elementwise *tree* over them, evaluated as the accumulators are evicted (for the gated MLP,
  ``silu(gate) * up`` is written straight from the gate and up PSUM tiles into the ``h`` strip);
- operands it reads tile by tile that are not its own (kernel inputs, and values held in SBUF by
  earlier groups).

The pass writes that decision down, so the lowering reads it instead of working it out:

- ``group=<root id>`` on every value the group evaluates (the root included);
- ``acc=<accumulator id>`` on every value summed into a PSUM accumulator, the accumulator itself
  included (a matmul that is its own accumulator has ``acc`` equal to its own id); tree nodes
  have none.

Needs ``kernel`` (``fuse``) and ``orient`` (``implicit-transpose``) on every compute node that is
not a transpose (IRError otherwise). Transposes are views of HBM arrays, never computed, and get
no group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import IRError
from ..ir.graph import Graph, Node
from ..vocab import ElementwiseOp, NodeKind
from .base import Pass, register_pass
from .legality import prologue_sum

__all__ = ["GroupEpilogues", "absorbed", "accumulator", "epilogue_groups"]


def absorbed(graph: Graph, node: Node) -> bool:
    """True when ``node`` is evaluated inside its only reader's group: a matmul or elementwise value
    read by exactly one node, an elementwise node of the same kernel and orientation. A ``quantize_mx`` absorbs
    nothing: nisa.quantize_mx reads a bf16 tile of 32-partition multiples from SBUF ("All input src and output tiles
    ... must be in SBUF"), so the value it quantizes is held in SBUF by its own group first (docs/mx.md)."""
    if node.kind not in (NodeKind.MATMUL, NodeKind.ELEMENTWISE):
        return False
    users = graph.users(node.id)
    if len(users) != 1:
        return False
    user = graph.node(users[0])
    if user.kind == NodeKind.ELEMENTWISE and user.attrs["op"] == ElementwiseOp.QUANTIZE_MX:
        return False
    return (user.kind == NodeKind.ELEMENTWISE
            and user.annotations.get("orient") == node.annotations.get("orient")
            and user.annotations.get("kernel") == node.annotations.get("kernel"))


def accumulator(graph: Graph, node: Node) -> list[str] | None:
    """The ids of the values summed into one PSUM accumulator that is ``node`` (``node`` first,
    then its parts in operand order), or None when ``node`` cannot be one: a matmul is one; an
    ``add`` of two different values is one when both are absorbed accumulators."""
    if node.kind == NodeKind.MATMUL:
        return [node.id]
    if node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.ADD and len(set(node.operands)) == 2:
        parts = [graph.node(operand) for operand in node.operands]
        summed = [accumulator(graph, part) if absorbed(graph, part) else None for part in parts]
        if all(members is not None for members in summed):
            return [node.id, *(member for members in summed for member in members or ())]
    return None


def _collect(graph: Graph, node: Node, root: str, plan: dict[str, tuple[str, str | None]]) -> None:
    """Put the tree node ``node`` and the absorbed values it reads into the group of ``root``."""
    for operand_id in dict.fromkeys(node.operands):
        operand = graph.node(operand_id)
        if not absorbed(graph, operand):
            continue  # read from outside the group: a kernel input or a value an earlier group holds
        members = accumulator(graph, operand)
        if members is not None:
            plan.update((member, (root, operand.id)) for member in members)
        else:
            _collect(graph, operand, root, plan)
    plan[node.id] = (root, None)


def prologue_members(graph: Graph) -> dict[str, str]:
    """The residual sums evaluated in their norm's prologue (same kernel): sum id -> norm id. A norm's group is
    its prologue: the residual add (when it reads one) and the normalization, evaluated on each row tile."""
    out: dict[str, str] = {}
    for node in graph.compute_nodes():
        if node.kind != NodeKind.NORM:
            continue
        operand = graph.node(node.operands[0])
        if (operand.kind == NodeKind.ELEMENTWISE and prologue_sum(graph, operand)
                and operand.annotations.get("kernel") == node.annotations.get("kernel")):
            out[operand.id] = node.id
    return out


def epilogue_groups(graph: Graph) -> dict[str, tuple[str, str | None]]:
    """``(group root, accumulator or None)`` of every compute node that is not a transpose."""
    plan: dict[str, tuple[str, str | None]] = {}
    prologue = prologue_members(graph)
    for node in graph.compute_nodes():
        if node.kind == NodeKind.TRANSPOSE or absorbed(graph, node):
            continue
        if node.id in prologue:
            plan[node.id] = (prologue[node.id], None)
            continue
        if node.kind == NodeKind.NORM:
            plan[node.id] = (node.id, None)
            continue
        members = accumulator(graph, node)
        if members is not None:
            plan.update((member, (node.id, node.id)) for member in members)
        else:
            _collect(graph, node, node.id, plan)
    return plan


@register_pass
@dataclass(frozen=True)
class GroupEpilogues(Pass):
    """Annotate every computed value with its fused-kernel group (``group``) and, for values summed
    into a PSUM accumulator, that accumulator (``acc``); see the module docstring. Stale ``group``
    and ``acc`` annotations are replaced or removed."""

    name: ClassVar[str] = "group-epilogues"

    def apply(self, graph: Graph) -> bool:
        """Annotate in place; return True if any ``group`` or ``acc`` annotation changed."""
        compute = graph.compute_nodes()
        missing = [f"%{node.id} ({key})" for node in compute if node.kind != NodeKind.TRANSPOSE
                   for key in ("kernel", "orient") if key not in node.annotations]
        if missing:
            raise IRError("group-epilogues needs kernel and orient annotations on every computed value (run "
                          f"implicit-transpose and fuse first); missing on {', '.join(missing)}")
        plan = epilogue_groups(graph)
        changed = False
        for node in compute:
            if node.id not in plan:
                changed |= graph.clear_annotations(node.id, "group", "acc")
                continue
            root, acc = plan[node.id]
            changed |= graph.annotate(node.id, group=root)
            if acc is None:
                changed |= graph.clear_annotations(node.id, "acc")
            else:
                changed |= graph.annotate(node.id, acc=acc)
        return changed

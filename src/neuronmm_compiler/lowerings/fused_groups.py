"""The groups of a fused kernel, read from the fusion passes' annotations.

The lowering decides nothing about where values live or which are evaluated together: the passes
did, and wrote it on every compute node (``kernel`` by ``fuse``, ``orient`` by
``implicit-transpose``, ``place`` by ``place``, ``group`` and ``acc`` by ``group-epilogues``; see
``passes/group_epilogues.py``). This module checks that they are all there and rebuilds the groups
from them, in the order the lowering emits them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import IRError
from ..ir import Graph, Node
from ..vocab import ElementwiseOp, NodeKind, Orient

#: The annotation every compute node of a kernel needs, and the pass that writes it.
REQUIRED_ANNOTATIONS: Mapping[str, str] = {
    "kernel": "fuse",
    "orient": "implicit-transpose",
    "place": "place",
    "group": "group-epilogues",
}


@dataclass
class Term:
    """One PSUM accumulator: a matmul, or an ``add`` of products summed in place (``x W + h B``
    accumulates both products into the same PSUM tile, as a matmul over the joined contraction)."""

    node: Node
    matmuls: list[Node]


@dataclass
class Group:
    """Values evaluated together, tile by tile: PSUM accumulators (``terms``), the elementwise tree
    over them evaluated on the PSUM eviction (``tree``, operands before users) and the other values
    it reads (``operands``: transposed values held in SBUF strips, or, for a row-major group,
    kernel inputs loaded tile by tile). ``orient`` is the orientation of every value of the group."""

    root: Node
    orient: Orient
    terms: list[Term] = field(default_factory=list)
    tree: list[Node] = field(default_factory=list)
    operands: list[Node] = field(default_factory=list)

    @property
    def matmuls(self) -> list[Node]:
        return [mm for term in self.terms for mm in term.matmuls]


def check_annotations(graph: Graph, name: str) -> None:
    """IRError unless every compute node of kernel ``name`` carries :data:`REQUIRED_ANNOTATIONS`
    (and ``acc`` on matmuls), all with one ``kernel``."""
    for node in graph.compute_nodes():
        keys = [*REQUIRED_ANNOTATIONS, *(("acc",) if node.kind == NodeKind.MATMUL else ())]
        for key in keys:
            if key not in node.annotations:
                writer = REQUIRED_ANNOTATIONS.get(key, "group-epilogues")
                raise IRError(f"kernel {name}: %{node.id} has no {key} annotation; the fused lowering follows the "
                              f"fusion passes' decisions (run the fusion pipeline, whose {writer} pass writes it)")
    kernels = sorted({node.annotations["kernel"] for node in graph.compute_nodes()})
    if len(kernels) > 1:
        raise IRError(f"kernel {name}: its values are annotated with several kernels ({', '.join(kernels)}); "
                      "lower each kernel of split_kernels on its own")


def _inconsistent(name: str, node: Node, why: str) -> IRError:
    return IRError(f"kernel {name}: %{node.id} {{{', '.join(f'{k}={v}' for k, v in sorted(node.annotations.items()))}}}"
                   f" {why}; rerun group-epilogues")


class _Reader:
    def __init__(self, graph: Graph, name: str):
        self.name = name
        self.nodes = {node.id: node for node in graph.nodes()}
        self.seen: set[str] = set()

    def member(self, node: Node, group: Group) -> bool:
        return node.annotations.get("group") == group.root.id

    def term(self, node: Node) -> Term:
        """The accumulator ``node`` (``acc`` is its own id) and its matmuls in operand order."""
        def matmuls(part: Node) -> list[Node]:
            self.seen.add(part.id)
            if part.annotations.get("acc") != node.id:
                raise _inconsistent(self.name, part, f"is read by the accumulator %{node.id} but not summed into it")
            if part.kind == NodeKind.MATMUL:
                return [part]
            if part.kind != NodeKind.ELEMENTWISE or part.attrs["op"] != ElementwiseOp.ADD:
                raise _inconsistent(self.name, part, "is an accumulator but neither a matmul nor an add")
            return [mm for operand in part.operands for mm in matmuls(self.nodes[operand])]

        return Term(node, matmuls(node))

    def collect(self, node: Node, group: Group) -> None:
        """Add the tree node ``node`` and what it reads to ``group``, operands before users."""
        self.seen.add(node.id)
        for operand_id in dict.fromkeys(node.operands):
            operand = self.nodes[operand_id]
            if not self.member(operand, group):
                if operand not in group.operands:
                    group.operands.append(operand)
            elif operand.annotations.get("acc") == operand.id:
                group.terms.append(self.term(operand))
            elif "acc" not in operand.annotations:
                self.collect(operand, group)
            else:
                raise _inconsistent(self.name, operand, "is summed into an accumulator its reader is not")
        group.tree.append(node)


def read_groups(graph: Graph, name: str) -> list[Group]:
    """The groups of kernel ``name`` (a kernel subgraph annotated by the fusion pipeline), one per
    value annotated as its own group's root, in dependency order (IRError when annotations are
    missing or do not describe groups)."""
    check_annotations(graph, name)
    reader = _Reader(graph, name)
    groups: list[Group] = []
    for node in graph.compute_nodes():
        if node.annotations["group"] != node.id:
            continue
        group = Group(node, Orient(node.annotations["orient"]))
        if node.annotations.get("acc") == node.id:
            group.terms.append(reader.term(node))
        else:
            reader.collect(node, group)
        groups.append(group)
    for node in graph.compute_nodes():
        if node.id not in reader.seen:
            raise _inconsistent(name, node, "is not reached from the root of its group")
    return groups

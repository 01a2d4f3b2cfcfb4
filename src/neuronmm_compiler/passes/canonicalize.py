"""``canonicalize``: drop dead nodes and cancel double transposes, to a fixed point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import InputError, IRError
from ..ir.graph import Graph
from ..vocab import NodeKind
from .base import Pass, register_pass


def remove_dead_nodes(graph: Graph) -> bool:
    """Remove every non-input node that no output depends on; return True if any was removed.

    Inputs are kept even when unused: they are the kernel's signature, and dropping one would make
    the same input arrays stop fitting the graph.
    """
    import networkx as nx

    g = graph.nx_graph
    live: set[str] = set()
    for output in graph.outputs():
        live.add(output.id)
        live |= nx.ancestors(g, output.id)
    dead = [node.id for node in graph.nodes() if node.id not in live and node.kind != NodeKind.INPUT]
    for node_id in reversed(dead):  # users before their operands
        graph.remove_node(node_id)
    return bool(dead)


def cancel_double_transposes(graph: Graph) -> bool:
    """Rewire users of ``transpose(transpose(x))`` to read ``x``; return True if any use moved.

    The emptied transposes are left for :func:`remove_dead_nodes`.
    """
    changed = False
    for node_id in graph.node_ids():
        node = graph.node(node_id)  # fresh: earlier rewrites may have changed its operand
        if node.kind != NodeKind.TRANSPOSE:
            continue
        inner = graph.node(node.operands[0])
        if inner.kind == NodeKind.TRANSPOSE and graph.replace_all_uses(node.id, inner.operands[0]) > 0:
            changed = True
    return changed


@register_pass
@dataclass(frozen=True)
class Canonicalize(Pass):
    """Remove nodes no output depends on (inputs stay) and fold ``transpose(transpose(x))`` to
    ``x``, repeating until nothing changes (at most ``max_iterations`` rounds)."""

    name: ClassVar[str] = "canonicalize"
    max_iterations: int = 100

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_iterations, bool)
            or not isinstance(self.max_iterations, int)
            or self.max_iterations < 1
        ):
            raise InputError(
                f"canonicalize: max_iterations must be a positive integer; got {self.max_iterations!r}"
            )

    def apply(self, graph: Graph) -> bool:
        """Canonicalize ``graph`` in place; return True if it changed."""
        changed = False
        for _ in range(self.max_iterations):
            # Both rewrites run every round (no short-circuit): cancelling leaves dead transposes.
            progressed = cancel_double_transposes(graph) | remove_dead_nodes(graph)
            if not progressed:
                return changed
            changed = True
        raise IRError(f"canonicalize did not reach a fixed point within {self.max_iterations} rounds")

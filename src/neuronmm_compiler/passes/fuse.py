"""``fuse``: group compute nodes into kernels (NeuronMM's TrainiumFusion), as ``kernel`` annotations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import InputError, UnknownNameError
from ..ir.graph import Graph
from .base import Pass, register_pass

#: How the gated MLP is fused: one kernel, or the up/gate part and the down projection apart.
MLP_MODES: tuple[str, ...] = ("whole", "split")


def kernel_assignment(graph: Graph, mlp: str = "whole") -> dict[str, str]:
    """The kernel id (``k0``, ``k1``, ...) of every compute node under ``mlp`` mode (see :class:`Fuse`)."""
    index: dict[str, int] = {}
    created = 0
    for node in graph.compute_nodes():
        starts_kernel = (
            mlp == "split"
            and node.kind == "matmul"
            and graph.node(node.operands[0]).kind == "elementwise"
        )
        if starts_kernel:
            created += 1
            index[node.id] = created
        else:  # join the latest kernel any operand comes from (inputs count as k0)
            index[node.id] = max((index.get(operand, 0) for operand in node.operands), default=0)
    return {node_id: f"k{number}" for node_id, number in index.items()}


@register_pass
@dataclass(frozen=True)
class Fuse(Pass):
    """Annotate every compute node with ``kernel`` (``k0``, ``k1``, ..., numbered in topological order).

    ``mlp="whole"`` (default): everything is one kernel, ``k0``; the gated MLP's intermediate
    ``h`` then never leaves the chip. ``mlp="split"``: a matmul whose lhs is produced by an
    elementwise node (in the gated MLP, the down projection reading ``h = silu(gate) * up``)
    starts a new kernel, and everything downstream of it joins that kernel (a node joins the
    latest kernel among its operands), as in NeuronMM's separate up/gate and down kernels. A
    graph without elementwise nodes is one kernel either way. Kernels only read values of earlier
    kernels, so they can run one after another.
    """

    name: ClassVar[str] = "fuse"
    mlp: str = "whole"

    def __post_init__(self) -> None:
        if not isinstance(self.mlp, str):
            raise InputError(f"fuse: mlp must be a string, one of {', '.join(MLP_MODES)}; got {self.mlp!r}")
        if self.mlp not in MLP_MODES:
            raise UnknownNameError(f"fuse: unknown mlp mode {self.mlp!r}; accepted: {', '.join(MLP_MODES)}")

    def apply(self, graph: Graph) -> bool:
        """Annotate in place; return True if any ``kernel`` annotation was added or changed."""
        changed = False
        for node_id, kernel in kernel_assignment(graph, self.mlp).items():
            changed |= graph.annotate(node_id, kernel=kernel)
        return changed

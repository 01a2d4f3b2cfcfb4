"""``fuse``: group compute nodes into kernels (NeuronMM's TrainiumFusion), as ``kernel`` annotations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import InputError, UnknownNameError
from ..ir.graph import Graph
from ..vocab import NodeKind
from .base import Pass, register_pass
from .legality import join_conflict

#: How the gated MLP is fused: one kernel, or the up/gate part and the down projection apart.
MLP_MODES: tuple[str, ...] = ("whole", "split")


def kernel_assignment(graph: Graph, mlp: str = "whole") -> dict[str, str]:
    """The kernel id (``k0``, ``k1``, ...) of every compute node under ``mlp`` mode (see :class:`Fuse`)."""
    index: dict[str, int] = {}
    rows: dict[int, int] = {}
    created = 0
    for node in graph.compute_nodes():
        if node.kind == NodeKind.TRANSPOSE:
            # Not computed by any kernel: a view, with the other layout, of the HBM array holding its
            # operand (a graph input, or a value an earlier kernel stores); see split_kernels.
            index[node.id] = index.get(node.operands[0], 0)
            continue
        starts_kernel = (
            mlp == "split"
            and node.kind == NodeKind.MATMUL
            and graph.node(node.operands[0]).kind == NodeKind.ELEMENTWISE
        )
        kernel = max((index.get(operand, 0) for operand in node.operands), default=0)
        if starts_kernel or join_conflict(graph, node.id, kernel, index, rows) is not None:
            created += 1
            kernel = created
        index[node.id] = kernel
        rows.setdefault(kernel, node.shape[0])
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

    In either mode a node also starts a new kernel where the fused lowering could not keep the
    value it reads on chip: the rules of :mod:`.legality` (which the lowering checks each kernel
    against too): a weight computed by the graph, a row-major value read as a matmul's left
    operand or read more than once, an orientation mismatch, a different row count, or the
    transpose of a value computed in the kernel (a transpose is never computed: its readers see
    the HBM array of its operand with the other layout, so a computed operand must be stored by an
    earlier kernel). The built-in graphs (GEMM,
    SVD chain, MLP) never hit these; user graphs may, and then pay an HBM round trip for that
    value instead of failing.
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

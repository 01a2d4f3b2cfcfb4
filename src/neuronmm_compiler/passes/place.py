"""``place``: cache blocking — keep a value in SBUF when nothing outside its kernel needs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import IRError
from ..ir.graph import COMPUTE_KINDS, Graph
from ..vocab import NodeKind
from .base import Pass, register_pass


@register_pass
@dataclass(frozen=True)
class Place(Pass):
    """Annotate every compute node with ``place``: ``sbuf`` when all its users are compute nodes of
    its own kernel (the value stays on chip, in SBUF, inside the kernel, as NeuronMM caches the
    ``(X U)^T`` strip), else ``hbm`` (it feeds a graph output, or a later kernel reads it through
    HBM). A node without users keeps nothing alive outside its kernel and is ``sbuf``. A
    ``transpose`` is ``hbm``, and so is a value it reads: kernels read a transpose as a view, with
    the other layout, of the HBM array holding its operand.

    Needs a ``kernel`` annotation on every compute node: run ``fuse`` first (IRError otherwise).
    """

    name: ClassVar[str] = "place"

    def apply(self, graph: Graph) -> bool:
        """Annotate in place; return True if any ``place`` annotation was added or changed."""
        compute = graph.compute_nodes()
        missing = [node.id for node in compute if "kernel" not in node.annotations]
        if missing:
            listed = ", ".join(f"%{node_id}" for node_id in missing)
            raise IRError(
                f"place needs a kernel annotation on every compute node (run fuse first); missing on {listed}"
            )
        changed = False
        for node in compute:
            kernel = node.annotations["kernel"]
            users = [graph.node(user) for user in graph.users(node.id)]
            # A transpose is read from HBM (a view of its operand's array), so it and its operand are hbm.
            on_chip = node.kind != NodeKind.TRANSPOSE and all(
                user.kind in COMPUTE_KINDS and user.kind != NodeKind.TRANSPOSE
                and user.annotations.get("kernel") == kernel for user in users)
            changed |= graph.annotate(node.id, place="sbuf" if on_chip else "hbm")
        return changed

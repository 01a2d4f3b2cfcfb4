"""``fold-transposes``: implicit transposition at the graph boundary.

A ``transpose`` of an input costs an on-chip transpose (identity matmul plus PSUM eviction per
tile). When the input is only ever read transposed, the kernel can instead load it with the other
layout: the input is re-declared with the transposed logical shape and ``layout="transposed"``,
keeping its name, so the array the user passes (its storage shape) is exactly what it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir.graph import Graph
from ..vocab import Layout, NodeKind
from .base import Pass, register_pass


@register_pass
@dataclass(frozen=True)
class FoldTransposes(Pass):
    """Fold transposes of inputs into the input's layout.

    For each input whose users are all ``transpose`` nodes: reverse its logical shape, flip its
    layout (row_major <-> transposed), point the transposes' users at the input and delete the
    transposes. A transpose of a ``transposed`` input therefore folds back to ``row_major``.

    An input that is also read directly is left alone: it is one tensor in HBM and can have only
    one layout; folding would need the kernel to read it both ways, which a layout cannot say.
    One sweep over the inputs; run ``canonicalize`` first so ``transpose(transpose(x))`` is gone.

    Likewise at the other boundary: an output of ``transpose(v)``, ``v`` computed, becomes an output
    of ``v`` with the flipped layout (the same array in HBM); the transpose, if nothing else reads
    it, is left dead for ``canonicalize``.
    """

    name: ClassVar[str] = "fold-transposes"

    def apply(self, graph: Graph) -> bool:
        """Fold in place; return True if any input was re-declared."""
        changed = False
        for node in graph.inputs():
            users = [graph.node(user) for user in graph.users(node.id)]
            if not users or any(user.kind != NodeKind.TRANSPOSE for user in users):
                continue
            graph.redeclare_input(
                node.id, shape=tuple(reversed(node.shape)), layout=Layout(node.attrs["layout"]).flipped
            )
            for transpose in users:
                graph.replace_all_uses(transpose.id, node.id)
                graph.remove_node(transpose.id)
            changed = True
        return fold_output_transposes(graph) or changed


def fold_output_transposes(graph: Graph) -> bool:
    """Outputs of transposes of computed values become outputs of those values, layout flipped."""
    changed = False
    for out in graph.outputs():
        transpose = graph.node(out.operands[0])
        if transpose.kind == NodeKind.TRANSPOSE and graph.node(transpose.operands[0]).kind != NodeKind.INPUT:
            graph.redirect_output(out.id, transpose.operands[0])
            changed = True
    return changed

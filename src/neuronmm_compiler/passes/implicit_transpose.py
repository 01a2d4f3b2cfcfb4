"""``implicit-transpose``: choose, for every computed value, which of its dims lies on the partition axis.

The TensorEngine contracts over the partition axis: ``psum[M, N] = stationary[K, M].T @
moving[K, N]``. For ``lhs [M, K] @ rhs [K, N]`` both operands must therefore be held with K on
partitions: the rhs as it is (row-major, first dim on partitions) and the lhs *transposed* (its
last dim on partitions). The result can be produced either way round for free, by swapping which
operand is stationary: ``lhs^T`` stationary and ``rhs`` moving gives the product with M on
partitions; ``rhs`` stationary and ``lhs^T`` moving gives its transpose, N on partitions. So if
every producer emits its value in the orientation its consumers want, no transpose instruction is
ever needed: the NeuronMM observation that ``(X U)^T`` is exactly what the second matmul of the
SVD chain wants, and that the gate/up kernel's transposed output is what the down kernel wants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir.graph import Graph, Node
from ..vocab import ElementwiseOp, Layout, NodeKind, Orient
from .base import Pass, register_pass


def is_row_scale(node: Node) -> bool:
    """True for a ``row_scale`` node: a value's per-token FP8 scale computed on chip (docs/quantization.md)."""
    return node.kind == NodeKind.ELEMENTWISE and node.attrs.get("op") == ElementwiseOp.ROW_SCALE


def required_orients(graph: Graph) -> dict[str, Orient]:
    """The ``orient`` each compute node should get (see :class:`ImplicitTranspose`), by node id."""
    orient: dict[str, Orient] = {}
    for node in reversed(graph.compute_nodes()):  # users before the values they read
        if is_row_scale(node):  # one value per token, a column (tokens on partitions), whoever reads it
            orient[node.id] = Orient.NORMAL
            continue
        wants: set[Orient] = set()
        read_as_rhs = False
        for user_id in graph.users(node.id):
            user = graph.node(user_id)
            if is_row_scale(user):  # reduces each token's values in whichever layout the value is held
                continue
            positions = [index for index, operand in enumerate(user.operands) if operand == node.id]
            if user.kind == NodeKind.MATMUL:
                read_as_rhs |= 1 in positions
                if 0 in positions:
                    wants.add(Orient.TRANSPOSED)
            elif user.kind == NodeKind.OUTPUT:
                wants.add(Orient.of(user.layout or Layout.ROW_MAJOR))
            elif user.kind == NodeKind.NORM:  # a norm reduces each row on chip: it reads rows (tokens on partitions)
                wants.add(Orient.NORMAL)
            else:  # elementwise and transpose pass their own orientation on to their operands
                wants.add(orient[user.id])
        orient[node.id] = wants.pop() if len(wants) == 1 and not read_as_rhs else Orient.NORMAL
    return orient


@register_pass
@dataclass(frozen=True)
class ImplicitTranspose(Pass):
    """Annotate every compute node with ``orient``: ``transposed`` (held with its LAST logical dim
    on the partition axis: the value's transpose, feature-major) or ``normal`` (first logical dim
    on partitions, row-major).

    Requirements propagate backwards from the consumers:

    - a value read as the lhs (operand 0) of a matmul must be ``transposed``: the TensorEngine
      contracts over partitions, so the lhs [M, K] needs K there;
    - a value feeding an output is ``normal``, or ``transposed`` when the output has
      ``layout=transposed`` (then the HBM tensor is exactly the on-chip one);
    - an elementwise node's operands get the elementwise node's orientation (the Vector and
      Scalar engines work lane by lane, so all operands must share one layout);
    - a value with conflicting requirements, or read as a matmul rhs (operand 1, which needs K =
      its first dim on partitions), is ``normal``. The lowering must then transpose it for the
      consumers that wanted it transposed; none of the built-in graphs (GEMM, SVD chain, SVD and
      dense MLP) hits this case.
    - a value read by no one (dead; canonicalize removes those) is ``normal``.
    - a ``row_scale`` (an FP8 value's per-token scale, docs/quantization.md) is ``normal``, one value per token on the
      partitions; it puts no requirement on the value it reduces, which the lowering reduces in whichever layout it
      is held, and its readers (quantize, dequantize) read it in theirs.
    - a ``norm`` reads its operand row-major (it reduces each row over the free axis), so the value it
      normalizes (the residual sum of an MLP prologue) is ``normal``; the norm itself follows its readers
      (``transposed`` for the matmuls of an MLP: the prologue transposes the normalized rows into the strip).

    Transpose nodes of computed values are left alone: the pass only annotates and never removes,
    adds or absorbs a transpose. A transpose that reaches this pass is a real data movement (a
    TensorEngine transpose: a tile [p, f] becomes [f, p], so a ``normal`` operand gives a ``normal``
    result), and its operand gets the transpose's orientation, as for an elementwise node. The
    structural rewrites that remove transposes belong to other passes: ``canonicalize`` cancels
    double transposes and ``fold-transposes`` turns transposes of inputs into input layouts, so
    after the default pipeline a transpose survives only where the program really asks for one.
    """

    name: ClassVar[str] = "implicit-transpose"

    def apply(self, graph: Graph) -> bool:
        """Annotate in place; return True if any ``orient`` annotation was added or changed."""
        changed = False
        for node_id, orient in required_orients(graph).items():
            changed |= graph.annotate(node_id, orient=orient)
        return changed

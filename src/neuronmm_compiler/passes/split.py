"""``split_kernels``: cut a fused graph into one graph per kernel, joined through HBM by name.

Not a pass (a pass rewrites one graph in place); it is the step after the fusion pipeline that
hands each kernel to the scheduler on its own. Evaluating the kernels one after another, feeding
each kernel's outputs by name to the later kernels that take them as inputs, gives the outputs of
the whole graph.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import IRError
from ..ir.graph import COMPUTE_KINDS, Graph, Node
from ..ir.verify import verify
from ..vocab import Layout, NodeKind, Orient

__all__ = ["kernel_order", "split_kernels"]


def kernel_order(graph: Graph) -> list[str]:
    """The kernel ids of ``graph``'s compute nodes, in order of first appearance (topological)."""
    kernels = (node.annotations.get("kernel") for node in graph.compute_nodes())
    return [kernel for kernel in dict.fromkeys(kernels) if kernel is not None]


def _unique(base: str, taken: set[str]) -> str:
    name, counter = base, 0
    while name in taken:
        name, counter = f"{base}_{counter}", counter + 1
    taken.add(name)
    return name


def _boundary_layout(node: Node) -> Layout:
    """The HBM layout that stores a computed value as its kernel holds it (row_major if unannotated)."""
    return Orient(node.annotations.get("orient", Orient.NORMAL)).layout


def _add_like(graph: Graph, node: Node) -> None:
    if node.kind == NodeKind.MATMUL:
        graph.add_matmul(*node.operands, id=node.id)
    elif node.kind == NodeKind.TRANSPOSE:
        graph.add_transpose(*node.operands, id=node.id)
    elif node.kind == NodeKind.NORM:
        graph.add_norm(node.attrs["norm"], *node.operands, eps=float(node.attrs["eps"]), id=node.id)
    else:
        graph.add_elementwise(node.attrs["op"], *node.operands, id=node.id, dtype=node.attrs.get("dtype"))
    if node.annotations:
        graph.annotate(node.id, **node.annotations)


def _check_kernels(graph: Graph, compute: Iterable[Node], kernel_of: dict[str, str], order: list[str]) -> None:
    position = {kernel: index for index, kernel in enumerate(order)}
    for node in compute:
        for operand in node.operands:
            if operand in kernel_of and position[kernel_of[operand]] > position[kernel_of[node.id]]:
                raise IRError(
                    f"split_kernels: %{node.id} (kernel {kernel_of[node.id]}) reads %{operand} of the later kernel "
                    f"{kernel_of[operand]}; a kernel may only read values of kernels that appear before it "
                    f"(order of first appearance: {', '.join(order)})"
                )


def split_kernels(graph: Graph) -> list[Graph]:
    """One graph per kernel id of ``graph`` (in :func:`kernel_order`), named ``<graph name>_<kernel id>``.

    Each kernel graph holds, in this order:

    - as inputs, the graph inputs its nodes read (same id, name, shape, dtype, layout; graph
      inputs that nothing reads go to the first kernel, so the kernels' signatures cover all of
      them), then the values it reads from earlier kernels: an input with the value's node id as
      id, named after it, with its logical shape and layout ``transposed`` when the value's
      ``orient`` is ``transposed`` (else ``row_major``);
    - its compute nodes, with their annotations;
    - as outputs, the graph outputs of its values (same id, name, layout; an output of a graph
      input belongs to the first kernel), then the values later kernels read, named as the inputs
      that receive them, with the same layout.

    A ``transpose`` belongs to no kernel: a kernel reading it gets an input with the transpose's
    id, logical shape and the flipped layout, recorded in the kernel graph's ``hbm_aliases`` as a
    view of its operand's HBM array (the graph input's, or the boundary tensor of the computed
    value, which its kernel then stores even if no later kernel reads it directly).

    A boundary value's name is its node id, suffixed ``_0``, ``_1``, ... if a graph input or output
    already has that name, so names stay unique identifiers across all kernels. A single-kernel
    graph comes back equal to ``graph`` apart from its name.

    Raises IRError when the graph is invalid, has no compute nodes, a compute node lacks a
    ``kernel`` annotation (run ``fuse``), or a kernel reads a value of a later kernel.
    """
    verify(graph)
    every = graph.compute_nodes()
    if not every:
        raise IRError(f"split_kernels: graph {graph.name} has no compute nodes, so no kernels to split into")
    missing = [node.id for node in every if "kernel" not in node.annotations]
    if missing:  # verify allows a graph without any kernel annotation
        raise IRError(f"split_kernels: graph {graph.name} has no kernel annotations (run the fuse pass first)")
    # Transposes are not computed by any kernel: a kernel reading one reads its operand's HBM array
    # (a graph input, or a value an earlier kernel stores) as a view with the other layout.
    compute = [node for node in every if node.kind != NodeKind.TRANSPOSE]
    views = {node.id: node for node in every if node.kind == NodeKind.TRANSPOSE}
    order = kernel_order(graph)
    kernel_of = {node.id: node.annotations["kernel"] for node in every}
    _check_kernels(graph, compute, kernel_of, order)
    for output in graph.outputs():
        kernel_of[output.id] = kernel_of.get(output.operands[0], order[0])

    taken = {node.name for node in (*graph.inputs(), *graph.outputs()) if node.name}
    boundary: dict[str, str] = {}  # value id -> name of the HBM tensor carrying it
    readers: dict[str, set[str]] = {}  # value id -> later kernels reading it
    for node in compute:
        users = graph.users(node.id)
        later = {kernel_of[user] for user in users if user not in views and kernel_of[user] != kernel_of[node.id]}
        if later or any(user in views for user in users):
            boundary[node.id] = _unique(node.id, taken)
            readers[node.id] = later

    kernels = []
    for kernel in order:
        sub = Graph(f"{graph.name}_{kernel}")
        members = [node for node in graph.nodes()
                   if kernel_of.get(node.id) == kernel and node.id not in views]
        read = {operand for node in members for operand in node.operands}
        for node in graph.inputs():
            if node.id in read or (kernel == order[0] and not graph.users(node.id)):
                sub.add_input(node.name, node.shape, node.dtype, node.layout, id=node.id)
        for node in compute:
            if kernel in readers.get(node.id, ()):
                sub.add_input(boundary[node.id], node.shape, node.dtype, _boundary_layout(node), id=node.id)
        for view_id in (v for v in views if v in read):
            view = views[view_id]
            source = graph.node(view.operands[0])
            array, layout = ((source.name, source.layout) if source.kind == NodeKind.INPUT
                             else (boundary[source.id], _boundary_layout(source)))
            sub.add_input(view.id, view.shape, view.dtype, Layout(layout).flipped, id=view.id)
            sub.hbm_aliases[view.id] = array
        for node in members:
            if node.kind in COMPUTE_KINDS:
                _add_like(sub, node)
        for node in members:
            if node.kind == NodeKind.OUTPUT:
                sub.add_output(node.name, node.operands[0], layout=node.layout, id=node.id)
        for node in members:
            if node.id in boundary:
                sub.add_output(boundary[node.id], node.id, layout=_boundary_layout(node))
        kernels.append(sub)
    return kernels

"""The graph an MX graph quantizes and the inputs of an MX graph (docs/mx.md; the node rules: ir/mx_graph.py).

:func:`unquantized_mx` is the graph an MX graph approximates (its MX inputs in bf16 at their real shape, no quantize_mx,
ordinary matmuls under the same ids); :func:`calibrate_mx` turns inputs of that graph into inputs of the MX one, each
MX weight quantized offline into its elements and E8M0 scales (ir/mx.py :func:`~neuronmm_compiler.ir.mx.pack`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..vocab import ElementwiseOp, NodeKind
from .graph import Graph
from .mx import X4_DTYPES, is_mx, pack
from .mx_graph import logical_shape, scale_name

if TYPE_CHECKING:
    import numpy as np

__all__ = ["calibrate_mx", "is_mx_graph", "mx_scale_exponents", "mx_weights", "unquantized_mx"]


def is_mx_graph(graph: Graph) -> bool:
    """True when ``graph`` holds an MX value (an MX input or a quantize_mx)."""
    return any(is_mx(node.dtype) for node in graph.nodes())


def mx_weights(graph: Graph) -> list[Any]:
    """The MX inputs of ``graph`` (each stored as two kernel arguments)."""
    return [node for node in graph.inputs() if is_mx(node.dtype)]


def unquantized_mx(graph: Graph, dtype: str = "bfloat16") -> Graph:
    """The graph an MX ``graph`` quantizes: MX inputs as ``dtype`` inputs of their real shape [K, N], no quantize_mx
    (its value read instead), every matmul an ordinary one under its id (the marks of a graph before the pass
    dropped)."""
    out = Graph(graph.name)
    alias: dict[str, str] = {}
    for node in graph.nodes():
        ops = [alias.get(o, o) for o in node.operands]
        if node.kind == NodeKind.INPUT:
            shape = logical_shape(node) if is_mx(node.dtype) else node.shape
            alias[node.id] = out.add_input(node.name or node.id, shape, dtype if is_mx(node.dtype) else node.dtype,
                                           node.layout or "row_major", id=node.id)
        elif node.kind == NodeKind.OUTPUT:
            out.add_output(node.name or node.id, ops[0], layout=node.layout or "row_major", id=node.id)
        elif node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.QUANTIZE_MX:
            alias[node.id] = ops[0]
        else:
            alias[node.id] = add_plain(out, node, ops)
    return out


def add_plain(out: Graph, node: Any, ops: list[str]) -> str:
    """Add to ``out`` a plain copy of the compute ``node`` (matmul, transpose, norm or elementwise) reading ``ops``,
    under its id: no quantization marks and no dtype override, as the unquantized graphs of :func:`unquantized_mx`
    and :func:`.quantized.unquantized` hold every value."""
    if node.kind == NodeKind.MATMUL:
        return out.add_matmul(*ops, id=node.id)
    if node.kind == NodeKind.TRANSPOSE:
        return out.add_transpose(*ops, id=node.id)
    if node.kind == NodeKind.NORM:
        return out.add_norm(node.attrs["norm"], *ops, eps=float(node.attrs["eps"]), id=node.id)
    return out.add_elementwise(node.attrs["op"], *ops, id=node.id)


def calibrate_mx(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs of the MX ``graph`` from ``inputs`` of :func:`unquantized_mx` ``(graph)``: each MX weight quantized
    offline (OCP sample algorithm, ir/mx.py) into its two stored arrays, the others as given."""
    out: dict[str, np.ndarray] = {}
    for node in graph.inputs():
        if is_mx(node.dtype):
            out[node.name], out[scale_name(node.name)] = pack(inputs[node.name], X4_DTYPES[node.dtype].name)
        else:
            out[node.name] = inputs[node.name]
    return out


def mx_scale_exponents(graph: Graph) -> dict[str, dict[str, int]]:
    """The scale units of an MX graph's kernel arguments and outputs (rule NMMC-MX-SCALE-PAIR,
    interpreter/scale_units_mx.py): an MX input's elements ``{<name>_scale: -1}``, its scales ``{<name>_scale: +1}``;
    everything else none (the units of on-chip quantizations are made as the kernel runs)."""
    out: dict[str, dict[str, int]] = {}
    for node in graph.inputs():
        if is_mx(node.dtype):
            out[node.name] = {scale_name(node.name): -1}
            out[scale_name(node.name)] = {scale_name(node.name): 1}
    return out

"""``quantize-fp8``: place the quantization of the activations FP8-weight matmuls read (docs/quantization.md).

A frontend marks a matmul whose weight is stored in FP8 (``mlp_graph(..., fp8=...)``): ``%gate = matmul %x, %w_gate
act_scale=static w_scale=row``, ``W`` an FP8 input, ``x`` bf16. NKI's Tensor Engine multiplies FP8 only by FP8
(``nki.isa.nc_matmul`` lists float8_e4m3/float8_e5m2/bfloat16/float16/tfloat32/float32 inputs, and its
``perf_mode=double_row`` is "Double FP8 mode"; no page documents a mixed FP8 x bf16 product, see docs/quantization.md
"Where quantization happens"), so every such matmul's activation is quantized: this pass makes that explicit, as
nki-library quantizes the hidden state before the gate/up projection and the intermediate before the down projection.
For each marked matmul, in the graph's order, it adds

- once per quantized value ``v`` and scale kind: its scale and ``%v_q = elementwise quantize %v, %v_scale``. A
  ``static`` scale is an input ``<v>_scale`` [1, 1] (calibrated offline, nki-library's ``QuantizationType.STATIC``);
  a ``row`` scale is computed on chip, one per row (token), by ``%v_rscale = elementwise row_scale %v`` (absmax of
  the row / the format's max, nki-library's dynamic ``QuantizationType.ROW``);
- the weight's scale input ``<W>_scale``, [N, 1] per output channel (``w_scale=row``) or [1, 1] (``tensor``);
- the FP8 matmul ``%<id>_acc = matmul %v_q, %W`` (float32 accumulator) and ``%<id> = elementwise dequantize
  %<id>_acc, <v's scale>, %W_scale`` under the marked matmul's id, which every user keeps reading.

The graph is rebuilt in its topological order with the new nodes placed where the marked matmul was, so the
kernel's arguments come in the order of first use (``x``, the weights, ``x_scale``, ``w_gate_scale``, ...): the order
the frontend used to build them in, which keeps every emitted kernel byte-identical. Without marked matmuls the
pass changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir.graph import Graph
from ..ir.mx_graph import MX_MARKS, is_mx_marked
from ..vocab import ElementwiseOp, NodeKind
from .base import Pass, register_pass

__all__ = ["QuantizeFp8", "is_fp8_weight_matmul", "quantize_fp8"]


def is_fp8_weight_matmul(graph: Graph, node_id: str) -> bool:
    """True for a matmul the frontend marked (``act_scale`` / ``w_scale`` attrs) for FP8 (``act_scale=mx`` marks an MX
    matmul, the ``quantize-mx`` pass's: passes/quantize_mx.py)."""
    node = graph.node(node_id)
    return node.kind == NodeKind.MATMUL and "act_scale" in node.attrs and not is_mx_marked(node.attrs)


def quantize_fp8(graph: Graph) -> Graph:
    """``graph`` with every FP8-weight matmul quantized (a new graph; ``graph`` itself unchanged)."""
    out = graph.copy()
    QuantizeFp8().apply(out)
    return out


class _Rebuild:
    def __init__(self, graph: Graph):
        self.src, self.out = graph, Graph(graph.name)
        self.alias: dict[str, str] = {}
        self.quantized: dict[tuple[str, str], tuple[str, str]] = {}

    def copy_node(self, node_id: str) -> None:
        node, out = self.src.node(node_id), self.out
        ops = [self.alias[o] for o in node.operands]
        if node.kind == NodeKind.INPUT:
            new = out.add_input(node.name or node.id, node.shape, node.dtype, node.layout or "row_major", id=node.id)
        elif node.kind == NodeKind.OUTPUT:
            new = out.add_output(node.name or node.id, ops[0], layout=node.layout or "row_major", id=node.id)
        elif node.kind == NodeKind.MATMUL and is_fp8_weight_matmul(self.src, node_id):
            new = self.fp8_matmul(node_id, ops)
        elif node.kind == NodeKind.MATMUL:
            new = out.add_matmul(*ops, id=node.id, **{k: v for k, v in node.attrs.items() if k in MX_MARKS})
        elif node.kind == NodeKind.TRANSPOSE:
            new = out.add_transpose(*ops, id=node.id)
        elif node.kind == NodeKind.NORM:
            new = out.add_norm(node.attrs["norm"], *ops, eps=float(node.attrs["eps"]), id=node.id)
        else:
            dtype = node.attrs.get("dtype") or None
            new = out.add_elementwise(node.attrs["op"], *ops, id=node.id, dtype=dtype)
        if node.annotations and new in out and out.node(new).kind in (NodeKind.MATMUL, NodeKind.TRANSPOSE,
                                                                      NodeKind.ELEMENTWISE, NodeKind.NORM):
            out.annotate(new, **dict(node.annotations))
        self.alias[node_id] = new

    def fp8_matmul(self, node_id: str, ops: list[str]) -> str:
        node, out = self.src.node(node_id), self.out
        value, weight = ops
        w = out.node(weight)
        kind = node.attrs["act_scale"]
        if (value, kind) not in self.quantized:
            if kind == "static":
                scale = out.add_input(f"{value}_scale", (1, 1), "float32")
            else:
                scale = out.add_elementwise(ElementwiseOp.ROW_SCALE, value, id=f"{value}_rscale", dtype=w.dtype)
            q = out.add_elementwise(ElementwiseOp.QUANTIZE, value, scale, id=f"{value}_q", dtype=w.dtype)
            self.quantized[(value, kind)] = (q, scale)
        q, scale = self.quantized[(value, kind)]
        n = w.shape[1] if node.attrs["w_scale"] == "row" else 1
        w_scale = out.add_input(f"{w.name}_scale", (n, 1), "float32")
        acc = out.add_matmul(q, weight, id=f"{node.id}_acc")
        return out.add_elementwise(ElementwiseOp.DEQUANTIZE, acc, scale, w_scale, id=node.id, dtype=node.dtype)


@register_pass
@dataclass(frozen=True)
class QuantizeFp8(Pass):
    """Quantizes the activation each FP8-weight matmul reads and dequantizes its product.

    For a matmul with ``act_scale``/``w_scale`` attrs (set by the frontend): a ``quantize`` node with a static
    [1, 1] scale input or a per-row ``row_scale`` computed on chip, the FP8 matmul into a float32 accumulator, and
    a ``dequantize`` by both scales under the matmul's id (docs/quantization.md)."""

    name: ClassVar[str] = "quantize-fp8"

    def apply(self, graph: Graph) -> bool:
        """Rewrite ``graph`` in place; True when it held an FP8-weight matmul."""
        ids = graph.node_ids()
        if not any(is_fp8_weight_matmul(graph, node_id) for node_id in ids):
            return False
        rebuild = _Rebuild(graph)
        for node_id in ids:
            rebuild.copy_node(node_id)
        graph.replace_contents(rebuild.out)
        return True

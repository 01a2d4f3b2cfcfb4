"""``quantize-mx``: place the on-chip MX quantization of the activations MX-weight matmuls read (docs/mx.md).

A frontend marks a matmul whose weight is stored in an OCP MX format (``mlp_graph(..., mx=...)``): ``%gate = matmul
%x, %w_gate act_scale=mx w_scale=block``, ``w_gate`` an input ``[H/4, I]`` of a packed ``_x4`` dtype, ``x`` bf16
``[T, H]``. ``nki.isa.nc_matmul_mx`` multiplies two MX matrices ("The input stationary and moving tiles must be
float8_e5m2_x4, float8_e4m3fn_x4, or float4_e2m1fn_x4"), so the activation is quantized on chip by
``nki.isa.quantize_mx`` ("Quantize FP16/BF16 data to MXFP8 tensors (both data and scales) using Vector Engine"; NKI ISA
reference). For each marked matmul, in the graph's order, this pass adds once per quantized value ``v``:

- ``%v_q = elementwise quantize_mx %v : [T, K/4] <x4>``, the MXFP8 format of the weight's :class:`~..ir.mx.MxFormat`
  (E4M3 for MXFP4 and MXFP8 E4M3 weights, E5M2 for MXFP8 E5M2),

and replaces the marked matmul by ``%<id> = matmul %v_q, %W`` under its id, whose value is the dequantized product
(the scales are applied inside the instruction: no dequantize node). Without marked matmuls the pass changes nothing.
The nodes are placed where the marked matmul was, as ``quantize-fp8`` places its own (passes/quantize_fp8.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir.graph import Graph
from ..ir.mx import activation_dtype
from ..ir.mx_graph import is_mx_marked
from ..vocab import ElementwiseOp, NodeKind
from .base import Pass, register_pass

__all__ = ["QuantizeMx", "quantize_mx"]


def quantize_mx(graph: Graph) -> Graph:
    """``graph`` with every MX-weight matmul's activation quantized (a new graph; ``graph`` itself unchanged)."""
    out = graph.copy()
    QuantizeMx().apply(out)
    return out


def _marked(graph: Graph, node_id: str) -> bool:
    node = graph.node(node_id)
    return node.kind == NodeKind.MATMUL and is_mx_marked(node.attrs)


@register_pass
@dataclass(frozen=True)
class QuantizeMx(Pass):
    """Quantizes the activation each MX-weight matmul reads (nisa.quantize_mx) and makes the matmul an MX matmul
    (nisa.nc_matmul_mx) under its id (docs/mx.md)."""

    name: ClassVar[str] = "quantize-mx"

    def apply(self, graph: Graph) -> bool:
        """Rewrite ``graph`` in place; True when it held a marked matmul."""
        ids = graph.node_ids()
        if not any(_marked(graph, node_id) for node_id in ids):
            return False
        out = Graph(graph.name)
        alias: dict[str, str] = {}
        quantized: dict[tuple[str, str], str] = {}
        for node_id in ids:
            node = graph.node(node_id)
            ops = [alias[o] for o in node.operands]
            if node.kind == NodeKind.INPUT:
                new = out.add_input(node.name or node.id, node.shape, node.dtype, node.layout or "row_major",
                                    id=node.id)
            elif node.kind == NodeKind.OUTPUT:
                new = out.add_output(node.name or node.id, ops[0], layout=node.layout or "row_major", id=node.id)
            elif node.kind == NodeKind.MATMUL and is_mx_marked(node.attrs):
                value, weight = ops
                dtype = activation_dtype(out.node(weight).dtype)
                if (value, dtype) not in quantized:
                    quantized[(value, dtype)] = out.add_elementwise(ElementwiseOp.QUANTIZE_MX, value, id=f"{value}_q",
                                                                    dtype=dtype)
                new = out.add_matmul(quantized[(value, dtype)], weight, id=node.id)
            elif node.kind == NodeKind.MATMUL:
                new = out.add_matmul(*ops, id=node.id, **{k: v for k, v in node.attrs.items()
                                                          if k in ("act_scale", "w_scale")})
            elif node.kind == NodeKind.TRANSPOSE:
                new = out.add_transpose(*ops, id=node.id)
            elif node.kind == NodeKind.NORM:
                new = out.add_norm(node.attrs["norm"], *ops, eps=float(node.attrs["eps"]), id=node.id)
            else:
                new = out.add_elementwise(node.attrs["op"], *ops, id=node.id, dtype=node.attrs.get("dtype") or None)
            if node.annotations and node.kind != NodeKind.INPUT and node.kind != NodeKind.OUTPUT:
                out.annotate(new, **dict(node.annotations))
            alias[node_id] = new
        graph.replace_contents(out)
        return True

"""Print a graph as a NumPy ``reference(...)`` function: what the kernel computes, in float64."""

from __future__ import annotations

from ..ir import Graph
from ..ir.fp8 import numpy_source as fp8_source
from ..ir.fp8 import row_scale_source
from ..ir.mx import is_mx
from ..vocab import ElementwiseOp, Layout, NodeKind, NormOp

INDENT = "    "


def reference_source(graph: Graph, name: str = "reference") -> list[str]:
    """Source lines of ``def reference(<inputs in storage layout>) -> output(s)`` in float64."""
    from .mx import mx_input_specs, mx_reference_quantize, mx_reference_value

    inputs = graph.inputs()
    outputs = graph.outputs()
    args = ", ".join(spec.name for node in inputs for spec in mx_input_specs(node))  # an MX input: two arrays
    lines = [f"def {name}({args}):",
             f'{INDENT}"""float64 NumPy reference of the kernel (inputs in their HBM layout)."""']
    names: dict[str, str] = {}
    for node in inputs:
        arg = node.attrs["name"]
        if is_mx(node.dtype):  # its elements and scales, as the real matrix they store (docs/mx.md)
            lines += [INDENT + line for line in mx_reference_value(node, arg, f"{arg}_f64")]
            names[node.id] = f"{arg}_f64"
            continue
        value = f"np.asarray({arg}, dtype=np.float64)"
        if node.layout == Layout.TRANSPOSED:
            value += ".T"
        lines.append(f"{INDENT}{arg}_f64 = {value}")
        names[node.id] = f"{arg}_f64"
    for index, node in enumerate(graph.nodes()):
        if node.kind in (NodeKind.INPUT, NodeKind.OUTPUT):
            continue
        ops = [names[o] for o in node.operands]
        if node.kind == NodeKind.MATMUL:
            expr = f"{ops[0]} @ {ops[1]}"
        elif node.kind == NodeKind.TRANSPOSE:
            expr = f"{ops[0]}.T"
        elif node.kind == NodeKind.ELEMENTWISE:
            op = ElementwiseOp.lookup(node.attrs["op"])
            if op is None:
                raise ValueError(f"no NumPy reference for elementwise op {node.attrs['op']!r}")
            if op == ElementwiseOp.QUANTIZE:
                expr = fp8_source(ops[0], ops[1], node.attrs["dtype"])
            elif op == ElementwiseOp.ROW_SCALE:
                expr = row_scale_source(ops[0], node.attrs["dtype"])
            elif op == ElementwiseOp.QUANTIZE_MX:
                lines += [INDENT + line for line in mx_reference_quantize(ops[0], node.attrs["dtype"], f"v{index}")]
                names[node.id] = f"v{index}"
                continue
            else:
                expr = op.numpy_source(*ops)
        elif node.kind == NodeKind.NORM:
            expr = NormOp(node.attrs["norm"]).numpy_source(ops[0], node.attrs["eps"], *ops[1:])
        else:
            raise ValueError(f"no NumPy reference for node kind {node.kind!r}")
        local = f"v{index}"
        lines.append(f"{INDENT}{local} = {expr}  # {node.kind} {node.id}")
        names[node.id] = local
    # Outputs come back in their HBM layout: a transposed output is returned transposed.
    results = [names[node.operands[0]] + (".T" if node.layout == Layout.TRANSPOSED else "")
               for node in outputs]
    lines.append(f"{INDENT}return {', '.join(results)}")
    return lines

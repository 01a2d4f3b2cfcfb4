"""An FP8 graph's unquantized twin and the static scales of its inputs (docs/quantization.md).

An FP8 graph (``mlp_graph(..., fp8=...)`` after the ``quantize-fp8`` pass, or any graph of the same form) holds
FP8 weight inputs, float32 scale inputs, ``quantize`` nodes on the activations matmuls read and ``dequantize`` nodes
on the FP8 matmuls' accumulators; :func:`unquantized` also takes the frontend's graph before that pass.
:func:`unquantized` is the graph it approximates: the same ids, weights in ``dtype``, no scales, no quantize or
dequantize. :func:`calibrate` turns inputs of that graph into inputs of the FP8 one: each weight scale is
``max|w| / max`` per output channel (or per tensor), the weight rounded into the format; each activation scale
``max|v| / max`` of the value ``v`` it quantizes in the float64 evaluation of the unquantized graph on the same
inputs (static scales calibrated on the data, as nki-library's ``gate_up_in_scale`` / ``down_in_scale`` are given).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..vocab import ElementwiseOp, NodeKind
from .fp8 import FP8_FORMATS, is_fp8, round_fp8
from .graph import Graph
from .mx_quantized import add_plain, calibrate_mx, is_mx_graph, mx_scale_exponents, unquantized_mx

if TYPE_CHECKING:
    import numpy as np

__all__ = ["activation_amax", "activation_scale", "calibrate", "is_quantized", "quantize_weight", "scale_exponents",
           "scale_inputs", "unquantized"]


def activation_scale(amax: float, dtype: str) -> np.ndarray:
    """The static per-tensor scale ``[[max|v| / max]]`` (float32) of a value whose largest magnitude is ``amax``."""
    import numpy as np

    return np.array([[max(float(amax), 1e-30) / FP8_FORMATS[dtype].max]], dtype=np.float32)


def quantize_weight(w: np.ndarray, dtype: str, per_channel: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(q, scale)`` of a weight ``w`` [K, N] (``x @ w``): ``scale`` float32 [N, 1] = ``max|w| / max`` per output
    channel (column), or [1, 1] per tensor; ``q`` the ml_dtypes ``dtype`` array ``round_fp8(w / scale)``. The rule
    the kernels' scales follow (``w ~= q * scale^T``)."""
    import ml_dtypes
    import numpy as np

    w = np.asarray(w, dtype=np.float64)
    amax = np.max(np.abs(w), axis=0) if per_channel else np.max(np.abs(w)).reshape(1)
    scale = (np.maximum(amax, 1e-30) / FP8_FORMATS[dtype].max).astype(np.float32)
    q = round_fp8(w / scale.astype(np.float64), dtype)
    return q.astype(getattr(ml_dtypes, dtype)), scale.reshape(-1, 1)


def is_quantized(graph: Graph) -> bool:
    """True when ``graph`` holds a quantize or dequantize node, or MX values (ir/mx_quantized.py)."""
    return is_mx_graph(graph) or any(node.kind == NodeKind.ELEMENTWISE and ElementwiseOp(node.attrs["op"]).scaled
                                     for node in graph.nodes())


def scale_inputs(graph: Graph) -> set[str]:
    """The ids of the scale inputs of an FP8 graph (the operands of its quantize and dequantize nodes but the first)."""
    out: set[str] = set()
    for node in graph.nodes():
        if node.kind == NodeKind.ELEMENTWISE and ElementwiseOp(node.attrs["op"]).scaled:
            out.update(node.operands[1:])
    return out


def unquantized(graph: Graph, dtype: str = "bfloat16") -> Graph:
    """The graph ``graph`` quantizes: FP8 inputs in ``dtype``, scale inputs dropped, ``quantize`` replaced by its value
    and ``dequantize`` by a ``dtype`` matmul with the dequantize's id (an MX graph's: ir/mx_quantized.py)."""
    if is_mx_graph(graph):
        return unquantized_mx(graph, dtype)
    out = Graph(graph.name)
    scales = scale_inputs(graph)
    alias: dict[str, str] = {}
    for node in graph.nodes():
        if node.kind == NodeKind.INPUT:
            if node.id not in scales:
                alias[node.id] = out.add_input(node.name or node.id, node.shape, dtype if is_fp8(node.dtype)
                                               else node.dtype, node.layout or "row_major", id=node.id)
            continue
        ops = [alias.get(o, o) for o in node.operands]
        if node.kind == NodeKind.OUTPUT:
            out.add_output(node.name or node.id, ops[0], layout=node.layout or "row_major", id=node.id)
        elif node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.QUANTIZE:
            alias[node.id] = ops[0]
        elif node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.ROW_SCALE:
            continue  # only quantize and dequantize read it
        elif node.kind == NodeKind.MATMUL and is_fp8(graph.node(node.operands[0]).dtype):
            continue  # made by its dequantize, under the dequantize's id
        elif node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.DEQUANTIZE:
            acc = graph.node(node.operands[0])
            lhs, rhs = (alias.get(o, o) for o in acc.operands)
            alias[node.id] = out.add_matmul(lhs, rhs, id=node.id)
        else:
            alias[node.id] = add_plain(out, node, ops)
    return out


def activation_amax(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``max|v|`` of the value every activation scale input of the FP8 ``graph`` quantizes, by the scale's input name,
    in the float64 evaluation of :func:`unquantized` ``(graph)`` on ``inputs`` (storage layout); a scale several
    quantize nodes read (one static scale shared by several values) gets the largest of theirs."""
    import numpy as np

    from .evaluate import evaluate

    plain = unquantized(graph)
    probe = plain.copy()
    wanted = {}
    static = [node for node in graph.nodes() if node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] ==
              ElementwiseOp.QUANTIZE and graph.node(node.operands[1]).kind == NodeKind.INPUT]
    for node in static:
        source = node.operands[0]
        if plain.node(source).kind != NodeKind.INPUT and source not in wanted:
            wanted[source] = probe.add_output(f"nmmc_probe_{source}", source)
    values = evaluate(probe, {n.name: inputs[n.name] for n in probe.inputs()}) if wanted else {}
    by_id = {node.id: node for node in graph.inputs()}
    out: dict[str, float] = {}
    for node in graph.nodes():
        if node in static:  # a static activation scale (a row scale is computed by the graph itself)
            source = node.operands[0]
            v = values[f"nmmc_probe_{source}"] if source in wanted else np.asarray(
                inputs[by_id[source].name], dtype=np.float64)
            name = by_id[node.operands[1]].name
            out[name] = max(out.get(name, 0.0), float(np.max(np.abs(v))))
    return out


def calibrate(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs of the FP8 ``graph`` from ``inputs`` of :func:`unquantized` ``(graph)`` (storage layout): FP8 weights
    rounded after dividing by their scales, and every scale input (see the module docstring), as float32 / ml_dtypes
    arrays (an MX graph's: ir/mx_quantized.py)."""
    if is_mx_graph(graph):
        return calibrate_mx(graph, inputs)
    out: dict[str, np.ndarray] = {}
    by_id = {node.id: node for node in graph.inputs()}
    formats = {by_id[node.operands[1]].name: node.attrs["dtype"] for node in graph.nodes()
               if node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.QUANTIZE
               and node.operands[1] in by_id}  # a static scale (an input); a row scale is computed
    for name, amax in activation_amax(graph, inputs).items():
        out[name] = activation_scale(amax, formats[name])
    for node in graph.nodes():
        if node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.DEQUANTIZE:
            acc = graph.node(node.operands[0])
            weight, w_scale = by_id[acc.operands[1]], by_id[node.operands[2]]
            # [K, N], row_major (frontends store it so)
            out[weight.name], out[w_scale.name] = quantize_weight(inputs[weight.name], weight.dtype,
                                                                  per_channel=w_scale.shape[0] > 1)
    for node in graph.inputs():
        if node.name not in out:
            out[node.name] = inputs[node.name]
    return out


def scale_exponents(graph: Graph) -> dict[str, dict[str, int]]:
    """Every value's scale units in the quantized graph's semantics (rule NMMC-FP8-SCALE-ONCE, docs/quantization.md),
    by the
    value's name (an input's or output's name, else its id): ``{scale input name: exponent}``, the power of each
    scale the stored value carries beyond the value it stands for. A scale input carries its own scale (+1); an FP8
    weight ``W = w / W_scale`` carries ``-1`` of the scale its dequantize applies; ``quantize v, s`` subtracts one
    ``s``; a matmul and a multiply add their operands' units; ``dequantize acc, s1, s2`` adds one of each; every other
    value (an unquantized input, a silu, a norm, an add) is in the graph's own units: ``{}``. So every dequantized
    product and every output carries ``{}``, and every FP8 matmul operand exactly ``{s: -1}`` of the one scale it was
    quantized by. An MX graph's: ir/mx_quantized.py."""
    if is_mx_graph(graph):
        return mx_scale_exponents(graph)
    weight_scale: dict[str, str] = {}
    for node in graph.nodes():
        if node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.DEQUANTIZE:
            acc = graph.node(node.operands[0])
            weight_scale[acc.operands[1]] = node.operands[2]
    scales = scale_inputs(graph)
    units: dict[str, dict[str, int]] = {}

    def name(node_id: str) -> str:
        node = graph.node(node_id)
        return node.name or node.id if node.kind in (NodeKind.INPUT, NodeKind.OUTPUT) else node.id

    def plus(*parts: dict[str, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in parts:
            for key, exp in part.items():
                out[key] = out.get(key, 0) + exp
        return {key: exp for key, exp in out.items() if exp}

    for node in graph.nodes():
        ops = [units[o] for o in node.operands]
        if node.kind == NodeKind.INPUT:
            if node.id in scales:
                value = {name(node.id): 1}
            elif node.id in weight_scale and is_fp8(node.dtype):
                value = {name(weight_scale[node.id]): -1}
            else:
                value = {}
        elif node.kind == NodeKind.MATMUL:
            value = plus(*ops)
        elif node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.QUANTIZE:
            value = plus(ops[0], {name(node.operands[1]): -1})
        elif node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.ROW_SCALE:
            value = {name(node.id): 1}  # a scale computed on chip: a unit of its own, as a scale input's
        elif node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] in (ElementwiseOp.DEQUANTIZE,
                                                                        ElementwiseOp.MULTIPLY):
            value = plus(*ops)
        elif node.kind in (NodeKind.OUTPUT, NodeKind.TRANSPOSE) or (
                node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] == ElementwiseOp.ADD):
            value = ops[0]
        else:  # silu, norm: functions of values in the graph's own units
            value = {}
        units[node.id] = value
    return {name(node_id): value for node_id, value in units.items()}

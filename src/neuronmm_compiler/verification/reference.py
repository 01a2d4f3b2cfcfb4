"""The float64 reference of a kernel file's graph in row chunks, with the rounding allowance only
where it is not zero, so that verifying a large kernel needs memory for one chunk, not for
float64 copies of every tensor.

A graph is cut by the rows of its outputs when every value an output depends on is either a
*row* value (its rows are the output's rows: a matmul whose lhs is one and whose rhs is not, an
elementwise op of row values, an input read that way) or a *whole* value (it depends on no row
value: weights, products of weights). Rows are then independent: the reference of output rows
``r0:r1`` needs rows ``r0:r1`` of the row inputs and all of the whole ones, which are computed
once. A graph that cannot be cut (a transpose of a row value, say) is evaluated whole, as one
chunk. Either way the values are those of :func:`neuronmm_compiler.ir.evaluate`, in float64.

The allowance (see :mod:`neuronmm_compiler.verification`) is carried only by values that are, or
depend on, a stored intermediate (a computed value some matmul reads); everything else has
variance zero and is not computed. A single GEMM stores no intermediate: its allowance costs
nothing. In a quantized (FP8) graph a stored intermediate is rounded to its dtype in the reference itself, exactly
as the kernel rounds it, and carries no allowance: an FP8 quantization downstream turns any perturbation into whole
FP8 steps of some elements, which no variance bounds, so the reference must hold the kernel's very values (the
residual sum a norm prologue stores in bf16 and normalizes; docs/quantization.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..ir import Graph
from ..ir.fp8 import quantize, row_scale
from ..ir.graph import Node
from ..ir.mx import X4_DTYPES, is_mx, quantize_activation
from ..ir.mx_graph import load_weight, value_shape
from ..ir.quantized import is_quantized
from ..vocab import ElementwiseOp, Layout, NodeKind, NormOp

ROW, WHOLE = "row", "whole"
#: Bytes of float64 row values (and variances) one chunk may hold.
CHUNK_BYTES = 64 * 2**20
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float32": 2.0**-24}
SILU_LIPSCHITZ = 1.1
SIGMAS = 4.0


def row_labels(graph: Graph) -> dict[str, str] | None:
    """Each node an output depends on, labelled :data:`ROW` or :data:`WHOLE`; None when the graph
    cannot be cut by output rows (see the module docstring). Labels are required backwards from
    the outputs (all ROW): a ROW matmul needs a ROW lhs and a WHOLE rhs, a ROW elementwise op ROW
    operands, a WHOLE value WHOLE operands; a value required both ways, or a ROW transpose, fails."""
    outputs = graph.outputs()
    if len({node.shape[0] for node in outputs}) != 1:
        return None
    labels: dict[str, str] = {node.id: ROW for node in outputs}
    for node in reversed(graph.nodes()):
        label = labels.get(node.id)
        if label is None or node.kind == NodeKind.INPUT:
            continue
        if label == WHOLE or node.kind == NodeKind.OUTPUT:
            wanted = [label] * len(node.operands)
        elif node.kind == NodeKind.ELEMENTWISE:  # the scales of an FP8 op are whole, one per tensor or column
            scaled = ElementwiseOp(node.attrs["op"]).scaled  # a row scale [M, 1] is cut by rows like its value
            wanted = [label] + [WHOLE if scaled and graph.node(o).kind == NodeKind.INPUT else label
                                for o in node.operands[1:]]
        elif node.kind == NodeKind.MATMUL:
            wanted = [ROW, WHOLE]
        elif node.kind == NodeKind.NORM:  # each row normalized on its own; gamma and beta are whole
            wanted = [ROW] + [WHOLE] * (len(node.operands) - 1)
        else:  # a transpose of a row value turns rows into columns
            return None
        for operand, want in zip(node.operands, wanted, strict=True):
            if labels.setdefault(operand, want) != want:
                return None
    return labels


def _stored(graph: Graph, node: Node) -> bool:
    """A computed value some matmul or norm reads: held on chip (or handed between kernels) rounded to the graph's
    dtype (a norm prologue normalizes the residual sum as rounded for its store); or an MX quantization reads, which
    reads it from a bf16 tile (docs/mx.md)."""
    if node.kind == NodeKind.ELEMENTWISE and node.attrs["op"] in (ElementwiseOp.QUANTIZE, ElementwiseOp.QUANTIZE_MX):
        return False  # its rounding is the op itself, exact in the reference
    return node.kind not in (NodeKind.INPUT, NodeKind.OUTPUT) and any(
        graph.node(user).kind in (NodeKind.MATMUL, NodeKind.NORM) or graph.node(user).attrs.get("op") ==
        ElementwiseOp.QUANTIZE_MX for user in graph.users(node.id))


def uncertain(graph: Graph) -> set[str]:
    """The nodes whose rounding variance is not zero: stored intermediates and what depends on them."""
    out: set[str] = set()
    for node in graph.nodes():
        if _stored(graph, node) or any(operand in out for operand in node.operands):
            out.add(node.id)
    return out


@dataclass(frozen=True)
class Chunk:
    """Rows ``start:stop`` of every output (``stop`` None: all of them, when the graph is evaluated
    whole): its float64 reference and, where the graph stores intermediates, ``SIGMAS`` standard
    deviations of their rounding error (None: zero)."""

    start: int
    stop: int | None
    values: Mapping[str, np.ndarray]
    sigmas: Mapping[str, np.ndarray | None]


def _round(value: np.ndarray, dtype: str) -> np.ndarray:
    """``value`` rounded to nearest even in ``dtype`` (bfloat16 or float32), back in float64."""
    import ml_dtypes

    into = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    return np.asarray(value).astype(into).astype(np.float64)


def _logical(node: Node, array: np.ndarray, rows: slice | None) -> np.ndarray:
    """An input's logical value (rows ``rows`` of it, or all) in float64."""
    value = array.T if node.layout == Layout.TRANSPOSED else array
    return np.asarray(value if rows is None else value[rows], dtype=np.float64)


def _compute(node: Node, ops: list[np.ndarray], var: list[np.ndarray | None],
             stored: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """A node's value and (None when zero) variance from its operands' (the module docstring of
    :mod:`neuronmm_compiler.verification` derives the propagation)."""
    variance: np.ndarray | None = None
    if node.kind == NodeKind.MATMUL:
        value = ops[0] @ ops[1]
        if var[0] is not None:
            variance = var[0] @ ops[1] ** 2
        if var[1] is not None:
            variance = ops[0] ** 2 @ var[1] + (0.0 if variance is None else variance)
    elif node.kind == NodeKind.TRANSPOSE:
        value, variance = ops[0].T, None if var[0] is None else var[0].T
    elif node.kind == NodeKind.OUTPUT:
        value, variance = ops[0], var[0]
    elif node.kind == NodeKind.NORM:
        # to first order a perturbation of the normalized row passes through scaled by gamma / rms (the
        # statistics move by a mean over the row, which is smaller); gamma and beta are inputs, exact
        value = NormOp(node.attrs["norm"]).apply(ops[0], float(node.attrs["eps"]), *ops[1:])
        if var[0] is not None:
            layer = node.attrs["norm"] == NormOp.LAYERNORM
            centered = ops[0] - ops[0].mean(axis=-1, keepdims=True) if layer else ops[0]
            inv = 1.0 / ((centered**2).mean(axis=-1, keepdims=True) + float(node.attrs["eps"]))
            gain = inv * (ops[1] ** 2 if len(ops) > 1 else 1.0)
            variance = var[0] * gain
    else:
        op = ElementwiseOp(node.attrs["op"])
        if op == ElementwiseOp.QUANTIZE_MX:  # exact, as quantize; a perturbation moves it by whole steps: bounded
            return quantize_activation(ops[0], X4_DTYPES[node.attrs["dtype"]].name), None
        if op == ElementwiseOp.ROW_SCALE:
            value = row_scale(ops[0], node.attrs["dtype"])  # a max moves by at most the perturbation: not tracked
        else:
            value = quantize(ops[0], ops[1], node.attrs["dtype"]) if op == ElementwiseOp.QUANTIZE else op.apply(*ops)
        if op == ElementwiseOp.ROW_SCALE:
            variance = None
        elif op == ElementwiseOp.QUANTIZE:  # a perturbation of x moves q by at most one FP8 step: bounded, not tracked
            variance = None if var[0] is None else var[0] / ops[1] ** 2
        elif op == ElementwiseOp.DEQUANTIZE:
            variance = None if var[0] is None else var[0] * (ops[1] * ops[2].T) ** 2
        elif op == ElementwiseOp.SILU:
            variance = None if var[0] is None else SILU_LIPSCHITZ**2 * var[0]
        elif op == ElementwiseOp.MULTIPLY:
            terms = [v * other**2 for v, other in ((var[0], ops[1]), (var[1], ops[0])) if v is not None]
            variance = sum(terms[1:], terms[0]) if terms else None
        else:  # ElementwiseOp.ADD
            terms = [v for v in var if v is not None]
            variance = sum(terms[1:], terms[0]) if terms else None
    if stored:  # rounding to the graph's dtype adds a relative error uniform in [-u, u]: variance u^2 / 3
        rounding = UNIT_ROUNDOFF[node.dtype] ** 2 / 3.0 * value**2
        variance = rounding if variance is None else variance + rounding
    return value, variance


def chunk_rows(graph: Graph, labels: Mapping[str, str] | None, with_variance: set[str]) -> int:
    """Output rows per chunk: as many as keep the float64 row values (and variances) of one chunk
    within :data:`CHUNK_BYTES`; all rows when the graph is evaluated whole."""
    rows = graph.outputs()[0].shape[0]
    if labels is None:
        return rows
    per_row = sum(8 * value_shape(node)[1] * (2 if node.id in with_variance else 1)
                  for node in graph.nodes() if labels.get(node.id) == ROW and len(node.shape) == 2)
    return max(1, min(rows, CHUNK_BYTES // max(per_row, 1)))


def reference_chunks(graph: Graph, inputs: Mapping[str, np.ndarray], *,
                     rows_per_chunk: int | None = None) -> Iterator[Chunk]:
    """The graph's float64 reference and rounding allowance, chunk by chunk of output rows (one
    chunk when the graph cannot be cut by rows). Outputs are in their *logical* layout: rows of a
    ``transposed`` output are columns of what the kernel writes. ``inputs`` are in storage layout,
    as :func:`neuronmm_compiler.ir.evaluate` takes them."""
    labels = row_labels(graph)
    with_variance = uncertain(graph)
    nodes = graph.nodes()
    stored = {node.id for node in nodes if _stored(graph, node)}
    rounded = stored if is_quantized(graph) else set()  # rounded exactly in the reference (module docstring)
    rows = graph.outputs()[0].shape[0]
    step = rows if labels is None else rows_per_chunk or chunk_rows(graph, labels, with_variance)
    whole: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for start in range(0, rows, step):
        part = slice(start, min(start + step, rows))
        values: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for node in nodes:
            label = WHOLE if labels is None else labels.get(node.id)
            if label is None:  # no output depends on it
                continue
            if label == WHOLE and node.id in whole:
                values[node.id] = whole[node.id]
                continue
            if node.kind == NodeKind.INPUT and is_mx(node.dtype):  # its elements and scales (ir/mx_graph.py)
                result = (load_weight(node, inputs), None)
            elif node.kind == NodeKind.INPUT:
                result = (_logical(node, inputs[node.name], part if label == ROW else None), None)
            else:
                ops = [values[o][0] for o in node.operands]
                var = [values[o][1] for o in node.operands]
                result = _compute(node, ops, var, node.id in stored and node.id not in rounded)
                if node.id in rounded:
                    result = (_round(result[0], node.dtype), result[1])
            values[node.id] = result
            if label == WHOLE and labels is not None:
                whole[node.id] = result
        outputs = [node for node in nodes if node.kind == NodeKind.OUTPUT]
        sigmas = {node.name: None if values[node.id][1] is None else SIGMAS * np.sqrt(values[node.id][1])
                  for node in outputs}
        yield Chunk(part.start, None if labels is None else part.stop,
                    {node.name: values[node.id][0] for node in outputs}, sigmas)

"""A NumPy reference evaluator for the graph IR: the ground truth emitted kernels are compared with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InputError, IRError, NmmcError
from ..vocab import ElementwiseOp, Layout, NodeKind, NormOp
from .fp8 import is_fp8, quantize, row_scale
from .graph import Graph, Node, format_shape
from .mx import X4_DTYPES, is_mx, quantize_activation
from .mx_graph import is_mx_marked, load_weight, scale_name, value_shape
from .verify import verify

if TYPE_CHECKING:
    import numpy as np

__all__ = ["evaluate"]


def _load_input(node: Node, value: Any, dtype: Any) -> np.ndarray:
    import numpy as np

    name = node.name
    try:
        array = np.asarray(value)
        if is_fp8(node.dtype) and array.dtype.kind == "f" and array.dtype.itemsize > 1:
            import ml_dtypes  # FP8 inputs take FP8 values: anything else is rounded into the format first

            array = array.astype(np.float32).astype(getattr(ml_dtypes, node.dtype))
        cast = array.astype(dtype)
    except (TypeError, ValueError) as err:
        raise InputError(f"input {name!r}: cannot convert to {np.dtype(dtype).name}: {err}") from None
    if array.shape != node.storage_shape:
        hint = ""
        if node.layout == Layout.TRANSPOSED:
            hint = f" (layout transposed: HBM holds the transpose of the logical {format_shape(node.shape)})"
        raise InputError(
            f"input {name!r} has shape {format_shape(array.shape)}; expected its storage shape "
            f"{format_shape(node.storage_shape)}{hint}"
        )
    return cast.T if node.layout == Layout.TRANSPOSED else cast


def _compute(node: Node, args: list[np.ndarray]) -> np.ndarray:
    if node.kind == NodeKind.MATMUL and "act_scale" in node.attrs:
        which = "an MX" if is_mx_marked(node.attrs) else "an FP8"
        raise IRError(f"matmul %{node.id} is {which}-weight matmul: its quantization is placed by the quantize-fp8 / "
                      "quantize-mx pass, which evaluation needs first (docs/quantization.md, docs/mx.md)")
    if node.kind == NodeKind.MATMUL:
        return args[0] @ args[1]
    if node.kind == NodeKind.TRANSPOSE:
        return args[0].T
    if node.kind == NodeKind.OUTPUT:
        return args[0]
    if node.kind == NodeKind.NORM:
        return NormOp(node.attrs["norm"]).apply(args[0], float(node.attrs["eps"]), *args[1:])
    op = ElementwiseOp.lookup(node.attrs["op"])
    if op is None:
        raise IRError(f"no evaluation rule for elementwise op {node.attrs['op']!r}")
    if op == ElementwiseOp.QUANTIZE:
        return quantize(args[0], args[1], node.attrs["dtype"])
    if op == ElementwiseOp.ROW_SCALE:
        return row_scale(args[0], node.attrs["dtype"])
    if op == ElementwiseOp.QUANTIZE_MX:
        return quantize_activation(args[0], X4_DTYPES[node.attrs["dtype"]].name)
    return op.apply(*args)


def evaluate(
    graph: Graph, inputs: Mapping[str, np.ndarray], dtype: Any = "float64"
) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` with NumPy; return ``{output name: value}`` in each output's STORAGE layout.

    ``inputs`` maps each input name to an array in its STORAGE shape: a ``transposed`` input of
    logical shape [M, K] arrives as [K, M]. Likewise a ``transposed`` output of logical shape
    [M, N] comes back as its transpose, [N, M] (what the kernel writes to HBM); row_major outputs
    come back as they are. Everything is cast to ``dtype`` (float64 by default)
    and computed in it. Missing or extra inputs, or wrong storage shapes, raise InputError; a
    failure while evaluating raises IRError naming the node. (NumPy is imported here, not with
    the IR.)
    """
    import numpy as np

    verify(graph)
    declared = {node.name: node for node in graph.inputs()}
    declared.update({scale_name(node.name): node for node in graph.inputs() if is_mx(node.dtype)})  # docs/mx.md
    missing = [name for name in declared if name not in inputs]
    extra = sorted(str(name) for name in inputs if name not in declared)
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if extra:
            problems.append(f"unexpected {', '.join(extra)}")
        raise InputError(
            f"inputs do not match graph {graph.name}: {'; '.join(problems)} "
            f"(it takes {', '.join(map(str, declared)) or 'no inputs'})"
        )
    values: dict[str, np.ndarray] = {}
    results: dict[str, np.ndarray] = {}
    for node in graph.nodes():
        if node.kind == NodeKind.INPUT:
            if is_mx(node.dtype):  # its elements and scales, as the real matrix they store
                values[node.id] = load_weight(node, inputs).astype(dtype)
                continue
            values[node.id] = _load_input(node, inputs[node.name], dtype)
            continue
        try:
            value = _compute(node, [values[operand] for operand in node.operands])
        except NmmcError as err:
            raise IRError(f"evaluating {node.kind} %{node.id}: {err}") from err
        except Exception as err:
            raise IRError(f"evaluating {node.kind} %{node.id} failed: {type(err).__name__}: {err}") from err
        if value.shape != value_shape(node):
            raise IRError(
                f"evaluating {node.kind} %{node.id}: got shape {format_shape(value.shape)}, "
                f"the IR says {format_shape(node.shape)}"
            )
        values[node.id] = value
        if node.kind == NodeKind.OUTPUT:
            stored = value.T if node.layout == Layout.TRANSPOSED else value
            results[node.name] = np.array(stored, dtype=dtype, copy=True)
    return results

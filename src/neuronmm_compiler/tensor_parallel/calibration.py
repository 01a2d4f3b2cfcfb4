"""The FP8 tensors of a tensor-parallel plan for ``nmmc verify``: weights quantized and static scales calibrated on
the *plan's* tensors, not on each rank's slices (docs/tensor-parallel.md, "FP8").

As for one kernel (:func:`neuronmm_compiler.ir.quantized.calibrate`), the unquantized tensors are drawn and then
quantized: every FP8 weight the plan names is rounded into its format after dividing by its scale, computed over the
whole plan tensor (``max|W| / max`` per output channel or per tensor), so a column shard reads its slice of the
channels' scales and a row-parallel shard the whole scale, the scales the unsharded weight has. Every activation
scale is ``max|v| / max`` of the values it quantizes in the float64 evaluation of the unquantized computation of all
ranks: a scale the ranks share (x, the intermediate h) is calibrated on the whole value (the largest over the ranks'
column shards), a rank's own scale on its own value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import InputError
from ..ir import Graph
from ..ir.quantized import activation_amax, activation_scale, quantize_weight
from ..passes.quantize_fp8 import quantize_fp8
from ..vocab import ElementwiseOp, NodeKind

#: The operand of a rank's argument: (rank, argument name) -> its array, sliced as the plan says.
Slicer = Callable[[int, str], np.ndarray]


def _scaled_nodes(graph: Graph, op: ElementwiseOp) -> list[Any]:
    return [n for n in graph.nodes() if n.kind == NodeKind.ELEMENTWISE and n.attrs["op"] == op]


def weight_scales(plan: dict[str, Any], workloads: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every weight scale tensor of the plan -> (the FP8 weight tensor it scales, the weight's format), read off the
    kernels' graphs (a dequantize's weight and scale operands) and the plan's arguments."""
    out: dict[str, tuple[str, str]] = {}
    for rank_entry in plan["ranks"]:
        for step in rank_entry["steps"]:
            if "kernel" not in step:
                continue
            graph = quantize_fp8(workloads[step["kernel"]].graph())  # the quantization placed, as in the kernel
            for node in _scaled_nodes(graph, ElementwiseOp.DEQUANTIZE):
                weight = graph.node(graph.node(node.operands[0]).operands[1])
                scale = graph.node(node.operands[2])
                pair = (step["args"][weight.name]["tensor"], weight.dtype)
                if out.setdefault(step["args"][scale.name]["tensor"], pair) != pair:
                    raise InputError(f"plan tensor {step['args'][scale.name]['tensor']!r} scales two weights")
    return out


def quantize_plan(plan: dict[str, Any], workloads: dict[str, Any], raw: Mapping[str, np.ndarray],
                  combined: Graph, bindings: Mapping[str, tuple[int, str]], slicer: Slicer) -> dict[str, np.ndarray]:
    """The plan's tensors for the kernels (see the module docstring) from ``raw``, the unquantized tensors drawn for
    every plan tensor; ``combined`` is the FP8 graph of all ranks (inputs ``bindings``: name -> (rank, argument)),
    ``slicer`` gives a rank's argument sliced from ``raw``."""
    arrays = dict(raw)
    for scale, (weight, fmt) in weight_scales(plan, workloads).items():
        per_channel = int(plan["tensors"][scale]["shape"][0]) > 1
        arrays[weight], arrays[scale] = quantize_weight(raw[weight], fmt, per_channel=per_channel)
        if list(arrays[scale].shape) != list(plan["tensors"][scale]["shape"]):
            raise InputError(f"plan tensor {scale!r} has shape {plan['tensors'][scale]['shape']}; the scales of "
                             f"{weight!r} are {list(arrays[scale].shape)}")
    formats = {combined.node(n.operands[1]).name: n.attrs["dtype"]
               for n in _scaled_nodes(combined, ElementwiseOp.QUANTIZE)}
    inputs = {name: slicer(rank, arg) for name, (rank, arg) in bindings.items()}
    amax: dict[str, tuple[float, str]] = {}
    for name, value in activation_amax(combined, inputs).items():
        rank, arg = bindings[name]
        tensor = _tensor_of(plan, rank, arg)
        amax[tensor] = (max(value, amax.get(tensor, (0.0, ""))[0]), formats[name])
    for tensor, (value, fmt) in amax.items():
        arrays[tensor] = activation_scale(value, fmt)
    return arrays


def _tensor_of(plan: dict[str, Any], rank: int, arg: str) -> str:
    for step in plan["ranks"][rank]["steps"]:
        if "args" in step and arg in step["args"]:
            return str(step["args"][arg]["tensor"])
    raise InputError(f"rank {rank} never reads {arg!r}")

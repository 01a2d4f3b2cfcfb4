"""FP8 weights in graph files (docs/graph-format.md, "FP8 weights"): an input declared ``dtype: float8_e4m3`` (or
``float8_e5m2``, ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``), with ``scale: row`` (one float32 scale per output channel, the
default) or ``scale: tensor`` (one per weight), is an FP8 weight. Every matmul that reads it as its right operand is
marked as the ``--mlp --dtype fp8`` frontend marks one (``act_scale=static w_scale=row|tensor``), and the
``quantize-fp8`` pass (:mod:`..passes.quantize_fp8`, docs/quantization.md "The graph") makes it what it computes: the
left
operand quantized with a static per-tensor scale (once per value), an FP8 matmul, a dequantization back to the
graph's dtype keeping the op's name. The scales are kernel arguments the file does not list: ``<weight>_scale``
([N, 1] or [1, 1]) and ``<value>_scale`` ([1, 1]), after the file's inputs, in the order the matmuls need them.

What an FP8 input may not do is refused with the reason: be read by anything but a matmul's right operand, be stored
transposed (a weight is ``[K, N]`` row-major, as calibration and the kernels read it), or sit in a graph whose
activations are not bfloat16 (the dequantized products are bf16, as ``--mlp --dtype fp8``'s).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InputError
from ..ir.fp8 import is_fp8
from ..vocab import Layout, NodeKind
from .shapes import FP8_SCALES

__all__ = ["FP8_SCALES", "check_fp8_reads", "dtype_flag", "fp8_matmul_names", "input_scale", "is_fp8_derived"]


def input_scale(entry: Mapping[str, Any], dtype: str, layout: Layout, inp: str, source: str) -> str | None:
    """The weight scales (``row`` or ``tensor``) of an input entry of ``dtype``; None for a bf16/fp32 input."""
    scale = entry.get("scale")
    if not is_fp8(dtype):
        if scale is not None:
            raise InputError(f"{source}: input {inp}: scale goes with an FP8 dtype (float8_e4m3, float8_e5m2); "
                             f"{inp} is {dtype}")
        return None
    if scale is None:
        scale = "row"
    if scale not in FP8_SCALES:
        raise InputError(f"{source}: input {inp}: scale {scale!r}: accepted {', '.join(FP8_SCALES)} (one per output "
                         "channel, or one per weight)")
    if layout != Layout.ROW_MAJOR:
        raise InputError(f"{source}: input {inp}: an FP8 weight is stored row_major [K, N] (its scales are per "
                         "column); store it so, or keep it in bf16")
    return str(scale)


def fp8_matmul_names(ops: Sequence[Any], fp8_inputs: Mapping[str, str]) -> dict[str, str]:
    """The names the FP8 matmuls of a graph add, each to what it is: ``<weight>_scale``, ``<value>_scale``,
    ``<value>_q``, ``<op>_acc`` (docs/graph-format.md, "FP8 weights"); the kernel derives its buffers' names from them
    (``x_scale_col``, ``w_scale_row``, ``x_q_strip``), so a file may use none of them nor ``<name>_*``."""
    out: dict[str, str] = {}
    for spec in ops:
        if spec.op == NodeKind.MATMUL and spec.args[1] in fp8_inputs:
            value, weight = spec.args
            out.update({f"{weight}_scale": f"the scales of {weight}", f"{value}_scale": f"the scale of {value}",
                        f"{value}_q": f"the quantized {value}", f"{spec.name}_acc": f"the accumulator of {spec.name}"})
    return out


def check_fp8_reads(ops: Sequence[Any], fp8_inputs: Mapping[str, str], dtypes: set[str], names: set[str],
                    source: str) -> None:
    """InputError when an FP8 input is read other than as a matmul's right operand, the activations are not bf16,
    a matmul would multiply two FP8 inputs, or a name the FP8 matmuls add is already the file's."""
    if not fp8_inputs:
        return
    for spec in ops:
        for index, arg in enumerate(spec.args):
            if arg in fp8_inputs and not (spec.op == NodeKind.MATMUL and index == 1):
                raise InputError(f"{source}: op {spec.name}: reads the FP8 weight {arg} as other than a matmul's "
                                 "right operand; FP8 inputs are weights (x @ W), quantized activations are made by "
                                 "nmmc (docs/graph-format.md, 'FP8 weights')")
    if dtypes != {"bfloat16"}:
        raise InputError(f"{source}: FP8 weights go with bfloat16 activations (the dequantized products are bf16, as "
                         f"--mlp --dtype fp8's); the other inputs are {', '.join(sorted(dtypes))}")
    for added, what in fp8_matmul_names(ops, fp8_inputs).items():
        for name in names:  # the kernel also derives buffers from the added names: x_scale_col, w_scale_row, ...
            if is_fp8_derived(name, {added}):
                raise InputError(f"{source}: {name!r} is a name of the file, and {added!r} is {what}, which the FP8 "
                                 f"matmuls add (as are names derived from it, {added}_*); rename it")


def is_fp8_derived(name: str, added: Iterable[str]) -> bool:
    """Whether ``name`` is one of the ``added`` names of :func:`fp8_matmul_names` or derived from one."""
    return any(name == a or name.startswith(f"{a}_") for a in added)


def dtype_flag(dtype: str) -> str:
    """``--dtype`` (the flag to drop, for the message of a ``--graph`` given other workload options); InputError
    for an FP8 ``--dtype``, saying that a graph file declares its FP8 weights itself."""
    from ..ir.node import DTYPE_ALIASES

    if is_fp8(DTYPE_ALIASES.get(dtype, "")):
        raise InputError(f"--dtype {dtype} with --graph: a graph file declares its FP8 weights itself (dtype: "
                         "float8_e4m3 and scale: row or tensor on each weight input; docs/graph-format.md, 'FP8 "
                         "weights', examples/graphs/lora_fp8.yaml); drop --dtype")
    return "--dtype"

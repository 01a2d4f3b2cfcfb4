"""How much memory verifying a kernel file takes, and the ``--max-memory`` guard.

The estimate adds what verify holds at its peak: the random inputs and every tensor the kernels
write (in their dtypes), the interpreter's copy of its arguments and its written-masks (about as
much again), the float64 values the reference computes once (the *whole* values of
:mod:`.reference`, with their variance where the graph stores intermediates), a few chunks of
float64 row values, and the interpreter itself. It is meant as an upper bound (575 MiB estimated
for a 2048x4096x4096 GEMM whose verify peaks at 345 MiB resident), so that the guard fails before
anything runs rather than the machine swapping or the process being killed part-way.
"""

from __future__ import annotations

import math
import re

from ..codegen import KernelMetadata
from ..errors import InputError
from ..ir import Graph
from .reference import CHUNK_BYTES, WHOLE, chunk_rows, row_labels, uncertain

#: Python, NumPy and the interpreter before any tensor (measured: ~100 MiB resident).
BASE_BYTES = 128 * 2**20
ITEMSIZE = {"bfloat16": 2, "float32": 4}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)(?:i?B)?\s*", re.IGNORECASE)
_UNITS = {"": 2**20, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """``--max-memory`` as bytes: a number with an optional binary unit (K, M, G, T; MiB when
    none), e.g. ``1.5G``, ``800M``, ``1536``; InputError otherwise."""
    match = _SIZE.fullmatch(text)
    if not match or float(match.group(1)) <= 0:
        raise InputError(f"--max-memory takes a size such as 1.5G, 800M or 1536 (MiB); got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def verify_bytes(meta: KernelMetadata, graph: Graph) -> int:
    """The estimated peak memory of verifying the file (see the module docstring)."""
    tensors = sum(math.prod(spec.shape) * ITEMSIZE[spec.dtype] for spec in meta.inputs)
    tensors += sum(math.prod(spec.shape) * ITEMSIZE[spec.dtype] for kernel in meta.kernels for spec in kernel.outputs)
    labels = row_labels(graph)
    with_variance = uncertain(graph)
    whole = 0
    rows_value = 0
    rows = chunk_rows(graph, labels, with_variance)
    for node in graph.nodes():
        copies = 2 if node.id in with_variance else 1
        if labels is None or labels.get(node.id) == WHOLE:
            whole += 8 * math.prod(node.shape) * copies
        elif labels.get(node.id) is not None:
            rows_value += 8 * rows * math.prod(node.shape[1:]) * copies
    chunk = min(rows_value, CHUNK_BYTES) if labels is not None else 0
    return BASE_BYTES + 2 * tensors + whole + 3 * chunk


def check_memory(filename: str, meta: KernelMetadata, graph: Graph, max_memory: int | None) -> None:
    """InputError when verifying the file would take more than ``max_memory`` bytes (None: no limit)."""
    if max_memory is None:
        return
    need = verify_bytes(meta, graph)
    if need > max_memory:
        raise InputError(f"{filename}: verifying it needs about {_mib(need)} (inputs, outputs and the float64 "
                         f"reference), more than --max-memory {_mib(max_memory)}; raise --max-memory or verify "
                         "on a machine with more memory")


def plan_bytes(tensor_elements: int, ranks: int) -> int:
    """The estimated peak memory of verifying a tensor-parallel plan whose tensors hold ``tensor_elements`` values
    in all: the float32 draws, every rank's copy of them and of what its kernels write (at most 4 bytes each, doubled
    for the interpreter's copies and written-masks as for one file), and the float64 reference of the unsharded
    computation with its variance (16 bytes per value). An upper bound in the spirit of :func:`verify_bytes`."""
    return BASE_BYTES + tensor_elements * (4 + 2 * 4 * ranks + 16)


def check_plan_memory(filename: str, tensor_elements: int, ranks: int, max_memory: int | None) -> None:
    """InputError when verifying a plan would take more than ``max_memory`` bytes (None: no limit)."""
    if max_memory is None:
        return
    need = plan_bytes(tensor_elements, ranks)
    if need > max_memory:
        raise InputError(f"{filename}: verifying it needs about {_mib(need)} (every rank's tensors and the float64 "
                         f"reference), more than --max-memory {_mib(max_memory)}; raise --max-memory or verify "
                         "on a machine with more memory")


def _mib(nbytes: int) -> str:
    return f"{math.ceil(nbytes / 2**20)} MiB"

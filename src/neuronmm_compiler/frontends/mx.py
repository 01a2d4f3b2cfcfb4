"""MX weights as a request: ``--dtype mxfp8_e4m3 | mxfp8_e5m2 | mxfp4`` for a GEMM or a gated MLP (docs/mx.md).

:class:`MxWeights` is the one object a workload carries for it (``GemmWorkload.mx``, ``MlpWorkload.mx``), as
``Fp8Weights`` is FP8's: the weights' OCP MX format. Every weight (every SVD factor) is then an MX input stored packed
(``[K/4, N]`` of the format's ``_x4`` dtype, with its E8M0 scales: ir/mx.py), and every matmul reading one is marked
``act_scale=mx w_scale=block``; the ``quantize-mx`` pass places the on-chip quantization of the bf16 activations it
reads (passes/quantize_mx.py). What the request refuses, each in one line: a contraction that is not a whole number of
512-position MX tiles (K of a GEMM, the hidden and intermediate sizes and the SVD ranks of an MLP), a GEMM whose A is
stored transposed, an SVD chain and a norm prologue (not built).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..ir.graph import Graph
from ..ir.mx import MX_FORMATS, check_contraction, mx_format
from ..ir.mx_graph import MX_MARKS

__all__ = ["MxWeights", "mark", "mx_from_dict", "mx_request", "weight_input"]


@dataclass(frozen=True)
class MxWeights:
    """MX weights (``--dtype mxfp4`` ...): ``format``, a canonical name of :data:`~..ir.mx.MX_FORMATS`."""

    format: str = "mxfp8_e4m3"

    def __post_init__(self) -> None:
        if self.format not in MX_FORMATS:
            raise InputError(f"MX format {self.format!r}: accepted {', '.join(MX_FORMATS)}")

    @property
    def spec(self) -> Any:
        """The :class:`~..ir.mx.MxFormat`."""
        return MX_FORMATS[self.format]

    def describe(self) -> str:
        """``mxfp4 weights (float4_e2m1fn, E8M0 scales per 32), activations quantize_mx'd to float8_e4m3fn``."""
        fmt = self.spec
        return (f"{fmt.name} weights ({fmt.weights}, E8M0 scales per 32), activations quantize_mx'd to "
                f"{fmt.activations}")

    def to_dict(self) -> dict[str, str]:
        return {"format": self.format}


def mx_request(spelled: str, *, a_layout: str = "mk", prologue: Any = None, chain: bool = False) -> MxWeights | None:
    """The :class:`MxWeights` a ``--dtype`` spelling asks for (None when it names no MX format), refusing in one line
    what MX weights do not go with (module docstring; ``chain``: an SVD chain ``--shape ... --rank``)."""
    fmt = mx_format(spelled)
    if fmt is None:
        return None
    if a_layout != "mk":
        raise InputError(f"--dtype {spelled} with --a-layout {a_layout}: the MX GEMM quantizes a row-major A [M, K] "
                         "on chip; A stored transposed is not built (docs/mx.md)")
    if prologue is not None:
        raise InputError(f"--dtype {spelled} with --fuse-norm: the norm prologue of an MX MLP is not built "
                         "(docs/mx.md, 'What is not done')")
    if chain:
        raise InputError(f"--dtype {spelled} compiles GEMMs (--shape) and MLPs (--mlp); an MX SVD chain is not built "
                         "(docs/mx.md)")
    return MxWeights(fmt.name)


def weight_input(graph: Graph, name: str, rows: int, cols: int, mx: MxWeights, what: str) -> str:
    """Add the MX weight ``name`` of a ``[rows, cols]`` matrix (``x @ W``): an input ``[rows/4, cols]`` of the format's
    packed dtype (InputError when ``rows`` is not a whole number of MX tiles)."""
    check_contraction(rows, what)
    return graph.add_input(name, (rows // 4, cols), mx.spec.weight_dtype)


def mark(mx: MxWeights | None) -> dict[str, str]:
    """The attrs of a matmul reading an MX weight (none without MX)."""
    return {} if mx is None else dict(MX_MARKS)


def mx_from_dict(data: Any) -> MxWeights | None:
    """The ``mx`` field of a workload's JSON form (frontends/workloads.py): null or ``{format}``."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InputError(f"workload field 'mx' must be null or {{format}}; got {data!r}")
    return MxWeights(str(data.get("format")))

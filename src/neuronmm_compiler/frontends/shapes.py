"""Frontends that build graphs from user descriptions: ``--shape MxNxK``, the plain GEMM, the SVD
chain ``X @ U @ V`` and the (SVD or dense) gated MLP, plus the block-aligned SVD rank.

Every frontend builds the *literal* graph of what the user holds; passes decide how to run it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any

from ..errors import InputError
from ..ir.fp8 import FP8_FORMATS, is_fp8
from ..ir.graph import Graph
from ..ir.node import FP8_MATMUL_VALUES, canonical_dtype
from ..vocab import ALayout, ElementwiseOp
from .mx import MxWeights, mark, mx_request, weight_input
from .prologue import NormPrologue, add_prologue

__all__ = ["A_LAYOUTS", "Fp8Weights", "block_aligned_rank", "dtype_request", "fp8_request", "gemm_graph", "mlp_graph",
           "parse_shape", "svd_chain_graph"]

#: How the user holds A (:class:`~neuronmm_compiler.vocab.ALayout`): "mk" is A[M, K] as is, "km" is
#: A transposed, stored [K, M].
A_LAYOUTS: tuple[ALayout, ...] = tuple(ALayout)
_SHAPE = re.compile(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*\Z")
_SHAPE_HELP = "expected MxNxK with positive integers, e.g. 1024x2048x512"
#: Largest dimension any frontend accepts (graph files too), far beyond any model and small enough
#: that every size nmmc derives from a shape (bytes of a [MAX, MAX] fp32 tensor) stays exact.
MAX_DIMENSION = 2**31


def parse_shape(text: str) -> tuple[int, int, int]:
    """Parse ``"MxNxK"`` (``x`` in either case) into ``(M, N, K)``.

    Malformed text, zero or negative dimensions raise InputError saying what is accepted.
    """
    match = _SHAPE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InputError(f"{_SHAPE_HELP}; got {text!r}")
    if any(len(group) > 12 for group in match.groups()):
        raise InputError(f"{_SHAPE_HELP}; got {text!r} (dimensions are at most {MAX_DIMENSION})")
    m, n, k = (int(group) for group in match.groups())
    if min(m, n, k) <= 0:
        raise InputError(f"{_SHAPE_HELP}; got {text!r} (every dimension must be at least 1)")
    if max(m, n, k) > MAX_DIMENSION:
        raise InputError(f"{_SHAPE_HELP}; got {text!r} (dimensions are at most {MAX_DIMENSION})")
    return m, n, k


def _check_dim(value: object, what: str, frontend: str = "gemm") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{frontend}: {what} must be a positive integer; got {value!r}")
    if value > MAX_DIMENSION:
        raise InputError(f"{frontend}: {what} is {value}; dimensions are at most {MAX_DIMENSION}")
    return value


def gemm_graph(m: int, n: int, k: int, dtype: str = "bfloat16", a_layout: str = ALayout.MK,
               mx: MxWeights | None = None) -> Graph:
    """C[M, N] = A[M, K] @ B[K, N] with inputs ``a``, ``b`` and output ``c``, graph name ``gemm``.

    With ``a_layout="km"`` the user holds A transposed: the graph is the literal one, an input
    ``a_t`` of shape [K, M] (row_major) feeding a ``transpose`` and then the matmul; the
    ``fold-transposes`` pass turns that into a ``transposed`` input. With ``mx`` (:class:`~.mx.MxWeights`) B is an MX
    weight (``[K/4, N]`` packed) and the matmul is marked for the ``quantize-mx`` pass (docs/mx.md).
    """
    m, n, k = _check_dim(m, "M"), _check_dim(n, "N"), _check_dim(k, "K")
    if ALayout.lookup(a_layout) is None:
        raise InputError(f"gemm: unknown A layout {a_layout!r}; accepted: {', '.join(A_LAYOUTS)}")
    graph = Graph("gemm")
    if mx is not None:
        a = graph.add_input("a", (m, k), dtype)
        b = weight_input(graph, "b", k, n, mx, "gemm: K")
        graph.add_output("c", graph.add_matmul(a, b, **mark(mx)))
        return graph
    if a_layout == ALayout.MK:
        lhs = graph.add_input("a", (m, k), dtype)
        rhs = graph.add_input("b", (k, n), dtype)
    else:
        a_t = graph.add_input("a_t", (k, m), dtype)
        rhs = graph.add_input("b", (k, n), dtype)
        lhs = graph.add_transpose(a_t)
    graph.add_output("c", graph.add_matmul(lhs, rhs))
    return graph


def block_aligned_rank(k: int, n: int, keep_ratio: float, align: int = 128) -> int:
    """The NeuronMM block-aligned SVD rank of a [k, n] weight keeping ``keep_ratio`` of its parameters.

    ``r = round(k * n * keep_ratio / ((k + n) * align)) * align``: U [k, r] and V [r, n] hold
    ``r (k + n)`` parameters, about ``keep_ratio * k * n``, and r is a whole number of ``align``
    tiles so no tile is padded. Ties round up (half-up, not Python's round-half-even).

    Clamping: the result is at least ``align`` (a tiny ratio still keeps one tile) and at most the
    full rank ``min(k, n)`` rounded down to a multiple of ``align``. The upper bound wins: when
    ``min(k, n) < align`` no aligned rank fits and the result is ``min(k, n)`` itself.

    ``k``, ``n``, ``align`` must be positive integers and ``keep_ratio`` a number in (0, 1]
    (InputError otherwise). Example: Llama-3.2-1B's gate projection (2048, 8192) at 0.8 -> 1280.
    """
    k, n = _check_dim(k, "k", "block_aligned_rank"), _check_dim(n, "n", "block_aligned_rank")
    align = _check_dim(align, "align", "block_aligned_rank")
    if (
        isinstance(keep_ratio, bool)
        or not isinstance(keep_ratio, Real)
        or math.isnan(keep_ratio)
        or not 0 < keep_ratio <= 1
    ):
        raise InputError(
            f"--keep-ratio is the fraction of parameters kept and must be a number "
            f"in (0, 1]; got {keep_ratio!r}"
        )
    tiles = math.floor(k * n * float(keep_ratio) / ((k + n) * align) + 0.5)
    full = min(k, n)
    ceiling = full // align * align if full >= align else full
    return min(max(tiles * align, align), ceiling)


def svd_chain_graph(m: int, n: int, k: int, rank: int, dtype: str = "bfloat16",
                    x_layout: str = ALayout.MK) -> Graph:
    """Y[M, N] = (X[M, K] @ U[K, R]) @ V[R, N], the SVD-compressed ``X @ W``; graph name ``svd_chain``.

    Inputs ``x``, ``u``, ``v``; nodes ``xu`` (X U) and ``xuv`` (X U V); output ``y``. With
    ``x_layout="km"`` the user holds X transposed: the graph has an input ``x_t`` [K, M] and a
    ``transpose`` before the first matmul, as :func:`gemm_graph` does for A.
    """
    where = "svd_chain"
    m, n, k = _check_dim(m, "M", where), _check_dim(n, "N", where), _check_dim(k, "K", where)
    rank = _check_dim(rank, "rank", where)
    if ALayout.lookup(x_layout) is None:
        raise InputError(f"{where}: unknown X layout {x_layout!r}; accepted: {', '.join(A_LAYOUTS)}")
    graph = Graph("svd_chain")
    x = graph.add_input("x", (m, k), dtype) if x_layout == ALayout.MK else graph.add_input("x_t", (k, m), dtype)
    u = graph.add_input("u", (k, rank), dtype)
    v = graph.add_input("v", (rank, n), dtype)
    if x_layout == ALayout.KM:
        x = graph.add_transpose(x)
    xu = graph.add_matmul(x, u, id="xu")
    graph.add_output("y", graph.add_matmul(xu, v, id="xuv"))
    return graph


def mlp_graph(
    tokens: int, hidden: int, intermediate: int, ranks: tuple[int, int, int] | None, dtype: str = "bfloat16",
    prologue: NormPrologue | None = None, fp8: Fp8Weights | None = None, mx: MxWeights | None = None,
) -> Graph:
    """The gated MLP ``out = (silu(x W_gate) * (x W_up)) W_down`` for x [T, H]; output ``out`` [T, H].

    With ``ranks=(r_gate, r_up, r_down)`` each weight is an SVD pair (graph ``svd_mlp``): inputs
    ``x`` [T, H], ``u_gate`` [H, Rg], ``v_gate`` [Rg, I], ``u_up`` [H, Ru], ``v_up`` [Ru, I],
    ``u_down`` [I, Rd], ``v_down`` [Rd, H]; nodes ``x_ug``, ``gate``, ``x_uu``, ``up``, ``act``
    (silu of gate), ``h`` (act * up), ``h_ud``, ``down``. With ``ranks=None`` the weights are
    dense (graph ``dense_mlp``): ``w_gate`` [H, I], ``w_up`` [H, I], ``w_down`` [I, H]; nodes
    ``gate``, ``up``, ``act``, ``h``, ``down``. A ``prologue`` (:mod:`.prologue`) adds the residual add and
    the norm between ``x`` and the projections, which then read the normalized ``xn``.

    With ``fp8`` (:class:`Fp8Weights`) every weight (every SVD factor) is an FP8 input and every matmul reading one
    is marked an FP8-weight matmul (attrs ``act_scale``, ``w_scale`` from ``fp8``): the ``quantize-fp8`` pass
    (:mod:`~neuronmm_compiler.passes.quantize_fp8`) places the quantization of the value it reads, the weight's
    scale input ``<weight>_scale`` and the dequantization (docs/quantization.md, "Where quantization happens"). With
    ``mx``
    (:class:`~.mx.MxWeights`) every weight is an MX input, packed along its contraction (``[rows/4, cols]``), and every
    matmul reading one is marked for the ``quantize-mx`` pass (docs/mx.md).
    """
    where = "mlp"
    tokens = _check_dim(tokens, "tokens", where)
    hidden = _check_dim(hidden, "hidden", where)
    intermediate = _check_dim(intermediate, "intermediate", where)
    if ranks is not None:
        if not isinstance(ranks, (tuple, list)) or len(ranks) != 3:
            raise InputError(
                f"{where}: ranks must be None (dense MLP) or three positive integers (gate, up, down); "
                f"got {ranks!r}"
            )
        parts = ("gate", "up", "down")
        ranks = tuple(_check_dim(r, f"{part} rank", where) for r, part in zip(ranks, parts, strict=True))
    if mx is not None and (fp8 is not None or prologue is not None):
        raise InputError(f"{where}: MX weights take neither FP8 weights nor a norm prologue (docs/mx.md)")
    graph = Graph("dense_mlp" if ranks is None else "svd_mlp")
    x = graph.add_input("x", (tokens, hidden), dtype)
    marks = mark(mx) if fp8 is None else {"act_scale": fp8.act_scale, "w_scale": fp8.scales}

    def matmul(value: str, weight: str, id: str) -> str:
        return graph.add_matmul(value, weight, id=id, **marks)
    weight_dtype = dtype if fp8 is None else fp8.format

    def add_weight(name: str, rows: int, cols: int) -> str:
        if mx is not None:
            return weight_input(graph, name, rows, cols, mx, f"mlp: the contraction of {name}")
        return graph.add_input(name, (rows, cols), weight_dtype)
    if ranks is None:
        weights = {
            "gate": add_weight("w_gate", hidden, intermediate),
            "up": add_weight("w_up", hidden, intermediate),
            "down": add_weight("w_down", intermediate, hidden),
        }

        def project(value: str, part: str, _tag: str, _base: str) -> str:
            return matmul(value, weights[part], id=part)
    else:
        sizes = {"gate": (hidden, intermediate), "up": (hidden, intermediate), "down": (intermediate, hidden)}
        factors = {}
        for (part, (rows, cols)), rank in zip(sizes.items(), ranks, strict=True):
            factors[part] = (add_weight(f"u_{part}", rows, rank), add_weight(f"v_{part}", rank, cols))

        def project(value: str, part: str, tag: str, base: str) -> str:
            u, v = factors[part]
            return matmul(matmul(value, u, id=f"{base}_{tag}"), v, id=part)

    normed = x if prologue is None else add_prologue(graph, prologue, x)
    gate = project(normed, "gate", "ug", "x")
    up = project(normed, "up", "uu", "x")
    act = graph.add_elementwise(ElementwiseOp.SILU, gate, id="act")
    h = graph.add_elementwise(ElementwiseOp.MULTIPLY, act, up, id="h")
    graph.add_output("out", project(h, "down", "ud", "h"))
    return graph


#: Weight scale granularities of :class:`Fp8Weights`.
FP8_SCALES: tuple[str, ...] = ("row", "tensor")
#: Activation scale kinds of :class:`Fp8Weights` (docs/quantization.md).
FP8_ACT_SCALES: tuple[str, ...] = FP8_MATMUL_VALUES["act_scale"]


@dataclass(frozen=True)
class Fp8Weights:
    """FP8 weights of an MLP (``--dtype fp8``): the ``format`` (``float8_e4m3``, ``float8_e5m2``) and the weight
    scales' granularity, ``row`` (one per output channel, as nki-library's ``QuantizationType.ROW``) or ``tensor``
    (one per weight, ``QuantizationType.STATIC``). ``act_scale``: how the activations the FP8 matmuls read are
    scaled, ``static`` (one calibrated scale per tensor, an input) or ``row`` (each row's absmax / the format's max,
    computed by the graph: nki-library's dynamic ``QuantizationType.ROW``; docs/quantization.md)."""

    format: str = "float8_e4m3"
    scales: str = "row"
    act_scale: str = "static"

    def __post_init__(self) -> None:
        if self.format not in FP8_FORMATS:
            raise InputError(f"FP8 format {self.format!r}: accepted {', '.join(FP8_FORMATS)}")
        if self.scales not in FP8_SCALES:
            raise InputError(f"FP8 weight scales {self.scales!r}: accepted {', '.join(FP8_SCALES)}")
        if self.act_scale not in FP8_ACT_SCALES:
            raise InputError(f"FP8 activation scales {self.act_scale!r}: accepted {', '.join(FP8_ACT_SCALES)}")



def fp8_request(spelled: str, dtype: str, mlp: bool, act_scale: str = "static") -> Fp8Weights | None:
    """The FP8 request of the command line's ``--dtype`` (``spelled``, canonical ``dtype``) and ``--act-scale``: an
    :class:`Fp8Weights` with ``act_scale`` activation scales (static, or row: per token, computed in the kernel) for an
    FP8 ``dtype`` (``--mlp`` only), else None; ``--act-scale row`` without an FP8 ``dtype`` is an InputError."""
    if act_scale not in FP8_ACT_SCALES:
        raise InputError(f"--act-scale {act_scale!r}: accepted {', '.join(FP8_ACT_SCALES)}")
    if not is_fp8(dtype):
        if act_scale != "static":
            raise InputError(f"--act-scale {act_scale} scales the activations of FP8 matmuls: it goes with --dtype fp8 "
                             "(or fp8_e5m2, fp8_e4m3fn; docs/quantization.md)")
        return None
    if not mlp:
        raise InputError(f"--dtype {spelled} (FP8 weights) goes with --mlp (docs/quantization.md)")
    return Fp8Weights(dtype, act_scale=act_scale)


def dtype_request(o: Mapping[str, Any]) -> tuple[str, MxWeights | None]:
    """The element type and OCP MX weights the workload options ``o`` ask for (``--dtype``): ``(its canonical
    dtype, None)``, or ``("bfloat16", MxWeights)`` for an MX format (docs/mx.md; refusals: :func:`~.mx.mx_request`)."""
    mx = mx_request(o["dtype"], a_layout=o["a_layout"], prologue=o["fuse_norm"] if o["mlp"] else None,
                    chain=not o["mlp"] and (o["rank"] is not None or o["keep_ratio"] is not None))
    return ("bfloat16", mx) if mx else (canonical_dtype(o["dtype"]), None)

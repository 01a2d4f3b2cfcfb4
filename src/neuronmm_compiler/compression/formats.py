"""The MLP of a compressed layer as nmmc's kernels compute it, in bf16 or FP8, for the NumPy forward
(docs/quantization.md).

``nmmc compress --eval`` measures the perplexity of what the kernels compute, so each layer's MLP is emulated in the
kernel's formats (the kernel path: ``mlp_graph(..., fp8=Fp8Weights(format))``, lowered by ``lowerings/lower_fused.py``):

- **bfloat16** (``emulated_mlp(..., kernel_dtype="bfloat16")``): every matmul operand is bf16 (the weights as stored,
  the MLP input ``x``, the intermediate ``h`` and, in an SVD layer, the rank-r values ``x @ U``, all rounded to
  nearest even into bf16 as the kernel's strips hold them), products accumulated in fp32 (PSUM), ``silu(gate) * up``
  computed in fp32 before the rounding, the output rounded to bf16 (the kernel's output dtype).
- **FP8** (a layer with an :class:`Fp8Layer`): every weight (every SVD factor) ``W ~= q * s^T`` with ``s = max|W| /
  max`` per output channel (column of ``W`` [K, N]; :func:`~neuronmm_compiler.ir.quantized.quantize_weight`, the
  rule ``nmmc verify`` calibrates kernels with); every value a matmul reads is quantized with a *static* per-tensor
  scale ``max|v| / max`` (:func:`~neuronmm_compiler.ir.quantized.activation_scale`), ``v`` over the calibration
  tokens in the unquantized model (:func:`activation_ranges`) -- ``x`` once for gate and up, ``h`` before the down
  projection, and in an SVD layer ``x @ U`` and ``h @ U_down`` between the factors -- with
  :func:`~neuronmm_compiler.ir.fp8.quantize` (fp32 quotient, clamp, round to nearest even); the FP8 x FP8 products
  accumulate in fp32 and are scaled back on the eviction, ``(acc * s_W) * s_v`` in fp32, as the kernel's
  ``tensor_scalar`` does; ``h`` is the fp32 ``silu(gate) * up``, never rounded to bf16 first; the output is bf16.

With ``--act-scale row`` (an :class:`Fp8Layer` whose ``act_scale`` is "row") every value a matmul reads is instead
quantized with its per-token scale :func:`~neuronmm_compiler.ir.fp8.row_scale` (``max(max|v[t, :]| / max, 1e-6)``,
computed on chip: what ``nmmc tune --dtype fp8 --act-scale row`` kernels compute; docs/quantization.md, "Per-token
activation
scales"), no scale stored. An MX layer (``mx``, :mod:`.mx_layers`) is computed as nmmc's MX kernel does.

The activation points are named by the FP8 graph's scale inputs (``x_scale``, ``h_scale``, ``x_ug_scale``,
``x_uu_scale``, ``h_ud_scale``): a layer file stores them under those names (:mod:`.fp8_files`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ..ir.fp8 import FP8_FORMATS, quantize, row_scale
from ..ir.quantized import activation_scale, quantize_weight
from .calibration import DEFAULT_SEQUENCE, sequences
from .forward import silu

__all__ = ["ACT_SCALES", "FP8_ALIASES", "Fp8Layer", "activation_points", "activation_ranges", "add_range",
           "emulated_mlp", "fp8_format", "fp8_layer", "reduce_rank_mlp", "traced_mlp", "weight_bytes"]

#: ``--dtype`` spellings of the FP8 formats (as ``nmmc tune --dtype`` takes them).
FP8_ALIASES = {"fp8": "float8_e4m3", "fp8_e4m3": "float8_e4m3", "float8_e4m3": "float8_e4m3",
               "fp8_e5m2": "float8_e5m2", "float8_e5m2": "float8_e5m2",
               "fp8_e4m3fn": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn"}
#: ``--act-scale`` values of FP8 layers: static per-tensor scales (stored) or per-token scales computed on chip.
ACT_SCALES = ("static", "row")
#: Per projection, the graph's name of the value a projection reads and of its rank-r value (SVD).
_POINTS = {"gate": ("x", "x_ug"), "up": ("x", "x_uu"), "down": ("h", "h_ud")}


def fp8_format(dtype: str | None) -> str | None:
    """The FP8 format a ``--dtype`` names, or None for a non-FP8 dtype."""
    return None if dtype is None else FP8_ALIASES.get(str(dtype).lower())


def activation_points(layer_factors: Mapping[str, Any]) -> list[str]:
    """The values the FP8 kernel of a layer quantizes (graph value ids), in graph order."""
    points = ["x"]
    points += [_POINTS[p][1] for p in ("gate", "up") if isinstance(layer_factors[p], tuple)]
    points.append("h")
    if isinstance(layer_factors["down"], tuple):
        points.append("h_ud")
    return points


def weight_bytes(shape: tuple[int, int], rank: int | None, dtype: str) -> int:
    """Bytes of one projection's weights (``rank`` None: dense) in ``dtype``: FP8 1, bf16/fp16 2, fp32 4; an MX format
    its elements and E8M0 scales (:attr:`~..ir.mx.MxFormat.weight_bits`: 8.25 or 4.25 bits, rounded up to a byte)."""
    from ..ir.mx import MX_FORMATS

    k, n = shape
    count = k * n if rank is None else rank * (k + n)
    if dtype in MX_FORMATS:
        return -(-int(count * MX_FORMATS[dtype].weight_bits) // 8)
    return (1 if dtype in FP8_FORMATS else 4 if dtype == "float32" else 2) * count


@dataclass(frozen=True)
class Fp8Layer:
    """One layer's FP8 weights and scales: per projection ``(q, s)`` (dense; ``q`` [K, N] ml_dtypes, ``s`` [N, 1]
    float32) or ``((q_u, s_u), (q_v, s_v))`` (SVD factors), and the static activation scales by graph value id
    (empty with ``act_scale`` "row": per-token scales, computed from each value)."""

    format: str
    weights: Mapping[str, Any]
    activation_scales: Mapping[str, float]
    act_scale: str = "static"


def fp8_layer(layer_factors: Mapping[str, Any], ranges: Mapping[str, float], dtype: str,
              act_scale: str = "static") -> Fp8Layer:
    """Quantize one layer's factors (``(u, v)`` or a dense ``W`` per projection) into ``dtype`` with per-output-
    channel weight scales, and its static activation scales from ``ranges`` (``max|v|`` per point,
    :func:`activation_ranges`; unused with ``act_scale`` "row")."""
    weights: dict[str, Any] = {}
    for proj, f in layer_factors.items():
        weights[proj] = tuple(quantize_weight(t, dtype) for t in f) if isinstance(f, tuple) \
            else quantize_weight(f, dtype)
    scales = {} if act_scale == "row" else {p: float(activation_scale(ranges[p], dtype)[0, 0])
                                            for p in activation_points(layer_factors)}
    return Fp8Layer(dtype, weights, scales, act_scale)


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


class _Fp8Matmuls:
    """The FP8 projections of one layer (values quantized once each, as the graph's quantize nodes)."""

    def __init__(self, layer: Fp8Layer):
        self.fmt, self.scales, self.row = layer.format, layer.activation_scales, layer.act_scale == "row"
        self.w = {proj: tuple((q.astype(np.float32), s.reshape(-1).astype(np.float32)) for q, s in f)
                  if isinstance(f[0], tuple) else ((f[0].astype(np.float32), f[1].reshape(-1).astype(np.float32)),)
                  for proj, f in layer.weights.items()}

    def _q(self, v: np.ndarray, point: str) -> tuple[np.ndarray, np.ndarray]:
        """(``v`` quantized, its scale: [1, 1] static or [T, 1] per token), float32."""
        scale = (row_scale(v, self.fmt) if self.row else np.full((1, 1), self.scales[point])).astype(np.float32)
        return quantize(v, scale, self.fmt).astype(np.float32), scale

    def project(self, v: np.ndarray, proj: str, vq: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        for i, (q, s_w) in enumerate(self.w[proj]):
            if i:  # the rank-r value between the factors, quantized again
                vq = self._q(v, _POINTS[proj][1])
            elif vq is None:
                vq = self._q(v, _POINTS[proj][0])
            v = ((vq[0] @ q) * s_w) * vq[1]
        return v


def emulated_mlp(factors: Mapping[int, Mapping[str, Any]], *, kernel_dtype: str = "bfloat16",
                 fp8: Mapping[int, Fp8Layer] | None = None, mx: Mapping[int, Any] | None = None
                 ) -> Callable[[int, np.ndarray], np.ndarray]:
    """``mlp(layer, x)`` as the kernels compute it (module docstring): a layer in ``fp8`` in its FP8 format, a layer in
    ``mx`` (:class:`~.mx_layers.MxLayer`) in its MX format, any other layer from ``factors`` (``(u, v)`` or ``W`` per
    projection) in ``kernel_dtype`` ("bfloat16"; "float32" is the plain float32 product of
    :func:`~.quality.factored_mlp`)."""
    from .mx_layers import mx_mlp

    mx = dict(mx or {})
    fp8 = {layer: q for layer, q in (fp8 or {}).items() if layer not in mx}
    plain = {layer: {p: (tuple(_bf16(t) if kernel_dtype == "bfloat16" else np.asarray(t, np.float32) for t in f)
                         if isinstance(f, tuple) else
                         (_bf16(f) if kernel_dtype == "bfloat16" else np.asarray(f, np.float32)))
                     for p, f in projections.items()}
             for layer, projections in factors.items() if layer not in fp8 and layer not in mx}
    quantized = {layer: _Fp8Matmuls(q) for layer, q in fp8.items()}
    rnd = _bf16 if kernel_dtype == "bfloat16" else (lambda a: np.asarray(a, dtype=np.float32))

    def project(v: np.ndarray, f) -> np.ndarray:
        for t in f if isinstance(f, tuple) else (f,):
            v = rnd(v) @ t  # each operand as the kernel's strip holds it
        return v

    def mlp(layer: int, x: np.ndarray) -> np.ndarray:
        if layer in mx:
            return mx_mlp(mx[layer], x)
        if layer in quantized:
            m = quantized[layer]
            xq = m._q(x, "x")
            h = silu(m.project(x, "gate", xq)) * m.project(x, "up", xq)
            return _bf16(m.project(h, "down"))
        f = plain[layer]
        h = silu(project(x, f["gate"])) * project(x, f["up"])
        out = project(h, f["down"])
        return _bf16(out) if kernel_dtype == "bfloat16" else out

    return mlp


def reduce_rank_mlp(fp8: Mapping[int, Fp8Layer], spans: Sequence[tuple[int, int]]
                    ) -> Callable[[int, np.ndarray], np.ndarray]:
    """``mlp(layer, x)`` of FP8 SVD layers as tensor-parallel ``replicate-u/reduce-rank`` ranks compute them
    (docs/tensor-parallel.md, "FP8 reduce-rank"), ``spans`` each rank's intermediate columns: every rank quantizes x,
    ``x U`` and h as the single-core kernel does (its h the columns of the whole h) and computes ``z_r = h[:, span]
    U_down[span]`` dequantized and rounded to bf16 (its kernel's output); the ``z_r`` summed in fp32 and rounded to
    bf16 (a bf16 all-reduce); ``down_v`` quantizes that sum with the layer's ``h_ud`` scale, and the output is
    rounded to bf16."""
    quantized = {layer: _Fp8Matmuls(q) for layer, q in fp8.items()}

    def mlp(layer: int, x: np.ndarray) -> np.ndarray:
        m = quantized[layer]
        xq = m._q(x, "x")
        hq, s_h = m._q(silu(m.project(x, "gate", xq)) * m.project(x, "up", xq), "h")
        (qu, su), (qv, sv) = m.w["down"]
        z = _bf16(sum(_bf16(((hq[:, a:b] @ qu[a:b]) * su) * s_h) for a, b in spans))
        zq, s_hud = m._q(z, "h_ud")
        return _bf16(((zq @ qv) * sv) * s_hud)

    return mlp


def traced_mlp(layer_factors: Mapping[str, Any], x: np.ndarray, note: Callable[[str, np.ndarray], None]
               ) -> np.ndarray:
    """The unquantized (float32) MLP of one layer's factors on ``x``, calling ``note(point, value)`` on every value
    the FP8 kernel quantizes (:func:`activation_points`)."""
    f = layer_factors
    note("x", x)
    outs = {}
    for proj in ("gate", "up"):
        if isinstance(f[proj], tuple):
            mid = x @ f[proj][0]
            note(_POINTS[proj][1], mid)
            outs[proj] = mid @ f[proj][1]
        else:
            outs[proj] = x @ f[proj]
    h = silu(outs["gate"]) * outs["up"]
    note("h", h)
    if isinstance(f["down"], tuple):
        mid = h @ f["down"][0]
        note("h_ud", mid)
        return mid @ f["down"][1]
    return h @ f["down"]


def add_range(ranges: dict[str, float], point: str, v: np.ndarray) -> None:
    """Fold ``max|v|`` into ``ranges[point]``."""
    ranges[point] = max(ranges.get(point, 0.0), float(np.max(np.abs(v))))


def activation_ranges(model, ids: np.ndarray, factors: Mapping[int, Mapping[str, Any]], *,
                      length: int = DEFAULT_SEQUENCE, progress: Callable[[int, int], None] | None = None
                      ) -> dict[int, dict[str, float]]:
    """Per layer, ``max|v|`` of every value the FP8 kernel quantizes (:func:`activation_points`), over ``ids`` run
    through the *unquantized* model with ``factors`` as its MLPs (float32): the data the static activation scales are
    calibrated on, as ``nmmc verify`` calibrates a kernel's on the unquantized graph (``ir/quantized.py``)."""
    ranges: dict[int, dict[str, float]] = {layer: {} for layer in factors}

    def override(layer: int, x: np.ndarray) -> np.ndarray:
        return traced_mlp(factors[layer], x, lambda point, v: add_range(ranges[layer], point, v))

    chunks = sequences(np.asarray(ids), length)
    for done, chunk in enumerate(chunks, 1):
        model.forward(chunk, override=override, logits=False)
        if progress is not None:
            progress(done, len(chunks))
    return ranges

"""MX layers of ``nmmc compress --dtype mxfp8_e4m3|mxfp8_e5m2|mxfp4`` and their emulation (docs/compression.md, "MX
layers"; the formats and the hardware: docs/mx.md).

A layer compressed for nmmc's MX MLP kernel (trn3, ``nisa.nc_matmul_mx``) is measured by ``--eval`` as that kernel
computes it, with the MX arithmetic of the graph IR (``ir/mx.py``: the one implementation the graph evaluation, the
interpreter and the emitted ``reference()`` use):

- **Weights, offline**: every weight (every SVD factor) ``[K, N]`` quantized along K into blocks of 32 with one E8M0
  scale each by the OCP sample algorithm (:func:`~neuronmm_compiler.ir.mx.quantize_weight`; docs/mx.md,
  "Quantization"), elements ``float8_e4m3fn`` / ``float8_e5m2`` / ``float4_e2m1fn`` (:data:`~neuronmm_compiler.ir.mx.
  MX_FORMATS`), in nmmc's packed block order (a block is 8 packed rows x 4 elements: positions ``512 kt + 128 j + 8 g
  + i``, docs/mx.md "Packed order").
- **Activations, on chip**: every value an MX matmul reads (``x``; ``h``; an SVD layer's rank-r values) is held in a
  bf16 strip, as the kernel's quantize_mx group reads it ("the bf16 strip of the value", lowerings/mx.py), and
  quantized by ``nisa.quantize_mx`` with its documented doubled block scale
  (:func:`~neuronmm_compiler.ir.mx.quantize_activation`; docs/mx.md, "What the hardware documents", rule
  NKI-MX-QUANTIZE-SCALE) into MXFP8: E4M3 for ``mxfp8_e4m3`` and ``mxfp4`` (quantize_mx writes no FP4: docs/mx.md,
  "Using it"), E5M2 for ``mxfp8_e5m2``.
- **Products**: the dequantized elements multiplied in fp32 and accumulated in fp32 (``nc_matmul_mx`` "scales by
  powers of two exactly, accumulates in fp32", docs/mx.md "Verification"); ``silu(gate) * up`` in fp32; the output
  rounded to bf16 (the kernel's output dtype).

nmmc's MX kernels contract a multiple of 512 positions per matmul (rule NKI-MX-LAYOUT; docs/mx.md, "What the hardware
documents"). A contraction that is not (SmolLM2-135M's hidden size 576) is emulated **zero-padded** to the next
multiple of 512, as a kernel over zero-padded operands would compute it: the padding's blocks quantize to zero and the
real positions keep the packed block order; the manifest's ``mx`` record lists every padded contraction. nmmc builds no
such kernel (``tune --mlp --dtype mxfp4`` refuses the shape), so those figures are of the format, not of a kernel
nmmc emits.

The layer files hold the float32 factors (or dense weights), **not** pre-quantized: the quantization above is
deterministic and done when the file is read; ``tune --model`` tunes the recorded format, and an ``nmmc export``
package quantizes the same float32 files into its MX kernels' arguments when it patches a model (export/runtime/mx.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import InputError
from ..ir.mx import MX_BLOCK, MX_FORMATS, MX_TILE, MxFormat, dequantize, mx_format, quantize_activation, quantize_weight
from .forward import silu

__all__ = ["MxLayer", "mx_layer", "mx_mlp", "mx_record", "mx_sharded_mlp", "padded_contractions"]


def _padded(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` with its ``axis`` zero-padded to a multiple of :data:`MX_TILE` (float64)."""
    a = np.asarray(a, dtype=np.float64)
    pad = -a.shape[axis] % MX_TILE
    if not pad:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, pad)
    return np.pad(a, widths)


def mx_weight(w: np.ndarray, element: str) -> np.ndarray:
    """The real matrix [K, N] (float32) of ``w`` quantized offline into MX ``element`` blocks along K (zero-padded to
    a multiple of 512, the padding dropped again)."""
    k = np.asarray(w).shape[0]
    elements, exps = quantize_weight(_padded(w, 0), element)
    return dequantize(elements, exps, 0)[:k].astype(np.float32)


def mx_activation(v: np.ndarray, element: str) -> np.ndarray:
    """``v`` [T, K] as the kernel's matmul reads it (float32): rounded to its bf16 strip, then ``quantize_mx`` along K
    (zero-padded to a multiple of 512, the padding dropped again)."""
    k = np.asarray(v).shape[1]
    return quantize_activation(_padded(_strip(v), 1), element)[:, :k].astype(np.float32)


def _strip(v: np.ndarray) -> np.ndarray:
    """``v`` as the bf16 strip quantize_mx reads (lowerings/mx.py, ``mx_quantize_group``: a ``bfloat16`` staging tile;
    quantize_mx reads "bf16/fp16", docs/mx.md "Tiles"). The graph evaluation (ir/evaluate.py) quantizes the float64
    value instead; the double rounding moves some elements by one MX step (tests/test_compress_mx.py)."""
    return np.asarray(v, dtype=np.float32).astype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class MxLayer:
    """One layer's MX weights: ``format`` and, per projection, the dequantized real matrix of the quantized weight
    (float32 ``W`` [K, N], or ``(U, V)`` for SVD factors, each quantized along its own contraction)."""

    format: MxFormat
    weights: Mapping[str, Any]


def mx_layer(layer_factors: Mapping[str, Any], fmt: str) -> MxLayer:
    """Quantize one layer's factors (``(u, v)`` or a dense ``W`` per projection) into the MX format ``fmt`` (a
    ``--dtype`` spelling or canonical name)."""
    found = mx_format(fmt)
    if found is None:
        raise InputError(f"unknown MX format {fmt!r}; accepted: {', '.join(MX_FORMATS)}")
    weights = {proj: tuple(mx_weight(t, found.weights) for t in f) if isinstance(f, tuple)
               else mx_weight(f, found.weights) for proj, f in layer_factors.items()}
    return MxLayer(found, weights)


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def mx_mlp(layer: MxLayer, x: np.ndarray) -> np.ndarray:
    """The layer's MLP on ``x`` [T, hidden] as nmmc's MX kernel computes it (module docstring); float32 holding the
    bf16 output."""
    act = layer.format.activations

    def project(v: np.ndarray, f: Any, vq: np.ndarray | None = None) -> np.ndarray:
        for i, t in enumerate(f if isinstance(f, tuple) else (f,)):
            v = (vq if i == 0 and vq is not None else mx_activation(v, act)) @ t  # fp32 products and accumulation
        return v

    xq = mx_activation(x, act)  # quantized once for gate and up (one quantize_mx node)
    w = layer.weights
    h = silu(project(x, w["gate"], xq)) * project(x, w["up"], xq)
    return _bf16(project(h, w["down"]))


def mx_sharded_mlp(model, shard_factors: Mapping[int, Mapping[str, Any]], shards: Sequence[tuple[int, int]],
                   formats: Mapping[int, str], other: Callable[[int, np.ndarray], np.ndarray]
                   ) -> Callable[[int, np.ndarray], np.ndarray]:
    """``mlp(layer, x)`` of a ``--tp`` deployment whose MX layers (``formats``) run nmmc's MX MLP kernel on each rank's
    blocks (``shard_factors[layer][proj][rank]``, the factor-shard blocks; the original weight's block where a
    projection is not factored): each rank's bf16 output :func:`mx_mlp` computes, summed in fp32 and rounded to bf16
    (a bf16 all-reduce). Every rank's share of the intermediate dimension is whole 512-position tiles (compress
    refuses a ``--tp`` that is not), so the down projection's blocks are the unsharded layer's. Other layers:
    ``other``."""
    cache: dict[tuple[int, int], MxLayer] = {}

    def rank_layer(layer: int, i: int) -> MxLayer:
        if (layer, i) not in cache:
            a, b = shards[i]
            f = shard_factors.get(layer) or {}
            cache[(layer, i)] = mx_layer({p: f[p][i] if f.get(p) else (
                model.mlp_weight(layer, p)[a:b] if p == "down" else model.mlp_weight(layer, p)[:, a:b])
                for p in ("gate", "up", "down")}, formats[layer])
        return cache[(layer, i)]

    def mlp(layer: int, x: np.ndarray) -> np.ndarray:
        if layer not in formats:
            return other(layer, x)
        return _bf16(sum(mx_mlp(rank_layer(layer, i), x) for i in range(len(shards))))

    return mlp


def padded_contractions(shapes: Mapping[str, tuple[int, int]], ranks: Mapping[str, int | None]
                        ) -> dict[str, list[int]]:
    """Per weight of a layer (``gate``, or ``gate.u``/``gate.v`` for factors; ``shapes``: [in, out] per projection,
    ``ranks``: None for dense), ``[K, padded K]`` where its contraction K is not a multiple of 512."""
    out: dict[str, list[int]] = {}
    for proj, (k, _) in shapes.items():
        rank = ranks[proj]
        for name, c in ((proj, k),) if rank is None else ((f"{proj}.u", k), (f"{proj}.v", rank)):
            if c % MX_TILE:
                out[name] = [c, c + (-c % MX_TILE)]
    return out


def mx_record(layers: Mapping[int, str], padded: Mapping[str, list[int]]) -> dict[str, Any]:
    """The manifest's ``mx`` record: how the MX layers (``layers``: each one's format) are to be read. One format: its
    elements; several (``--choose-ranks`` among them): ``format`` says so and ``formats`` holds each one's."""
    found = [mx_format(f) for f in dict.fromkeys(layers.values())]
    assert found and None not in found
    each = {f.name: {"weights": f.weights, "activations": f.activations, "weight_bits": f.weight_bits}
            for f in found if f is not None}
    one = {"format": found[0].name, **each[found[0].name]} if len(each) == 1 else {
        "format": "per layer (layers[i].mx)", "formats": each}
    return {**one, "block": MX_BLOCK,
            "weight_scales": "one E8M0 scale per block of 32 along the contraction, OCP sample algorithm "
                             "(ir/mx.py quantize_weight), nmmc's packed block order",
            "activation_scales": "on chip: quantize_mx's doubled E8M0 block scale of the bf16 value (ir/mx.py "
                                 "quantize_activation)",
            "stored": "float32 factors (or dense weights), NOT pre-quantized: quantized when read",
            "padded_contractions": dict(padded), "layers": sorted(int(i) for i in layers),
            "docs": "docs/compression.md, MX layers (compression/mx_layers.py)"}

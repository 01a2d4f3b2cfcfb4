"""FP8 layers in ``nmmc compress``'s output files (``--dtype fp8``; docs/compression.md "FP8 layers",
docs/quantization.md).

A layer whose MLP kernel is FP8 (manifest ``layers[i].fp8`` = ``"float8_e4m3"``, ``"float8_e5m2"`` or
``"float8_e4m3fn"``) holds, in its
``layer_{i:03d}.safetensors``, instead of bf16/fp32 weights:

==========================================================  ==========  ==========  ==================================
tensor                                                      dtype       shape       FP8 graph input (``mlp_graph``)
==========================================================  ==========  ==========  ==================================
``model.layers.{i}.mlp.{proj}_proj.w`` (dense)              F8_E4M3     [in, out]   ``w_{proj}``
``model.layers.{i}.mlp.{proj}_proj.u`` / ``.v`` (SVD)       F8_E4M3     [in, r] ... ``u_{proj}`` / ``v_{proj}``
``model.layers.{i}.mlp.{proj}_proj.{w,u,v}_scale``          F32         [N, 1]      ``{w,u,v}_{proj}_scale``
``model.layers.{i}.mlp.{point}_scale``                      F32         [1, 1]      ``{point}_scale``
==========================================================  ==========  ==========  ==================================

- ``F8_E4M3`` holds nmmc's ``float8_e4m3`` (IEEE-style, largest finite 240; F8_E5M2 for ``float8_e5m2``). safetensors'
  F8_E4M3 is ``torch.float8_e4m3fn`` (largest 448): the two share every bit pattern whose exponent field is at most
  14, i.e. every value of magnitude <= 240, and nmmc's quantization saturates at 240, so the bytes read as either
  type give the same values (a test checks it). nmmc's ``float8_e4m3fn`` (OCP, largest 448; trn3 kernels) is that
  F8_E4M3 type itself: the manifest's format says how the bytes are read.
- Weight scales: one per output channel (N = the weight's columns: ``out`` for ``w`` and ``v``, ``r`` for ``u``),
  ``W ~= q * scale^T``; activation scales: static, per tensor, ``max|v| / max`` over the calibration tokens in the
  unquantized model, for the points the kernel quantizes: ``x`` (gate and up's input), ``h`` (down's input) and,
  for an SVD projection, its rank-r value (``x_ug``, ``x_uu``, ``h_ud``). The kernel divides by them
  (:mod:`.formats`). With ``--act-scale row`` (manifest ``fp8.act_scale`` "row") there are none: the kernel computes
  each token's scale on chip.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import InputError
from ..ir.fp8 import FP8_FORMATS
from .formats import Fp8Layer, activation_points
from .manifest import dense_name, factor_names

__all__ = ["FP8_CODES", "activation_scale_name", "entry_act_scale", "expected_fp8_tensors", "fp8_tensors",
           "read_fp8_layer", "weight_scale_name"]

#: safetensors dtype code of each FP8 format, and the ml_dtypes type safetensors writes under that code.
FP8_CODES = {"float8_e4m3": ("F8_E4M3", ml_dtypes.float8_e4m3fn), "float8_e5m2": ("F8_E5M2", ml_dtypes.float8_e5m2),
             "float8_e4m3fn": ("F8_E4M3", ml_dtypes.float8_e4m3fn)}


def entry_act_scale(fp8: tuple) -> str:
    """The activation scales of ``compress_model``'s per-layer ``fp8`` entry: ``(format, ranges)`` (static) or
    ``(format, ranges, act_scale)``."""
    return str(fp8[2]) if len(fp8) > 2 else "static"


def weight_scale_name(layer: int, proj: str, which: str) -> str:
    """``model.layers.{layer}.mlp.{proj}_proj.{which}_scale`` (``which``: w, u or v)."""
    return f"model.layers.{layer}.mlp.{proj}_proj.{which}_scale"


def activation_scale_name(layer: int, point: str) -> str:
    """``model.layers.{layer}.mlp.{point}_scale`` (``point``: x, h, x_ug, x_uu, h_ud)."""
    return f"model.layers.{layer}.mlp.{point}_scale"


def _weight_names(layer: int, proj: str, rank: int | None) -> list[tuple[str, str]]:
    if rank is None:
        return [(dense_name(layer, proj), "w")]
    u, v = factor_names(layer, proj)
    return [(u, "u"), (v, "v")]


def expected_fp8_tensors(shapes: Mapping[str, tuple[int, int]], layer: int, ranks: Mapping[str, int | None],
                         fmt: str, act_scale: str = "static") -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, safetensors code) of an FP8 layer file (``shapes``: [in, out] per projection)."""
    code = FP8_CODES[fmt][0]
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for proj, (k, n) in shapes.items():
        rank = ranks[proj]
        dims = [(k, n)] if rank is None else [(k, rank), (rank, n)]
        for (name, which), shape in zip(_weight_names(layer, proj, rank), dims, strict=True):
            out[name] = (shape, code)
            out[weight_scale_name(layer, proj, which)] = ((shape[1], 1), "F32")
    points = [] if act_scale == "row" else activation_points({p: None if r is None else (None, None)
                                                                for p, r in ranks.items()})
    out.update({activation_scale_name(layer, p): ((1, 1), "F32") for p in points})
    return out


def fp8_tensors(layer: int, q: Fp8Layer) -> dict[str, np.ndarray]:
    """The tensors of an FP8 layer file (see the module docstring)."""
    store = FP8_CODES[q.format][1]
    out: dict[str, np.ndarray] = {}
    for proj, f in q.weights.items():
        pairs = f if isinstance(f[0], tuple) else (f,)
        names = _weight_names(layer, proj, None if len(pairs) == 1 else pairs[0][0].shape[1])
        for (name, which), (values, scale) in zip(names, pairs, strict=True):
            out[name] = np.ascontiguousarray(values).view(np.uint8).view(store)
            out[weight_scale_name(layer, proj, which)] = np.asarray(scale, dtype=np.float32).reshape(-1, 1)
    for point, scale in q.activation_scales.items():
        out[activation_scale_name(layer, point)] = np.full((1, 1), scale, dtype=np.float32)
    return out


def _read_raw(path: Path, names: list[str], fmt: str) -> dict[str, np.ndarray]:
    """Tensors of a safetensors file read from its bytes (safetensors' NumPy reader cannot make FP8 arrays): FP8 (the
    code of format ``fmt``) as that format's ml_dtypes type, F32 as float32."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        out = {}
        for name in names:
            info = header[name]
            start, end = info["data_offsets"]
            f.seek(8 + size + start)
            raw = np.frombuffer(f.read(end - start), dtype=np.uint8)
            if info["dtype"] == FP8_CODES[fmt][0]:
                out[name] = raw.view(getattr(ml_dtypes, fmt)).reshape(info["shape"])
            elif info["dtype"] == "F32":
                out[name] = raw.view("<f4").reshape(info["shape"]).astype(np.float32)
            else:
                raise InputError(f"{path}: tensor {name} is {info['dtype']}; a {fmt} layer holds "
                                 f"{FP8_CODES[fmt][0]} and F32 tensors")
    return out


def read_fp8_layer(path: str | Path, layer: int, ranks: Mapping[str, int | None], fmt: str,
                   act_scale: str = "static") -> tuple[Fp8Layer, dict[str, Any]]:
    """An FP8 layer file: its :class:`Fp8Layer` and its dequantized factors (``q * scale^T``, float32; ``(u, v)`` or
    ``W`` per projection); ``act_scale`` "row": no stored activation scales (per token, on chip)."""
    if fmt not in FP8_FORMATS:
        raise InputError(f"{path}: unknown FP8 format {fmt!r}")
    names = []
    for proj, rank in ranks.items():
        for name, which in _weight_names(layer, proj, rank):
            names += [name, weight_scale_name(layer, proj, which)]
    points = [] if act_scale == "row" else activation_points({p: None if r is None else (None, None)
                                                                for p, r in ranks.items()})
    names += [activation_scale_name(layer, p) for p in points]
    raw = _read_raw(Path(path), names, fmt)
    weights: dict[str, Any] = {}
    dequantized: dict[str, Any] = {}
    for proj, rank in ranks.items():
        pairs = tuple((raw[name], raw[weight_scale_name(layer, proj, which)])
                      for name, which in _weight_names(layer, proj, rank))
        weights[proj] = pairs[0] if rank is None else pairs
        values = tuple(q.astype(np.float32) * s.reshape(1, -1) for q, s in pairs)
        dequantized[proj] = values[0] if rank is None else values
    scales = {p: float(raw[activation_scale_name(layer, p)][0, 0]) for p in points}
    return Fp8Layer(fmt, weights, scales, act_scale), dequantized

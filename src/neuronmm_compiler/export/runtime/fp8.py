"""FP8 kernel arguments from a Hugging Face checkpoint: weights quantized per output channel on the fly, and the
static activation scales calibrated on the unpatched model.

The rules are nmmc's (``ir/quantized.py``: ``quantize_weight``, ``activation_scale``; ``ir/fp8.py``: ``round_fp8``),
restated in torch so that a package needs no nmmc on a Neuron host, and held equal to them by nmmc's tests:

- a weight ``W`` [in, out] (the transpose of the checkpoint's ``weight`` [out, in]) gets one scale per output
  channel, ``s_j = max_i |W[i, j]| / max`` (float32; max = 240 for ``float8_e4m3``, 57344 for ``float8_e5m2``), and
  ``q = rne(clip(W / s, -max, max))`` computed in float64, rounded to nearest even onto the format's grid, so that
  ``W ~= q * s^T``;
- a value the kernel quantizes (``x``, the MLP input read by gate and up; ``h = silu(gate) * up``, read by down)
  gets one static scale ``max|v| / max`` (float32), ``max|v|`` over the calibration tokens run through the
  *unpatched* model, as ``nmmc compress --dtype fp8`` calibrates them on the unquantized model.

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: Largest finite value and (mantissa bits, smallest normal exponent) of each format (nmmc's ir/fp8.py; the maxima
#: are nki-library's get_max_positive_value_for_dtype, docs/quantization.md "Formats").
FP8_MAX = {"float8_e4m3": 240.0, "float8_e5m2": 57344.0}
_GRID = {"float8_e4m3": (3, -6), "float8_e5m2": (2, -14)}
#: The FP8 kernel's activation points of a dense MLP: its input and the intermediate (docs/quantization.md "The graph").
DENSE_POINTS = ("x", "h")


def round_fp8(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """``v`` (float64) clamped to the format's finite range and rounded to nearest even onto its grid (float64)."""
    mantissa, emin = _GRID[fmt]
    v = v.clamp(-FP8_MAX[fmt], FP8_MAX[fmt])
    _, exponent = torch.frexp(v)  # |v| = m * 2^e, m in [0.5, 1): the binade's exponent is e - 1
    quantum = torch.exp2((torch.clamp(exponent - 1, min=emin) - mantissa).to(torch.float64))
    return torch.round(v / quantum) * quantum  # torch.round rounds half to even


def quantize_weight(weight: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [in, out] in the format's torch dtype, scale [out, 1] float32) of a checkpoint weight [out, in]."""
    from .backend import torch_dtype

    w = weight.to(torch.float64)
    amax = w.abs().amax(dim=1)
    scale = (amax.clamp(min=1e-30) / FP8_MAX[fmt]).to(torch.float32)
    q = round_fp8(w / scale.to(torch.float64)[:, None], fmt)
    return q.t().contiguous().to(torch_dtype(fmt)), scale.reshape(-1, 1)


def activation_scale(amax: float, fmt: str) -> float:
    """The static scale ``max|v| / max`` of a value whose largest magnitude is ``amax`` (a float32 value)."""
    return float(torch.tensor(max(float(amax), 1e-30) / FP8_MAX[fmt], dtype=torch.float32))


def _mlps(model: nn.Module) -> list[tuple[int, nn.Module]]:
    from .layers import mlp_layers

    return [(index, mlp) for index, _, mlp in mlp_layers(model)]


@torch.no_grad()
def calibrate(model: nn.Module, batches: Iterable[torch.Tensor] | torch.Tensor, fmt: str = "float8_e4m3"
              ) -> dict[int, dict[str, float]]:
    """Per decoder layer, the static scales of ``x`` and ``h`` (module docstring) over ``batches`` of token ids
    run through ``model`` *before* it is patched (a Hugging Face style model: each layer's ``mlp`` with a
    ``down_proj``). Save them with :func:`save_scales` to reuse them."""
    ranges: dict[int, dict[str, float]] = {}
    handles = []

    def note(layer: int, point: str, value: torch.Tensor) -> None:
        seen = ranges.setdefault(layer, {})
        seen[point] = max(seen.get(point, 0.0), float(value.detach().abs().max()))

    for layer, mlp in _mlps(model):
        handles.append(mlp.register_forward_pre_hook(lambda _m, args, layer=layer: note(layer, "x", args[0])))
        handles.append(mlp.down_proj.register_forward_pre_hook(
            lambda _m, args, layer=layer: note(layer, "h", args[0])))
    try:
        for ids in [batches] if isinstance(batches, torch.Tensor) else batches:
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return {layer: {p: activation_scale(v, fmt) for p, v in points.items()} for layer, points in ranges.items()}


def save_scales(scales: dict[int, dict[str, float]], path: str | Path) -> None:
    Path(path).write_text(json.dumps({str(k): v for k, v in sorted(scales.items())}, indent=2) + "\n",
                          encoding="utf-8")


def load_scales(scales: Any) -> dict[int, dict[str, float]]:
    """Scales given as a dict (layer -> point -> scale) or the path of a JSON file :func:`save_scales` wrote."""
    if isinstance(scales, (str, Path)):
        scales = json.loads(Path(scales).read_text(encoding="utf-8"))
    return {int(layer): {str(p): float(v) for p, v in points.items()} for layer, points in scales.items()}

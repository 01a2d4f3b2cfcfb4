"""An ``nmmc compress`` output's layers grouped by MLP format: layers of equal (ranks, kernel weight format) share one
kernel set. ``nmmc export`` exports one kernel set per group (:mod:`..export.groups`) and ``nmmc tune --model`` tunes
one per group (:mod:`..model_groups`), so both read the manifest the same way.

A layer's ranks are its projections' (``layers[i].projections``; all dense: None, the dense MLP); its format is its
FP8 format (``layers[i].fp8``) or, for any other layer, the activation dtype its kernel computes in (bf16).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..ir.fp8 import is_fp8
from .manifest import Manifest

__all__ = ["LayerGroup", "group_names", "manifest_groups"]

_SHORT = {"bfloat16": "bf16", "float32": "fp32", "float8_e4m3": "fp8", "float8_e5m2": "fp8_e5m2"}


@dataclass(frozen=True)
class LayerGroup:
    """Layers sharing one kernel set: their ranks (None: dense) and weight format (an FP8 format, or the activation
    dtype)."""

    layers: tuple[int, ...]
    ranks: tuple[int, int, int] | None
    weights: str

    @property
    def name(self) -> str:
        """``dense-bf16``, ``svd-fp8-r128-128-128``, ...: the group's directory (an export's ``kernels/<name>``, a
        ``tune --model`` output's ``<name>/``)."""
        base = f"{'dense' if self.ranks is None else 'svd'}-{_SHORT.get(self.weights, self.weights)}"
        return base if self.ranks is None else base + "-r" + "-".join(str(r) for r in self.ranks)

    @property
    def fp8(self) -> bool:
        return is_fp8(self.weights)


def _layer_ranks(path: Path, layer: int, ranks: dict[str, int | None]) -> tuple[int, int, int] | None:
    values = tuple(ranks[p] for p in ("gate", "up", "down"))
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        raise InputError(f"{path}: layer {layer} keeps some projections dense and factors others ({ranks}); the "
                         "kernels take a whole dense or a whole SVD MLP per layer")
    return values  # type: ignore[return-value]


def manifest_groups(manifest: Manifest, path: str | Path, activation: str = "bfloat16") -> list[LayerGroup]:
    """The layer groups of the compress output at ``path`` (for messages), in the order their first layers come:
    layers of equal (ranks, format), a layer's format its ``fp8``, its ``mx`` or else ``activation``."""
    formats = [layer.fp8 or layer.mx or activation for layer in manifest.layers]
    by_key: dict[tuple[Any, str], list[int]] = {}
    for layer, ranks in enumerate(manifest.layer_ranks()):
        by_key.setdefault((_layer_ranks(Path(path), layer, ranks), formats[layer]), []).append(layer)
    return [LayerGroup(tuple(layers), ranks, fmt) for (ranks, fmt), layers in by_key.items()]


def group_names(groups: list[LayerGroup] | tuple[LayerGroup, ...]) -> list[str]:
    """Per layer, the name of its group (an export manifest's ``layers``, a ``tune --model`` index's
    ``layer_groups``)."""
    names: dict[int, str] = {layer: g.name for g in groups for layer in g.layers}
    return [names[layer] for layer in sorted(names)]

"""The output format of ``compress_model``: tensor names, layer files and ``manifest.json``.

An output directory holds one safetensors file per decoder layer and a manifest written last::

    layer_{i:03d}.safetensors    model.layers.{i}.mlp.{gate,up,down}_proj.u   [in, r]
                                 model.layers.{i}.mlp.{gate,up,down}_proj.v   [r, out]
    manifest.json

``x @ u @ v`` approximates ``x @ W`` with ``W = weight.T`` [in, out] (gate/up: in = hidden, out =
intermediate; down: in = intermediate, out = hidden). ``docs/compression.md`` documents the manifest
schema; :meth:`Manifest.to_dict` is its definition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoints.config import PROJECTIONS, ModelConfig
from ..errors import InputError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "FP8_FORMAT_VERSION",
    "LAYER_FILE",
    "MANIFEST_FILE",
    "MX_FORMAT_VERSION",
    "U_NAME",
    "V_NAME",
    "W_NAME",
    "LayerEntry",
    "Manifest",
    "ProjectionEntry",
    "dense_name",
    "factor_names",
    "layer_file",
    "read_manifest",
]

FORMAT = "nmmc-svd-mlp"
FORMAT_VERSION = 2
#: The version of a manifest with FP8 layers (``layers[i].fp8``; docs/compression.md "FP8 layers"): older readers,
#: which would take their FP8 bytes for bf16 weights, refuse it. A manifest without FP8 layers stays version 2.
FP8_FORMAT_VERSION = 3
#: The version of a manifest with MX layers (``layers[i].mx``; docs/compression.md "MX layers"): their files hold
#: float32 factors that are *not* pre-quantized, and a reader that does not know it would take them for the model's
#: kernels in bf16; older readers refuse it.
MX_FORMAT_VERSION = 4
#: Versions :func:`read_manifest` reads (1: before calibration, quality and per-layer ranks; 3: FP8 layers; 4: MX).
READABLE_VERSIONS = (1, 2, 3, 4)
MANIFEST_FILE = "manifest.json"
LAYER_FILE = "layer_{layer:03d}.safetensors"
U_NAME = "model.layers.{layer}.mlp.{proj}_proj.u"
V_NAME = "model.layers.{layer}.mlp.{proj}_proj.v"
#: A projection kept dense (chosen by the joint rank choice): ``W = weight.T`` [in, out] as is.
W_NAME = "model.layers.{layer}.mlp.{proj}_proj.w"
LAYOUT = "x[tokens, in] @ u[in, r] @ v[r, out] ~= x @ W, W = weight.T [in, out] (HF weight is [out, in])"


def layer_file(layer: int) -> str:
    return LAYER_FILE.format(layer=layer)


def dense_name(layer: int, projection: str) -> str:
    """The name of a dense projection's ``W`` [in, out] in its layer file."""
    return W_NAME.format(layer=layer, proj=projection)


def factor_names(layer: int, projection: str) -> tuple[str, str]:
    """The names of the ``u`` and ``v`` tensors of one projection in its layer file."""
    return U_NAME.format(layer=layer, proj=projection), V_NAME.format(layer=layer, proj=projection)


@dataclass(frozen=True)
class ProjectionEntry:
    """One compressed matrix: rank, ``shape`` = [in, out] of W, parameter counts, reconstruction error.

    ``method`` is how it was factored ("lapack"/"gram": plain SVD; "whitened": activation-aware) or
    "dense" (kept as ``W``; rank is then ``min(in, out)``). ``output_error`` is the relative error of the
    projection's output on the calibration activations (whitened runs only).
    """

    rank: int
    shape: tuple[int, int]
    relative_error: float
    method: str
    output_error: float | None = None

    @property
    def dense(self) -> bool:
        return self.method == "dense"

    @property
    def params_before(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def params_after(self) -> int:
        return self.params_before if self.dense else self.rank * (self.shape[0] + self.shape[1])

    def to_dict(self) -> dict[str, Any]:
        out = {
            "rank": self.rank,
            "shape": list(self.shape),
            "params_before": self.params_before,
            "params_after": self.params_after,
            "relative_error": self.relative_error,
            "svd_method": self.method,
        }
        if self.output_error is not None:
            out["output_error"] = self.output_error
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ProjectionEntry:
        shape = tuple(int(d) for d in raw["shape"])
        if len(shape) != 2:
            raise ValueError(f"shape must be [in, out], got {raw['shape']!r}")
        return cls(rank=int(raw["rank"]), shape=shape,  # type: ignore[arg-type]
                   relative_error=float(raw["relative_error"]), method=str(raw["svd_method"]),
                   output_error=None if raw.get("output_error") is None else float(raw["output_error"]))


@dataclass(frozen=True)
class LayerEntry:
    """One layer file. ``fp8``: the FP8 format of the layer's MLP kernel (weights and the activations its matmuls
    read; ``"float8_e4m3"``, ``"float8_e5m2"`` or ``"float8_e4m3fn"``, tensors as :mod:`.fp8_files` says); ``mx``:
    the OCP MX format of its kernel (``"mxfp8_e4m3"``, ``"mxfp8_e5m2"``, ``"mxfp4"``; the file holds the float32
    factors, not pre-quantized: :mod:`.mx_layers`); both None: the layer's kernel runs in the manifest's ``dtype``."""

    layer: int
    file: str
    projections: Mapping[str, ProjectionEntry]
    fp8: str | None = None
    mx: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"layer": self.layer, "file": self.file,
               "projections": {proj: self.projections[proj].to_dict() for proj in PROJECTIONS}}
        if self.fp8 is not None:
            out["fp8"] = self.fp8
        if self.mx is not None:
            out["mx"] = self.mx
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LayerEntry:
        projections = {proj: ProjectionEntry.from_dict(raw["projections"][proj]) for proj in PROJECTIONS}
        fp8, mx = raw.get("fp8"), raw.get("mx")
        return cls(layer=int(raw["layer"]), file=str(raw["file"]), projections=projections,
                   fp8=None if fp8 is None else str(fp8), mx=None if mx is None else str(mx))


@dataclass(frozen=True)
class Manifest:
    """What ``compress_model`` wrote: the model, the settings, every matrix's rank and error, totals.

    ``method``: "svd" (plain truncated SVD) or "whitened" (activation-aware, with ``calibration``
    describing the activations); ``quality``: measured perplexity/agreement (``nmmc compress --eval``);
    ``rank_choice``: the joint accuracy/speed rank choice and its Pareto front, when ranks were chosen so.
    """

    model: ModelConfig
    keep_ratio: float
    align: int
    dtype: str
    layers: tuple[LayerEntry, ...]
    method: str = "svd"
    calibration: Mapping[str, Any] | None = None
    quality: Mapping[str, Any] | None = None
    rank_choice: Mapping[str, Any] | None = None
    heal: Mapping[str, Any] | None = None
    fp8: Mapping[str, Any] | None = None
    mx: Mapping[str, Any] | None = None

    def layer_formats(self) -> list[str]:
        """Per layer, the dtype its MLP kernel computes in: the layer's FP8 or MX format, else the manifest's
        ``dtype``."""
        return [layer.fp8 or layer.mx or self.dtype for layer in self.layers]

    @property
    def act_scale(self) -> str:
        """How the FP8 layers' activations are scaled: "static" (stored per-tensor scales) or "row" (per token, on
        chip; ``compress --act-scale row``)."""
        return str((self.fp8 or {}).get("act_scale", "static"))

    def layer_ranks(self) -> list[dict[str, int | None]]:
        """Per layer, the rank of each projection (None for a dense one)."""
        return [{proj: None if p.dense else p.rank for proj, p in layer.projections.items()} for layer in self.layers]

    @property
    def uniform(self) -> bool:
        """Whether every layer has the same ranks and no projection is dense."""
        ranks = self.layer_ranks()
        return all(r == ranks[0] for r in ranks) and None not in ranks[0].values() if ranks else True

    @property
    def ranks(self) -> dict[str, int]:
        """Rank per projection, the same in every layer (see :attr:`uniform`; else the first layer's)."""
        return {proj: self.layers[0].projections[proj].rank for proj in PROJECTIONS} if self.layers else {}

    @property
    def params_before(self) -> int:
        return sum(p.params_before for layer in self.layers for p in layer.projections.values())

    @property
    def params_after(self) -> int:
        return sum(p.params_after for layer in self.layers for p in layer.projections.values())

    @property
    def kept_fraction(self) -> float:
        """MLP parameters after / before (compare with ``keep_ratio``)."""
        return self.params_after / self.params_before

    @property
    def compression_ratio(self) -> float:
        """MLP parameters before / after (e.g. 1.25 at a kept fraction of 0.8)."""
        return self.params_before / self.params_after

    def errors(self) -> list[float]:
        return [p.relative_error for layer in self.layers for p in layer.projections.values()]

    def to_dict(self) -> dict[str, Any]:
        errors = self.errors()
        return {
            "format": FORMAT,
            "format_version": MX_FORMAT_VERSION if any(layer.mx for layer in self.layers) else
            FP8_FORMAT_VERSION if any(layer.fp8 for layer in self.layers) else FORMAT_VERSION,
            "model": {
                "name": self.model.name,
                "architecture": self.model.architecture,
                "hidden_size": self.model.hidden_size,
                "intermediate_size": self.model.intermediate_size,
                "num_hidden_layers": self.model.num_hidden_layers,
                "torch_dtype": self.model.torch_dtype,
            },
            "keep_ratio": self.keep_ratio,
            "align": self.align,
            "dtype": self.dtype,
            "ranks": self.ranks if self.uniform else "per layer (see layers)",
            "method": self.method,
            "naming": {"file": LAYER_FILE, "u": U_NAME, "v": V_NAME, "w": W_NAME, "layout": LAYOUT,
                       "factors": "u = U_r * sqrt(S_r), v = sqrt(S_r) * V_r^T"},
            "layers": [layer.to_dict() for layer in self.layers],
            "totals": {
                "params_before": self.params_before,
                "params_after": self.params_after,
                "kept_fraction": self.kept_fraction,
                "compression_ratio": self.compression_ratio,
                "mean_relative_error": sum(errors) / len(errors),
                "max_relative_error": max(errors),
            },
            **{key: dict(value) for key, value in (("calibration", self.calibration), ("quality", self.quality),
                                                   ("rank_choice", self.rank_choice), ("heal", self.heal),
                                                   ("fp8", self.fp8), ("mx", self.mx))
               if value is not None},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Manifest:
        if raw.get("format") != FORMAT or raw.get("format_version") not in READABLE_VERSIONS:
            versions = "/".join(map(str, READABLE_VERSIONS))
            raise ValueError(f"not an {FORMAT} v{versions} manifest (format {raw.get('format')!r}, "
                             f"version {raw.get('format_version')!r})")
        model = raw["model"]
        config = ModelConfig(
            architecture=str(model["architecture"]),
            hidden_size=int(model["hidden_size"]),
            intermediate_size=int(model["intermediate_size"]),
            num_hidden_layers=int(model["num_hidden_layers"]),
            torch_dtype=str(model["torch_dtype"]),
            name=str(model["name"]),
        )
        layers = tuple(LayerEntry.from_dict(layer) for layer in raw["layers"])
        if not layers:
            raise ValueError("no layers")
        return cls(model=config, keep_ratio=float(raw["keep_ratio"]), align=int(raw["align"]),
                   dtype=str(raw["dtype"]), layers=layers, method=str(raw.get("method", "svd")),
                   calibration=raw.get("calibration"), quality=raw.get("quality"),
                   rank_choice=raw.get("rank_choice"), heal=raw.get("heal"), fp8=raw.get("fp8"),
                   mx=raw.get("mx"))


def read_manifest(path: str | Path) -> Manifest:
    """Read ``manifest.json`` (``path`` is the file or the output directory holding it).

    A missing file, malformed JSON or a file that is not an nmmc manifest raises InputError.
    """
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_FILE
    if not path.is_file():
        raise InputError(f"manifest not found: {path} (an interrupted compression writes no manifest; rerun it)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: malformed JSON: {exc}") from None
    try:
        if not isinstance(raw, dict):
            raise ValueError("expected a JSON object")
        return Manifest.from_dict(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: malformed nmmc manifest: {exc!r}") from None

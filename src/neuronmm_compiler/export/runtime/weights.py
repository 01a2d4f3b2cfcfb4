"""The kernels' weight arguments of one tensor-parallel rank, read from a Hugging Face checkpoint (dense MLP) or
an ``nmmc compress`` output (SVD factors, dense layers, FP8 layers with their scales), as the ``tensors`` of the
layer's group in the manifest say (``manifest["layers"][i]`` names layer i's group).

MX (transform ``mx_quantize`` / ``mx_scale``): every weight, from a checkpoint (transposed) or a factor file, is
quantized whole when the layer is loaded into the packed elements and E8M0 scales of the kernel's two arguments
(:mod:`.mx`); an MX package is exported at tp 1.

FP8 from a checkpoint (transform ``quantize`` / ``channel_scale``): the weight is quantized per output channel on
the fly (:mod:`.fp8`), one layer at a time, each output channel with all its input channels: a column-parallel rank
(gate, up) reads and quantizes its own channels only, a row-parallel one (down) reads the whole weight for its
scales and keeps its rows; the static activation scales (``from: calibration``) are given by the
caller (:func:`.fp8.calibrate` on the unpatched model).

A Hugging Face ``{gate,up,down}_proj.weight`` is [out, in]; the kernels take ``W = weight.T`` [in, out], so a
rank's column slice of ``W`` is a row slice of the stored weight (and the other way round). Each slice is read
with safetensors' ``safe_open(...).get_slice`` straight from the file, so a rank reads only its own part and the
model is never held twice: one layer's arguments for one rank at a time.

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from .backend import torch_dtype

FACTOR_FILE = "layer_{layer:03d}.safetensors"


def operand_key(spec: dict[str, Any]) -> str:
    """A name for a weight operand (the tensor and the slice of it a kernel argument reads), usable as a module
    attribute: ``w_gate``, ``w_gate__cols_0_384``, ``u_down__rows_384_768``."""
    key = spec["tensor"].replace(".", "_")
    for axis in ("rows", "cols"):
        if axis in spec:
            key += f"__{axis}_{spec[axis][0]}_{spec[axis][1]}"
    return key


def layer_group(manifest: dict[str, Any], layer: int) -> str:
    """The name of the group (kernel set) decoder layer ``layer`` runs."""
    layers = manifest["layers"]
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer {layer}: the package was exported for {len(layers)} layers")
    return layers[layer]


def rank_operands(manifest: dict[str, Any], rank: int, group: str) -> dict[str, dict[str, Any]]:
    """Every weight operand rank ``rank`` binds in any bucket of ``group``, by :func:`operand_key`."""
    entry = manifest["groups"][group]
    out: dict[str, dict[str, Any]] = {}
    for bucket in entry["buckets"]:
        program = bucket["ranks"][rank]
        for step in program["steps"]:
            for spec in step.get("args", {}).values():
                if spec["tensor"] in entry["tensors"]:
                    out.setdefault(operand_key(spec), spec)
    return out


class TensorSource:
    """Named tensors of a checkpoint directory, read lazily with ``safe_open`` (a sharded Hugging Face checkpoint
    through its ``model.safetensors.index.json``, an ``nmmc compress`` output through its layer files)."""

    def __init__(self, directory: str | Path, kind: str) -> None:
        self.directory = Path(directory)
        self.kind = kind
        if not self.directory.is_dir():
            raise FileNotFoundError(f"{self.directory}: not a directory ({self._expects()})")
        self._index: dict[str, str] | None = None
        if kind == "checkpoint":
            index = self.directory / "model.safetensors.index.json"
            if index.is_file():
                self._index = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            elif not (self.directory / "model.safetensors").is_file():
                raise FileNotFoundError(f"{self.directory}: no model.safetensors or model.safetensors.index.json "
                                        f"({self._expects()})")
        elif not (self.directory / "manifest.json").is_file():
            raise FileNotFoundError(f"{self.directory}: no manifest.json ({self._expects()})")

    def _expects(self) -> str:
        return ("this package's kernels take the dense weights of a Hugging Face checkpoint" if self.kind ==
                "checkpoint" else "this package's kernels take SVD factors: give the 'nmmc compress' output "
                "directory compressed at the package's ranks")

    def file_of(self, name: str, layer: int) -> Path:
        if self.kind == "factors":
            return self.directory / FACTOR_FILE.format(layer=layer)
        if self._index is not None:
            if name not in self._index:
                raise KeyError(f"{name} is not in {self.directory}/model.safetensors.index.json")
            return self.directory / self._index[name]
        return self.directory / "model.safetensors"

    def read(self, name: str, layer: int, rows: tuple[int, int] | None, cols: tuple[int, int] | None) -> torch.Tensor:
        """Rows and columns ``[start, stop)`` (None: all) of tensor ``name`` as stored."""
        with safe_open(str(self.file_of(name, layer)), framework="pt") as f:
            if name not in f.keys():  # noqa: SIM118 - safe_open handles have keys(), not __contains__
                raise KeyError(f"{name} is not in {self.file_of(name, layer)}")
            part = f.get_slice(name)
            r = slice(*rows) if rows is not None else slice(None)
            c = slice(*cols) if cols is not None else slice(None)
            return part[r, c]

    def shape(self, name: str, layer: int) -> list[int]:
        with safe_open(str(self.file_of(name, layer)), framework="pt") as f:
            return list(f.get_slice(name).get_shape())


def layer_arguments(manifest: dict[str, Any], source: TensorSource | str | Path, layer: int, rank: int = 0,
                    activation_scales: dict[int, dict[str, float]] | None = None) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s weight arguments of decoder layer ``layer``, by :func:`operand_key`, each in its dtype and
    layout (contiguous, row-major); ``activation_scales`` (layer -> point -> scale, :func:`.fp8.calibrate`): the
    static scales of an FP8 group whose weights come from a checkpoint."""
    if not isinstance(source, TensorSource):
        source = TensorSource(source, manifest["weights"]["from"])
    group = manifest["groups"][layer_group(manifest, layer)]
    fmt = group["weights_dtype"]
    quantized: dict[tuple[str, tuple[int, int] | None], tuple[torch.Tensor, torch.Tensor]] = {}
    out = {}
    for key, spec in rank_operands(manifest, rank, layer_group(manifest, layer)).items():
        info = group["tensors"][spec["tensor"]]
        rows = tuple(spec["rows"]) if "rows" in spec else None
        cols = tuple(spec["cols"]) if "cols" in spec else None
        if info["from"] == "calibration":
            scales = (activation_scales or {}).get(layer, {})
            if info["name"] not in scales:
                raise ValueError(f"layer {layer}: the FP8 kernels need the static scale of {info['name']!r}: pass "
                                 "activation_scales= (fp8.calibrate on the unpatched model, or a saved JSON file) or "
                                 "calibration= token ids to patch()")
            out[key] = torch.tensor([[scales[info["name"]]]], dtype=torch.float32)
            continue
        name = info["name"].format(layer=layer)
        stored = source.shape(name, layer)
        if info["transform"] in ("mx_quantize", "mx_scale"):
            out[key] = _mx_argument(source, name, layer, info, stored, spec, quantized)
            continue
        transposed = info["transform"] in ("transpose", "quantize", "channel_scale")
        expected = {"transpose": info["shape"][::-1], "quantize": info["shape"][::-1],
                    "channel_scale": [info["shape"][0], stored[1]]}.get(info["transform"], info["shape"])
        if stored != list(expected):
            raise ValueError(f"{name} in {source.directory} is {stored}, the package's kernels need {list(expected)} "
                             f"({'the transpose of ' if transposed else ''}"
                             f"{spec['tensor']} {info['shape']}): export from this model (and these ranks)")
        if info["transform"] in ("quantize", "channel_scale"):
            from .fp8 import quantize_weight

            # a channel's scale needs all its input channels: read the output channels the operand covers (stored
            # rows; a column-parallel rank's own, else all) with every input channel, then slice the input channels
            channels = cols if info["transform"] == "quantize" else rows
            if (name, channels) not in quantized:
                quantized[name, channels] = quantize_weight(source.read(name, layer, channels, None), fmt)
            q, scale = quantized[name, channels]
            value = q[slice(*rows) if rows else slice(None)] if info["transform"] == "quantize" else scale
        elif info["transform"] == "transpose":
            value = source.read(name, layer, cols, rows).t()
        else:
            value = source.read(name, layer, rows, cols)
        out[key] = value.to(torch_dtype(info["dtype"])).contiguous()
    return out


def _mx_argument(source: TensorSource, name: str, layer: int, info: dict[str, Any], stored: list[int],
                 spec: dict[str, Any], quantized: dict[Any, Any]) -> torch.Tensor:
    """One argument of an MX weight (:mod:`.mx`): its packed words (``mx_quantize``) or its scales (``mx_scale``), the
    weight ``W`` [K, N] read whole (a checkpoint's ``weight`` [N, K] transposed, a factor as stored) and quantized
    once for both."""
    from .mx import quantize_weight

    if "rows" in spec or "cols" in spec:
        raise ValueError(f"{name}: MX weights are exported unsharded (tp 1); this operand names a slice")
    k, n = info["mx"]["logical_shape"]
    expected = [n, k] if info["from"] == "checkpoint" else [k, n]
    if stored != expected:
        raise ValueError(f"{name} in {source.directory} is {stored}, the package's kernels need {expected} "
                         f"({'the transpose of ' if info['from'] == 'checkpoint' else ''}the real [K, N] = [{k}, {n}] "
                         f"of {spec['tensor']}): export from this model (and these ranks)")
    if (name, "mx") not in quantized:
        w = source.read(name, layer, None, None)
        quantized[name, "mx"] = quantize_weight(w.t() if info["from"] == "checkpoint" else w, info["mx"]["element"])
    words, scales = quantized[name, "mx"]
    return words if info["transform"] == "mx_quantize" else scales


def rank_state_dict(manifest: dict[str, Any], source: str | Path, rank: int = 0,
                    prefix: str = "model.layers.{layer}.mlp.",
                    activation_scales: dict[int, dict[str, float]] | None = None
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every layer's arguments of rank ``rank`` as (state-dict name, tensor), one layer read at a time: what a
    per-rank checkpoint of the patched model holds for the replaced MLPs (``prefix`` + :func:`operand_key`)."""
    reader = TensorSource(source, manifest["weights"]["from"])
    for layer in range(manifest["model"]["num_hidden_layers"]):
        for key, value in layer_arguments(manifest, reader, layer, rank, activation_scales).items():
            yield prefix.format(layer=layer) + key, value

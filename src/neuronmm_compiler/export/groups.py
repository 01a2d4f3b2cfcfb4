"""Which kernels an export needs: the model's layers grouped by MLP format (dense or SVD ranks, bf16/fp32 or FP8
weights), one kernel set per group, and where each group's kernel arguments come from (docs/integration.md,
"FP8 and per-layer formats").

The source decides the groups:

- a model directory, config.json or shipped name: one group of every layer, dense (``--dense`` or no
  ``--keep-ratio``) or SVD at the keep ratio's block-aligned ranks, in ``--dtype``;
- an ``nmmc compress`` output: its layers as the manifest records them (``layers[i]``: ranks, ``fp8``, ``mx``),
  layers of equal (ranks, format) in one group. Its formats dictate the export's: an FP8 layer (``--dtype fp8`` at
  compress time, or chosen by ``--choose-ranks --dtype fp8``) gets an FP8 kernel (per-token activation scales when
  the manifest's ``fp8.act_scale`` is ``row``), an MX layer (``--dtype mxfp8|mxfp4``: float32 factors) an MX kernel
  (trn3), any other layer a kernel in the activation dtype (bf16). A ``--dtype`` that contradicts them is refused
  rather than silently followed, and so is ``--dtype fp8`` of bf16 factors (their static activation scales are
  calibrated by ``nmmc compress --dtype fp8``).

Argument sources (``tensors`` of a group in the manifest): a dense group from a Hugging Face checkpoint reads
``model.layers.{i}.mlp.{p}_proj.weight`` transposed (FP8: quantized on the fly with per-output-channel scales from
the weight, :mod:`.runtime.fp8`; the static activation scales ``x_scale``/``h_scale`` from a calibration the
runtime runs on the unpatched model; per-token scales: none, the kernel computes them); every group of a compress
output reads the layer files (``u``/``v``/``w`` as stored, FP8 layers' scales beside them,
:mod:`..compression.fp8_files`). An MX group's arguments come in pairs, packed elements and E8M0 scales, both made
from one float weight (the checkpoint's, transposed, or a factor) when the runtime loads a layer
(:func:`mx_tensor_source`, :mod:`.runtime.mx`).
"""

from __future__ import annotations

from typing import Any

from ..checkpoints.weights import check_mlp_checkpoint
from ..compression import read_manifest
from ..compression.fp8_files import activation_scale_name, weight_scale_name
from ..compression.layer_groups import LayerGroup, manifest_groups
from ..compression.manifest import MANIFEST_FILE, U_NAME, V_NAME, W_NAME
from ..errors import InputError
from ..ir.fp8 import is_fp8
from ..model_tuning.pipeline import ModelSource, model_path, resolve_model

__all__ = ["ExportGroup", "export_groups", "mx_tensor_source", "tensor_source"]

#: A Hugging Face checkpoint's MLP weight ([out, in]; the kernels take its transpose [in, out]).
HF_WEIGHT = "model.layers.{layer}.mlp.{proj}_proj.weight"
#: Layers sharing one kernel set (the grouping ``tune --model`` uses too, :mod:`..compression.layer_groups`); its name
#: is the group's kernel directory under ``kernels/``.
ExportGroup = LayerGroup


def export_groups(model: str, keep_ratio: float | None, dense: bool, dtype: str | None, activation: str
                  ) -> tuple[ModelSource, str | None, list[ExportGroup]]:
    """(the model's shapes and ranks, the compress output the weights come from or None, the layer groups) of an
    export (see the module docstring). ``dtype``: the weight format asked for (None: the source's, else bf16);
    ``activation``: the activations' dtype."""
    path = model_path(model)
    compressed = path.is_dir() and (path / MANIFEST_FILE).is_file()
    if compressed and not dense:
        manifest = read_manifest(path / MANIFEST_FILE)
        if keep_ratio is not None and abs(keep_ratio - manifest.keep_ratio) > 1e-12:
            raise InputError(f"{path} was compressed at keep ratio {manifest.keep_ratio}; drop --keep-ratio or pass "
                             f"{manifest.keep_ratio}")
        formats = [layer.fp8 or layer.mx or activation for layer in manifest.layers]
        recorded = sorted(set(formats))
        if dtype is not None and recorded != [dtype]:
            if is_fp8(dtype) and not any(is_fp8(f) for f in formats):
                raise InputError(f"{path} holds bf16/fp32 factors: FP8 kernels need the static activation scales "
                                 "'nmmc compress --dtype fp8' calibrates; compress with --dtype fp8 (or "
                                 "--choose-ranks --dtype fp8), or export it without --dtype")
            raise InputError(f"{path} records its layers' kernel formats ({', '.join(recorded)}, manifest "
                             f"layers[i].fp8 / .mx), which the export follows: drop --dtype {dtype}")
        groups = manifest_groups(manifest, path, activation)
        uniform = len({g.ranks for g in groups}) == 1
        r = groups[0].ranks
        source = ModelSource(manifest.model, r if uniform else None, manifest.keep_ratio, "manifest",
                             dict(manifest.quality) if manifest.quality else None)
        return source, str(path.resolve()), groups
    source = resolve_model(path, keep_ratio, dense=dense or keep_ratio is None)
    if path.is_dir():  # a checkpoint beside the config: its MLP tensors checked now, not first at patch time
        check_mlp_checkpoint(path, source.config)
    # an SVD group's factors (FP8: with their scales) come from an 'nmmc compress' output at these ranks
    weights = dtype or activation
    layers = tuple(range(source.config.num_hidden_layers))
    return source, None, [ExportGroup(layers, source.ranks, weights)]


def mx_tensor_source(name: str, shape: list[int], group: ExportGroup, from_checkpoint: bool) -> dict[str, Any]:
    """Where kernel argument ``name`` of an MX ``group`` comes from and how it is stored (``shape``: the kernel
    argument's): a weight's packed elements (``<kind>_<proj>``, ``[K/4, N]``, layout ``mx_packed``, transform
    ``mx_quantize``) or its E8M0 scales (``<kind>_<proj>_scale``, ``[16, K/512, N]`` uint8, layout ``mx_scales``,
    transform ``mx_scale``), both from the float weight ``W`` [K, N] (a checkpoint's transposed weight or a factor),
    quantized when the package loads it (runtime mx.py; nmmc's ir/mx.py)."""
    from ..ir.mx import MX_BLOCK, MX_FORMATS, MX_PACK, MX_TILE

    fmt = MX_FORMATS[group.weights]
    scale = name.endswith("_scale")
    stem = name.removesuffix("_scale")
    kind, _, proj = stem.partition("_")
    template = {"w": W_NAME, "u": U_NAME, "v": V_NAME}.get(kind)
    if template is None or proj not in ("gate", "up", "down"):
        raise InputError(f"the export has no weight source for MX kernel argument {name!r}")
    logical = [shape[1] * MX_TILE, shape[2]] if scale else [shape[0] * MX_PACK, shape[1]]
    where = ({"from": "checkpoint", "name": HF_WEIGHT.format(layer="{layer}", proj=proj)}
             if from_checkpoint and kind == "w" else
             {"from": "factors", "name": template.format(layer="{layer}", proj=proj)})
    mx = {"format": fmt.name, "element": fmt.weights, "block": MX_BLOCK, "logical_shape": logical,
          **({"of": stem} if scale else {"scale": f"{stem}_scale"})}
    return {"layout": "mx_scales" if scale else "mx_packed", **where,
            "transform": "mx_scale" if scale else "mx_quantize", "mx": mx}


def tensor_source(name: str, group: ExportGroup, from_checkpoint: bool) -> dict[str, Any]:
    """Where kernel argument ``name`` of ``group`` comes from: ``from`` (checkpoint, factors or calibration),
    ``name`` (the tensor's name in the source, ``{layer}`` the decoder layer; for calibration the quantized value),
    ``transform`` (none; transpose; quantize: transposed and quantized per output channel; channel_scale: that
    quantization's scales)."""
    if name.endswith("_scale"):
        stem = name.removesuffix("_scale")
        kind, _, proj = stem.partition("_")
        if proj in ("gate", "up", "down") and kind in ("w", "u", "v"):
            if from_checkpoint:
                return {"from": "checkpoint", "name": HF_WEIGHT.format(layer="{layer}", proj=proj),
                        "transform": "channel_scale"}
            return {"from": "factors", "name": weight_scale_name("{layer}", proj, kind),  # type: ignore[arg-type]
                    "transform": "none"}
        return ({"from": "calibration", "name": stem, "transform": "none"} if from_checkpoint else
                {"from": "factors", "name": activation_scale_name("{layer}", stem),  # type: ignore[arg-type]
                 "transform": "none"})
    kind, _, proj = name.partition("_")
    if kind == "w" and from_checkpoint:
        return {"from": "checkpoint", "name": HF_WEIGHT.format(layer="{layer}", proj=proj),
                "transform": "quantize" if group.fp8 else "transpose"}
    template = {"w": W_NAME, "u": U_NAME, "v": V_NAME}.get(kind)
    if template is None or proj not in ("gate", "up", "down"):
        raise InputError(f"the export has no weight source for kernel argument {name!r}")
    return {"from": "factors", "name": template.format(layer="{layer}", proj=proj), "transform": "none"}

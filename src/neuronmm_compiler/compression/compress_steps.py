"""The steps of ``nmmc compress`` after calibration (:mod:`.workflow` strings them together): healing
(:mod:`.heal_steps`), writing the compressed model, measurement on several eval files, and the factor shards of
``--tp`` with the same whitening and healing."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoints.config import read_config
from ..errors import InputError
from ..io import write_text_atomic
from .calibration import Calibration
from .compress import plan_ranks
from .heal_steps import (
    CHECKPOINTS,
    StageProgress,
    heal,
    shard_args,
    whitened_factors,
)
from .manifest import MANIFEST_FILE, Manifest, dense_name, factor_names, layer_file, read_manifest

__all__ = ["build_model", "compressed_mlp", "load_factors"]


def _plans(request, layer_ranks) -> list[dict[str, int | None]]:
    config = read_config(request.model_dir)
    if layer_ranks is not None:
        return [dict(r) for r in layer_ranks]
    return [dict(plan_ranks(config, request.keep_ratio, request.align, request.ranks))] * config.num_hidden_layers


def build_model(request, model, calibration: Calibration | None, ids: np.ndarray | None, layer_ranks, fmt: str | None,
                formats: list[str] | None, progress: StageProgress | None, shard_out: dict | None,
                fresh: bool = False, mx: str | None = None) -> Manifest:
    """Heal (``request.heal``), calibrate the FP8 layers (``fmt``; ``formats``: per layer, None: all FP8; static or
    per-token scales as ``request.act_scale`` says) and write the compressed model (:func:`.compress.compress_model`);
    MX layers (the factors written as computed, :mod:`.mx_layers`): with ``formats`` those whose format is an MX one,
    else every layer in ``mx``; ``fresh``: remove the layer files and fine-tuning checkpoint of an earlier build into
    the same directory first (they would be resumed)."""
    from ..ir.mx import MX_FORMATS
    from .compress import compress_model
    from .manifest import LAYER_FILE

    out = Path(request.out_dir)
    if fresh:
        for path in [*out.glob(LAYER_FILE.replace("{layer:03d}", "*")), *(out / c for c in CHECKPOINTS)]:
            path.unlink(missing_ok=True)
    if shard_out is not None:
        shard_out.clear()
    healed = heal_record = None
    later: list[Callable[[], None]] = []  # --tp --heal finetune: the blocks' fine-tuning, once the factors are written
    if request.heal != "none":
        healed, heal_record = heal(request, model, calibration, ids, _plans(request, layer_ranks), progress,
                                    shard_out=shard_out, later=later)
    fp8, fp8_record = (None, None) if fmt is None else _fp8_layers(
        request, model, calibration, ids, layer_ranks, healed, fmt, progress,
        None if formats is None else [i for i, f in enumerate(formats) if f == fmt])
    chosen_mx = {i: f for i, f in enumerate(formats) if f in MX_FORMATS} if formats is not None else \
        {} if mx is None else dict.fromkeys(range(read_config(request.model_dir).num_hidden_layers), mx)
    mx_layers, mx_record = (None, None) if not chosen_mx else _mx_layers(request, layer_ranks, chosen_mx)
    manifest = compress_model(
        request.model_dir, request.out_dir, request.keep_ratio, align=request.align, ranks=request.ranks,
        dtype=request.dtype, threads=request.threads, calibration=calibration, damping=request.damping,
        layer_ranks=layer_ranks, factors=healed, heal=heal_record, fp8=fp8, fp8_record=fp8_record, mx=mx_layers,
        mx_record=mx_record, progress=None if progress is None else lambda d, t: progress("factoring", d, t))
    # written: the blocks' fine-tuning need not hold it too (benchmarks/results/compression-runs.md, "Ninth run")
    del healed
    for job in later:
        job()
    if later:  # the record gained the blocks' fine-tuning run
        manifest = replace(manifest, heal=heal_record)
        write_text_atomic(out / MANIFEST_FILE, manifest.to_json())
    return manifest


def _measure(model, eval_sets, mlp, request, progress: StageProgress | None, originals: dict | None = None):
    """Per eval file quality, and the overall (token-weighted) quality dict for the manifest. ``originals``: a dict
    the original model's predictions per eval file are kept in, for measuring several compressions of one model."""
    from .quality import WORST_KEY, evaluate, original_predictions

    per_file = []
    for path, ids in eval_sets:
        original = None
        if originals is not None:
            if path not in originals:
                originals[path] = original_predictions(model, ids, length=request.sequence_length)
            original = originals[path]
        q = evaluate(model, ids, mlp, length=request.sequence_length, original=original,
                     progress=None if progress is None else lambda d, t, n=Path(path).name: progress(
                         f"evaluating {n}", d, t))
        per_file.append({**q.to_dict(), "source": Path(path).name})
    tokens = sum(q["tokens"] for q in per_file)
    nll_o = sum(math.log(q["perplexity_original"]) * q["tokens"] for q in per_file) / tokens
    nll_c = sum(math.log(q["perplexity_compressed"]) * q["tokens"] for q in per_file) / tokens
    agree = sum(q["top1_agreement"] * q["tokens"] for q in per_file) / tokens
    layers = len(per_file[0]["mlp_output_error"])
    errors = [math.sqrt(sum(q["tokens"] * q["mlp_output_error"][i] ** 2 for q in per_file) / tokens)
              for i in range(layers)]
    overall = {"tokens": tokens, "perplexity_original": math.exp(nll_o), "perplexity_compressed": math.exp(nll_c),
               "perplexity_increase": math.exp(nll_c - nll_o) - 1.0, "top1_agreement": agree,
               "mlp_output_error": errors, "source": ", ".join(q["source"] for q in per_file),
               "perplexity_increase_by_sequence": [x for q in per_file for x in q["perplexity_increase_by_sequence"]]}
    if len(per_file) > 1:
        overall["per_file"] = per_file
    else:  # one file: its tokens are all of them (several files' shares do not combine)
        overall[WORST_KEY] = per_file[0][WORST_KEY]
    return overall


def _write_shards(request, model_loader, calibration: Calibration | None, layer_ranks,
                  blocks: dict | None, eval_sets, progress: StageProgress | None) -> dict | None:
    """Write OUT/tp<N>/ (whitened or healed blocks when calibrated) and measure the sharded model on the
    eval files; the measurement (None without --eval)."""
    from ..tensor_parallel.shard_factors import write_shards
    from .heal_shards import sharded_mlp, whitened_shards

    method = "plain SVD per block"
    if calibration is not None:
        model = model_loader()
        if request.heal != "none":
            method = "whitened SVD per block, closed-form healed" + (
                " and fine-tuned" if request.heal == "finetune" else "") + " like the unsharded factors"
        else:
            blocks = whitened_shards(model, calibration.grams, _plans(request, layer_ranks),
                                     **shard_args(request, model), damping=request.damping)
            method = "whitened SVD per block (the calibration's activations)"
    directory = write_shards(request.model_dir, request.out_dir, request.tp, blocks=blocks, method=method)
    if not eval_sets:
        return None
    model = model_loader()
    written = _read_shard_blocks(directory, model.arch.num_hidden_layers, request.tp)
    mlp = sharded_mlp(model, written, shard_args(request, model)["shards"])
    mx = {e.layer: e.mx for e in read_manifest(request.out_dir).layers if e.mx}
    if mx:  # as each rank's MX kernel computes its blocks (.mx_layers)
        from .mx_layers import mx_sharded_mlp

        mlp = mx_sharded_mlp(model, written, shard_args(request, model)["shards"], mx, mlp)
        method += "; MX layers as each rank's MX kernel computes its blocks, partial outputs summed in bf16"
    kept = json.loads((directory / "shards.json").read_text())["factor_shard"]["kept_fraction"]
    return {"tp": request.tp, "method": method, "kept_fraction": kept,
            **_measure(model, eval_sets, mlp, request, progress)}


def _read_shard_blocks(directory: Path, layers: int, tp: int) -> dict[int, dict[str, Any]]:
    """The factor-shard blocks as written (None for a projection whose blocks are not factored)."""
    from safetensors import safe_open

    out: dict[int, dict[str, Any]] = {}
    for layer in range(layers):
        out[layer] = {}
        stem = layer_file(layer).removesuffix(".safetensors")
        files = [directory / f"{stem}.rank{rank}.safetensors" for rank in range(tp)]
        if not all(f.is_file() for f in files):
            continue
        handles = [safe_open(str(f), framework="np") for f in files]
        for proj in ("gate", "up", "down"):
            u_name, v_name = factor_names(layer, proj)
            if u_name in handles[0].keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                out[layer][proj] = [(h.get_tensor(u_name).astype(np.float32), h.get_tensor(v_name).astype(np.float32))
                                    for h in handles]
    return out


def _fp8_layers(request, model, calibration: Calibration, ids: np.ndarray | None, layer_ranks, healed,
                fmt: str, progress: StageProgress | None, layers: list[int] | None = None) -> tuple[dict, dict]:
    """``compress_model``'s ``fp8`` (per FP8 layer: the format and the activation ranges over the calibration tokens
    in the unquantized compressed model) and the manifest's ``fp8`` record; ``layers``: the FP8 layers (None: all)."""
    from .formats import activation_ranges

    chosen = range(model.arch.num_hidden_layers) if layers is None else layers
    if request.act_scale == "row":  # per-token scales, on chip: nothing to calibrate
        record = {"format": fmt, "act_scale": "row", "weight_scales": "per output channel: max|W| / max over each "
                  "column of W [in, out] (and of u, v); float32 [N, 1]", "activation_scales": "per token (row), "
                  "computed on chip: max(max|v[t, :]| / max, 1e-6) for x, h and the SVD rank-r values; not stored",
                  "layers": [int(i) for i in chosen], "tensors": "docs/compression.md, FP8 layers"}
        return {layer: (fmt, {}, "row") for layer in chosen}, record
    if ids is None:
        raise InputError("--dtype fp8 calibrates static activation scales by running the model over calibration "
                         "tokens: give --calibration as text or .npy token ids (not pre-captured activations)")
    factors = healed if healed is not None else whitened_factors(model, calibration, _plans(request, layer_ranks),
                                                                 request.damping)
    ranges = activation_ranges(model, ids, factors, length=request.sequence_length,
                               progress=None if progress is None else lambda d, t: progress("FP8 activation ranges",
                                                                                           d, t))
    record = {"format": fmt, "weight_scales": "per output channel: max|W| / max over each column of W [in, out] "
              "(and of u, v); float32 [N, 1]",
              "activation_scales": "static per tensor: max|v| / max over the calibration tokens in the unquantized "
              "compressed model, for x, h and the SVD rank-r values; float32 [1, 1]",
              "calibration_tokens": int(ids.size), "layers": [int(i) for i in chosen],
              "tensors": "docs/compression.md, FP8 layers (compression/fp8_files.py)"}
    return {layer: (fmt, ranges[layer]) for layer in chosen}, record


def _mx_layers(request, layer_ranks, chosen: dict[int, str]) -> tuple[dict[int, str], dict]:
    """``compress_model``'s ``mx`` (``chosen``: per MX layer its format) and the manifest's ``mx`` record."""
    from ..checkpoints.config import PROJECTIONS, projection_shape
    from .mx_layers import mx_record, padded_contractions

    config = read_config(request.model_dir)
    shapes = {proj: projection_shape(config, proj) for proj in PROJECTIONS}
    padded: dict[str, list[int]] = {}
    plans = _plans(request, layer_ranks)
    for layer in chosen:
        padded.update(padded_contractions(shapes, plans[layer]))
    return chosen, mx_record(chosen, padded)


def load_factors(out_dir: str | Path, manifest: Manifest) -> dict[int, dict[str, Any]]:
    """Every layer's factors ``(u, v)`` (or dense ``W``) from a compression output directory (float32; an FP8
    layer's dequantized, ``q * scale^T``; an MX layer's as stored, unquantized)."""
    return _load(out_dir, manifest)[0]


def compressed_mlp(out_dir: str | Path, manifest: Manifest) -> Callable[[int, np.ndarray], np.ndarray]:
    """``mlp(layer, x)`` of the compressed model in ``out_dir``: float32 products of the stored factors, or, when some
    layer is FP8 or MX, every layer as its kernel computes it (:func:`.formats.emulated_mlp`: FP8 layers in FP8, MX
    layers in MX (:mod:`.mx_layers`), the others in bf16)."""
    from .formats import emulated_mlp
    from .mx_layers import mx_layer
    from .quality import factored_mlp

    factors, fp8 = _load(out_dir, manifest)
    mx = {e.layer: mx_layer(factors[e.layer], e.mx) for e in manifest.layers if e.mx is not None}
    return emulated_mlp(factors, fp8=fp8, mx=mx) if fp8 or mx else factored_mlp(factors)


def _load(out_dir: str | Path, manifest: Manifest) -> tuple[dict[int, dict[str, Any]], dict]:
    from safetensors import safe_open

    from .fp8_files import read_fp8_layer

    factors: dict[int, dict[str, Any]] = {}
    fp8 = {}
    for entry in manifest.layers:
        path = Path(out_dir) / layer_file(entry.layer)
        if entry.fp8 is not None:
            ranks = {proj: None if p.dense else p.rank for proj, p in entry.projections.items()}
            fp8[entry.layer], factors[entry.layer] = read_fp8_layer(path, entry.layer, ranks, entry.fp8,
                                                                    manifest.act_scale)
            continue
        with safe_open(str(path), framework="np") as handle:
            factors[entry.layer] = {}
            for proj, p in entry.projections.items():
                if p.dense:
                    factors[entry.layer][proj] = handle.get_tensor(dense_name(entry.layer, proj)).astype(np.float32)
                else:
                    u, v = factor_names(entry.layer, proj)
                    factors[entry.layer][proj] = (handle.get_tensor(u).astype(np.float32),
                                                  handle.get_tensor(v).astype(np.float32))
    return factors, fp8

"""Block-aligned SVD compression of a model's MLP weights (NeuronMM section 1), resumable.

:func:`compress_model` reads every gate/up/down weight of a Hugging Face model directory one tensor at
a time, factors ``W = weight.T`` [in, out] into ``u`` [in, r] and ``v`` [r, out] (:mod:`.svd`), and
writes one safetensors file per layer plus ``manifest.json`` (:mod:`.manifest`). Memory is bounded by one
layer: the three factor pairs of the layer being built and one weight with its float64 work arrays.

Crash safety and resuming: every file is written to a temporary name and renamed (``os.replace``),
so a file under its final name is complete. The manifest of a previous run is removed first and
written last, so its presence means the directory is complete. A layer file that opens, holds
exactly the expected tensors with the expected shapes and dtype, and records the same settings in
its metadata (model, keep ratio, alignment, ranks, dtype, SVD parameters) is kept and not recomputed;
its ranks and errors come from that metadata. The SVD is deterministic and safetensors writes its
header in a fixed order, so a resumed run produces byte-identical files to an uninterrupted one (with
the same NumPy/BLAS build and BLAS thread count). One run per output directory at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from threadpoolctl import threadpool_limits

from ..checkpoints.config import PROJECTIONS, ModelConfig, mlp_weight_names, projection_shape, read_config
from ..checkpoints.weights import WeightReader, valid_tensor_file, write_tensor_file
from ..errors import InputError, UnknownNameError
from ..frontends.shapes import block_aligned_rank
from ..io import stale_temp_files, write_text_atomic
from . import svd
from .calibration import Calibration
from .fp8_files import entry_act_scale, expected_fp8_tensors, fp8_tensors
from .manifest import (
    FORMAT,
    FORMAT_VERSION,
    LAYER_FILE,
    MANIFEST_FILE,
    LayerEntry,
    Manifest,
    ProjectionEntry,
    dense_name,
    factor_names,
    layer_file,
)
from .whitening import DEFAULT_DAMPING, whitened_svd

__all__ = ["OUTPUT_DTYPES", "compress_model", "plan_ranks", "resolve_dtype"]

#: Output dtypes of the factors: name -> (NumPy dtype, safetensors dtype code).
OUTPUT_DTYPES: dict[str, tuple[type, str]] = {
    "float32": (np.float32, "F32"),
    "bfloat16": (ml_dtypes.bfloat16, "BF16"),
    "float16": (np.float16, "F16"),
}
_DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16",
                  "half": "float16"}

Progress = Callable[[int, int], None]
#: Matrices of at most this many elements are factored with one BLAS thread.
SMALL_MATRIX = 1 << 20


def resolve_dtype(dtype: str, config: ModelConfig) -> str:
    """The canonical output dtype name; "model" means the model's own ``torch_dtype``."""
    name = config.torch_dtype if dtype == "model" else dtype
    name = _DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if name not in OUTPUT_DTYPES:
        what = f"the model's torch_dtype {config.torch_dtype!r}" if dtype == "model" else repr(dtype)
        raise UnknownNameError(f"unsupported factor dtype {what}; accepted: {', '.join(OUTPUT_DTYPES)}, model")
    return name


def plan_ranks(config: ModelConfig, keep_ratio: float, align: int = 128,
               ranks: Mapping[str, int] | None = None) -> dict[str, int]:
    """Rank per projection: ``block_aligned_rank(in, out, keep_ratio, align)`` unless ``ranks`` overrides it.

    ``ranks`` maps "gate"/"up"/"down" to a rank in [1, min(in, out)]; an override need not be a
    multiple of ``align``. keep_ratio and align are validated even when every rank is overridden.
    """
    overrides = dict(ranks or {})
    unknown = sorted(set(overrides) - set(PROJECTIONS))
    if unknown:
        raise UnknownNameError(f"unknown projection(s) in ranks: {', '.join(map(repr, unknown))}; "
                               f"accepted: {', '.join(PROJECTIONS)}")
    plan = {}
    for proj in PROJECTIONS:
        k, n = projection_shape(config, proj)
        rank = block_aligned_rank(k, n, keep_ratio, align)
        if proj in overrides:
            rank = overrides[proj]
            if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(k, n):
                raise InputError(f"rank for {proj} must be an integer in [1, {min(k, n)}] (W is {k}x{n}); got {rank!r}")
        plan[proj] = rank
    return plan


def _check_layer_ranks(config: ModelConfig, layer_ranks: Sequence[Mapping[str, int | None]]
                       ) -> list[Mapping[str, int | None]]:
    if len(layer_ranks) != config.num_hidden_layers:
        raise InputError(f"layer_ranks has {len(layer_ranks)} entries; the model has {config.num_hidden_layers} layers")
    for layer, ranks in enumerate(layer_ranks):
        for proj in PROJECTIONS:
            k, n = projection_shape(config, proj)
            rank = ranks.get(proj, -1)
            if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(k, n)):
                raise InputError(f"layer {layer}: rank for {proj} must be None (dense) or an integer in "
                                 f"[1, {min(k, n)}]; got {rank!r}")
    return [dict(r) for r in layer_ranks]


def _settings(config: ModelConfig, keep_ratio: float, align: int, dtype: str, ranks: Mapping[str, int | None],
              whitening: dict | None, heal: dict | None = None, fp8: tuple | None = None, mx: str | None = None
              ) -> dict:
    """What a layer file must record to be reused by a run (as it reads back from JSON)."""
    extra = {} if heal is None else {"heal": heal}  # absent when not healed: older layer files stay reusable
    if fp8 is not None:  # the format and the activation ranges the scales come from (act_scale only when not static)
        row = {} if entry_act_scale(fp8) == "static" else {"act_scale": entry_act_scale(fp8)}
        extra["fp8"] = {"format": fp8[0], "activation_ranges": dict(sorted(fp8[1].items())), **row}
    extra.update({} if mx is None else {"mx": mx})  # the MX format the factors are quantized into when read
    return json.loads(json.dumps({
        "method": "whitened" if whitening else "svd",
        "whitening": whitening,
        "model": {"name": config.name, "architecture": config.architecture, "hidden_size": config.hidden_size,
                  "intermediate_size": config.intermediate_size},
        "keep_ratio": float(keep_ratio),
        "align": align,
        "dtype": dtype,
        "ranks": ranks,
        "svd": {"lapack_max_dim": svd.LAPACK_MAX_DIM, "gram_cutoff": svd.GRAM_CUTOFF},
        **extra,
    }))


def _expected_tensors(config: ModelConfig, layer: int, ranks: Mapping[str, int | None], code: str):
    expected = {}
    for proj in PROJECTIONS:
        k, n = projection_shape(config, proj)
        if ranks[proj] is None:
            expected[dense_name(layer, proj)] = ((k, n), code)
        else:
            u_name, v_name = factor_names(layer, proj)
            expected.update({u_name: ((k, ranks[proj]), code), v_name: ((ranks[proj], n), code)})
    return expected


def _layer_metadata(layer: int, settings: dict, projections: Mapping[str, ProjectionEntry]) -> dict[str, str]:
    """The safetensors metadata of a layer file: one key, ``"nmmc"``, holding canonical JSON.

    One key because safetensors does not write several metadata keys in a fixed order, and the
    files must be byte-identical from run to run.
    """
    record = {"format": FORMAT, "format_version": FORMAT_VERSION, "layer": layer, "settings": settings,
              "projections": {proj: projections[proj].to_dict() for proj in PROJECTIONS}}
    return {"nmmc": json.dumps(record, sort_keys=True)}


def _entry_from_metadata(metadata: Mapping[str, str], layer: int, settings: dict, file: str) -> LayerEntry | None:
    """The layer's entry if ``metadata`` was written for this layer with the same settings, else None."""
    try:
        record = json.loads(metadata["nmmc"])
        if (record["format"], record["format_version"], record["layer"], record["settings"]) != (
                FORMAT, FORMAT_VERSION, layer, settings):
            return None
        raw = record["projections"]
        return LayerEntry(layer, file, {proj: ProjectionEntry.from_dict(raw[proj]) for proj in PROJECTIONS})
    except (KeyError, TypeError, ValueError):
        return None


def _finished_layer(path: Path, layer: int, settings: dict, expected) -> LayerEntry | None:
    """The entry of a complete layer file written with the same settings, else None."""
    metadata = valid_tensor_file(path, expected)
    return None if metadata is None else _entry_from_metadata(metadata, layer, settings, path.name)


def _remove_previous_manifest(path: Path) -> None:
    """Remove the manifest of a previous run; refuse to delete a ``manifest.json`` that is not nmmc's."""
    if not path.exists():
        return
    try:
        ours = json.loads(path.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise InputError(f"{path} exists and is not an nmmc manifest; choose an empty or nmmc output directory")
    path.unlink()


def _factor(w: np.ndarray, rank: int, np_dtype: type, threads: int | None, gram: np.ndarray | None,
            damping: float):
    # Multi-threaded BLAS gains nothing on small matrices and, on a busy machine, its spinning threads
    # make a 256 x 768 SVD ~100x slower; large ones use ``threads`` (None: the BLAS library's default).
    limit = 1 if w.size <= SMALL_MATRIX else threads
    with threadpool_limits(limits=limit, user_api="blas"):
        if gram is None:
            factors = svd.truncated_svd(w, rank)
            u, v = factors.u.astype(np_dtype), factors.v.astype(np_dtype)
            return u, v, svd.relative_error(w, u, v), factors.method, None
        white = whitened_svd(w, gram, rank, damping)
        u, v = white.u.astype(np_dtype), white.v.astype(np_dtype)
        return u, v, svd.relative_error(w, u, v), "whitened", white.output_error


def _output_error(w: np.ndarray, u: np.ndarray, v: np.ndarray | None, gram: np.ndarray) -> float:
    """Relative output error ``||X (W - u v)||_F / ||X W||_F`` on the calibration activations (from ``X^T X``);
    ``v`` None: of the approximation ``u`` of ``W`` itself."""
    w64 = np.asarray(w, dtype=np.float64)
    approx = np.asarray(u, dtype=np.float64)
    diff = w64 - (approx if v is None else approx @ np.asarray(v, dtype=np.float64))
    total = float(np.einsum("ij,ij->", w64, gram @ w64))
    return float(np.sqrt(max(float(np.einsum("ij,ij->", diff, gram @ diff)), 0.0) / total)) if total > 0 else 0.0


def _compress_layer(reader: WeightReader, config: ModelConfig, layer: int, ranks: Mapping[str, int | None],
                    dtype: str, threads: int | None, on_matrix: Callable[[], None],
                    calibration: Calibration | None, damping: float,
                    given: Mapping[str, Any] | None = None, healed: str | None = None, fp8: tuple | None = None,
                    mx: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, ProjectionEntry]]:
    np_dtype = np.float32 if fp8 is not None or mx is not None else OUTPUT_DTYPES[dtype][0]  # FP8, MX: from float32
    tensors: dict[str, np.ndarray] = {}
    entries: dict[str, ProjectionEntry] = {}
    for proj, name in mlp_weight_names(config, layer).items():
        k, n = projection_shape(config, proj)
        w = reader.read(name, shape=(n, k)).T  # HF stores [out, in]; nmmc's W is [in, out]
        rank = ranks[proj]
        if rank is None:
            if not np.isfinite(w).all():
                raise InputError(f"{name}: the weight holds NaN or Inf values (check the checkpoint)")
            stored = tensors[dense_name(layer, proj)] = np.ascontiguousarray(w.astype(np_dtype))
            norm = float(np.linalg.norm(w.astype(np.float64)))
            error = float(np.linalg.norm(w.astype(np.float64) - stored.astype(np.float64)) / norm) if norm else 0.0
            entries[proj] = ProjectionEntry(rank=min(k, n), shape=(k, n), relative_error=error, method="dense",
                                            output_error=None if calibration is None else 0.0)
            on_matrix()
            continue
        gram = None if calibration is None else calibration.gram(layer, proj)
        if given is not None and isinstance(given[proj], tuple):  # healed factors, computed by the caller
            u, v = (np.ascontiguousarray(np.asarray(t).astype(np_dtype)) for t in given[proj])
            if u.shape != (k, rank) or v.shape != (rank, n):
                raise InputError(f"{name}: given factors have shapes {list(u.shape)}, {list(v.shape)}; expected "
                                 f"[{k}, {rank}], [{rank}, {n}]")
            error, method = svd.relative_error(w, u, v), str(healed)
            output_error = None if gram is None else _output_error(w, u, v, gram)
        else:
            try:
                u, v, error, method, output_error = _factor(w, rank, np_dtype, threads, gram, damping)
            except InputError as exc:
                raise InputError(f"{name}: {exc}") from None
        entries[proj] = ProjectionEntry(rank=rank, shape=(k, n), relative_error=error, method=method,
                                        output_error=output_error)
        del w
        u_name, v_name = factor_names(layer, proj)
        tensors[u_name], tensors[v_name] = u, v
        on_matrix()
    if fp8 is not None:
        return _quantized_layer(reader, config, layer, ranks, tensors, entries, fp8, calibration)
    return tensors, entries


def _quantized_layer(reader: WeightReader, config: ModelConfig, layer: int, ranks: Mapping[str, int | None],
                     tensors: Mapping[str, np.ndarray], entries: Mapping[str, ProjectionEntry], fp8: tuple,
                     calibration: Calibration | None) -> tuple[dict[str, np.ndarray], dict[str, ProjectionEntry]]:
    """The FP8 layer file of float32 ``tensors`` (:mod:`.fp8_files`); errors are of the dequantized weights."""
    from .formats import fp8_layer

    factors = {proj: tensors[dense_name(layer, proj)] if ranks[proj] is None
               else tuple(tensors[n] for n in factor_names(layer, proj)) for proj in PROJECTIONS}
    q = fp8_layer(factors, fp8[1], fp8[0], entry_act_scale(fp8))
    out = {}
    for proj, name in mlp_weight_names(config, layer).items():
        k, n = projection_shape(config, proj)
        w = reader.read(name, shape=(n, k)).T
        pairs = q.weights[proj] if ranks[proj] is not None else (q.weights[proj],)
        values = [t.astype(np.float64) * s.reshape(1, -1) for t, s in pairs]
        u, v = (values[0], None) if ranks[proj] is None else values
        gram = None if calibration is None else calibration.gram(layer, proj)
        norm = float(np.linalg.norm(w.astype(np.float64)))
        error = svd.relative_error(w, u, v) if v is not None else float(np.linalg.norm(w - u) / norm) if norm else 0.0
        out[proj] = replace(entries[proj], relative_error=error,
                            output_error=None if gram is None else _output_error(w, u, v, gram))
    return fp8_tensors(layer, q), out


def compress_model(model_dir: str | Path, out_dir: str | Path, keep_ratio: float, *, align: int = 128,
                   ranks: Mapping[str, int] | None = None, progress: Progress | None = None,
                   dtype: str = "float32", threads: int | None = None, calibration: Calibration | None = None,
                   damping: float = DEFAULT_DAMPING,
                   layer_ranks: Sequence[Mapping[str, int | None]] | None = None,
                   factors: Mapping[int, Mapping[str, Any]] | None = None, heal: dict | None = None,
                   fp8: Mapping[int, tuple] | None = None, fp8_record: Mapping[str, Any] | None = None,
                   mx: Mapping[int, str] | None = None,
                   mx_record: Mapping[str, Any] | None = None) -> Manifest:
    """Compress the MLP of the model in ``model_dir`` into ``out_dir``; return the manifest written.

    - ``keep_ratio``: fraction of each MLP weight's parameters kept; the rank is the NeuronMM
      block-aligned rank ``block_aligned_rank(in, out, keep_ratio, align)``.
    - ``ranks``: per-projection overrides, e.g. ``{"down": 1024}``.
    - ``dtype``: the factors' dtype, "float32" (default: exactly the fp32 factorization), "bfloat16",
      "float16" or "model" (the model's ``torch_dtype``). Errors in the manifest are of the stored factors.
    - ``threads``: BLAS threads for matrices of more than ``SMALL_MATRIX`` elements (None: the BLAS
      library's default; smaller matrices always use one thread). It changes the factors in the last
      bits only, but byte-identical reruns need the same thread count.
    - ``calibration``: activation Gram matrices (:mod:`.calibration`); given, every matrix is factored
      by activation-aware whitened SVD (:mod:`.whitening`, with ``damping``) instead of plain SVD.
    - ``layer_ranks``: per layer, the rank of each projection, None keeping it dense (the joint
      accuracy/speed choice, :mod:`.rank_choice`); replaces the uniform keep-ratio ranks.
    - ``factors`` and ``heal``: factors computed by the caller (healing, :mod:`.heal`), per layer and
      projection ``(u, v)`` of the planned ranks, written instead of the SVD's; ``heal`` describes how
      they were made (recorded in every layer file and the manifest, and part of what a resumed run
      must match). Their projections' ``svd_method`` is ``heal["method"]``.
    - ``fp8``: per layer made FP8, ``(format, activation ranges)`` (``max|v|`` per quantized value,
      :func:`.formats.activation_ranges`): the layer's weights are quantized with per-output-channel scales and
      stored with them and the static activation scales (:mod:`.fp8_files`); ``fp8_record`` describes how (manifest
      ``fp8``). Its errors are of the dequantized weights. A third element "row": per-token activation scales.
    - ``mx``: per layer made MX, its format: float32 factors whatever ``dtype`` is, not pre-quantized (.mx_layers).
    - ``progress(done, total)``: called after each matrix factorized by this call; ``total`` is 3 x layers
      and ``done`` counts matrices finished so far, including those of layers found already complete
      (which are not recomputed and cause no call).

    The model directory needs ``config.json`` and ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``. Bad input raises InputError; see the module docstring for
    atomicity and resuming.
    """
    if not Path(model_dir).is_dir():
        raise InputError(f"model directory not found: {model_dir} (it must hold config.json and safetensors weights)")
    config = read_config(model_dir)
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0:
        raise InputError(f"align must be a positive integer; got {align!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0):
        raise InputError(f"threads must be a positive integer or None; got {threads!r}")
    plan = plan_ranks(config, keep_ratio, align, ranks)
    plans: list[Mapping[str, int | None]] = [plan] * config.num_hidden_layers
    if layer_ranks is not None:
        plans = _check_layer_ranks(config, layer_ranks)
    if calibration is not None and len(calibration.grams) != config.num_hidden_layers:
        raise InputError(f"calibration has {len(calibration.grams)} layers; the model has {config.num_hidden_layers}")
    whitening = None if calibration is None else {"damping": damping, "calibration": calibration.digest()}
    dtype = resolve_dtype(dtype, config)
    reader = WeightReader(model_dir)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"output path {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for stale in stale_temp_files(out, LAYER_FILE.replace("{layer:03d}", "*")) + stale_temp_files(out, MANIFEST_FILE):
        stale.unlink(missing_ok=True)
    _remove_previous_manifest(out / MANIFEST_FILE)  # present again only once every layer is done

    if (factors is None) != (heal is None):
        raise InputError("given factors need a heal record describing them, and a heal record needs the factors")
    fp8 = dict(fp8 or {})
    mx = dict(mx or {})
    # the source weights' bytes too: a resumed run must not keep factors of weights changed in between
    settings = [{**_settings(config, keep_ratio, align, dtype, p, whitening, heal, fp8.get(i), mx.get(i)),
                 "source": reader.digest(mlp_weight_names(config, i).values())}
                for i, p in enumerate(plans)]
    code = OUTPUT_DTYPES[dtype][1]
    layers = range(config.num_hidden_layers)
    shapes = {proj: projection_shape(config, proj) for proj in PROJECTIONS}
    entries: dict[int, LayerEntry | None] = {layer: _finished_layer(
        out / layer_file(layer), layer, settings[layer],
        _expected_tensors(config, layer, plans[layer], "F32" if layer in mx else code) if layer not in fp8 else
        expected_fp8_tensors(shapes, layer, plans[layer], fp8[layer][0], entry_act_scale(fp8[layer])))
        for layer in layers}
    total = len(PROJECTIONS) * config.num_hidden_layers
    done = len(PROJECTIONS) * sum(entry is not None for entry in entries.values())

    def on_matrix() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    for layer in layers:
        if entries[layer] is not None:
            continue
        tensors, projections = _compress_layer(reader, config, layer, plans[layer], dtype, threads, on_matrix,
                                               calibration, damping, None if factors is None else factors[layer],
                                               None if heal is None else heal["method"], fp8.get(layer), mx.get(layer))
        metadata = _layer_metadata(layer, settings[layer], projections)
        write_tensor_file(out / layer_file(layer), tensors, metadata)
        del tensors
        # the manifest is built from the recorded JSON, exactly as a resumed run reads it back
        entries[layer] = _entry_from_metadata(metadata, layer, settings[layer], layer_file(layer))
    entries = {layer: replace(entry, fp8=fp8[layer][0] if layer in fp8 else None, mx=mx.get(layer))
               if entry is not None else entry for layer, entry in entries.items()}

    manifest = Manifest(model=config, keep_ratio=float(keep_ratio), align=align, dtype=dtype,
                        layers=tuple(entries[layer] for layer in layers),  # type: ignore[misc]
                        method="whitened" if calibration is not None else "svd",
                        calibration=None if calibration is None else {**calibration.describe(), "damping": damping},
                        heal=heal, fp8=fp8_record if fp8 else None, mx=mx_record if mx else None)
    write_text_atomic(out / MANIFEST_FILE, manifest.to_json())
    return manifest

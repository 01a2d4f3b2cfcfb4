"""``nmmc compress`` end to end: calibrate, choose ranks, factor, measure, warn.

:func:`run_compress` strings the pieces of :mod:`neuronmm_compiler.models` together:

1. calibration (optional): token ids or text through the NumPy forward pass, or pre-captured
   activations, folded into ``X^T X`` per projection (:mod:`.calibration`);
2. ranks: the uniform NeuronMM block-aligned ranks of ``keep_ratio``, or -- with ``choose_ranks`` or
   ``target_speedup`` -- per-layer ranks on the Pareto front of predicted latency and whitened loss
   (:mod:`.rank_choice`, :mod:`.latency`);
3. factorization: whitened SVD when calibrated, plain SVD otherwise (:func:`.compress.compress_model`);
4. quality (optional): perplexity, top-1 agreement and per-layer MLP output error of the compressed
   model on held-out text (:mod:`.quality`), recorded in the manifest.

It returns the manifest and the warnings a user must see (plain SVD's cost, a perplexity rise over
the threshold, a kept fraction far from the requested keep ratio).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..io import check_input_file, write_text_atomic
from .calibration import (
    DEFAULT_SEQUENCE,
    Calibration,
    calibrate,
    calibration_from_activations,
    load_tokens,
    sequences,
)
from .compress import compress_model, plan_ranks
from .config import read_config
from .manifest import MANIFEST_FILE, Manifest, dense_name, factor_names, layer_file
from .whitening import DEFAULT_DAMPING

__all__ = ["CompressRequest", "CompressResult", "load_factors", "run_compress"]

#: ``progress(stage, done, total)``.
StageProgress = Callable[[str, int, int], None]
PLAIN_SVD_WARNING = ("plain SVD (no --calibration) ignores which directions the activations use: on a real "
                     "pretrained model (SmolLM2-135M, docs/compression.md) it took held-out perplexity from 15.7 to "
                     "73,694 at keep ratio 0.8 (whitened SVD: 23.3); pass --calibration TEXT for activation-aware "
                     "(whitened) truncation and --eval TEXT to measure the result")


@dataclass(frozen=True)
class CompressRequest:
    """What ``nmmc compress`` was asked (see :func:`run_compress`)."""

    model_dir: str
    out_dir: str
    keep_ratio: float
    align: int = 128
    ranks: dict[str, int] | None = None
    dtype: str = "float32"
    threads: int | None = None
    calibration: str | None = None
    calibration_tokens: int | None = 16384
    eval: str | None = None
    eval_tokens: int | None = 8192
    sequence_length: int = DEFAULT_SEQUENCE
    damping: float = DEFAULT_DAMPING
    choose_ranks: bool = False
    target_speedup: float | None = None
    buckets: tuple[int, ...] | None = None  # token buckets; needed for the joint rank choice
    target: Any = None  # a Target; needed for the joint rank choice
    max_ppl_increase: float = 0.10


@dataclass
class CompressResult:
    manifest: Manifest
    warnings: list[str] = field(default_factory=list)
    front: Any = None  # rank_choice.Front when ranks were chosen jointly
    choice: Any = None


def _calibration(request: CompressRequest, model_loader: Callable[[], Any],
                 progress: StageProgress | None) -> tuple[Calibration | None, np.ndarray | None]:
    """The Grams, and the calibration token ids (None for pre-captured activations)."""
    if request.calibration is None:
        return None, None
    path = Path(request.calibration)
    if path.suffix == ".safetensors":
        check_input_file(path, "--calibration", "one .safetensors file of activations")
        model = model_loader()
        return calibration_from_activations(path, request.model_dir,
                                            inner_from=lambda layer, x: model.mlp(layer, x)[1]), None
    ids = load_tokens(path, request.model_dir, request.calibration_tokens, what="--calibration")
    model = model_loader()
    return calibrate(model, ids, source=f"{path.name}, {ids.size} tokens", length=request.sequence_length,
                     progress=None if progress is None else lambda d, t: progress("calibrating", d, t)), ids


#: Calibration tokens on which each layer's sensitivity is measured (one forward pass per layer).
SENSITIVITY_TOKENS = 1024


def _choose_ranks(request: CompressRequest, calibration: Calibration, ids: np.ndarray | None, model,
                  progress: StageProgress | None):
    from .latency import predict_latencies
    from .rank_choice import pareto_front, uniform_point, variants
    from .sensitivity import scaled_losses

    a = model.arch
    plan = plan_ranks(read_config(request.model_dir), request.keep_ratio, request.align, request.ranks)
    uniform = (plan["gate"], plan["down"])
    options = variants(a.hidden_size, a.intermediate_size, request.align)
    if uniform not in options and plan["gate"] == plan["up"]:
        options.append(uniform)
    chunks = None if ids is None else sequences(ids[:SENSITIVITY_TOKENS], request.sequence_length)
    losses, measured, _ = scaled_losses(model, calibration, options, request.damping, chunks,
                                        [uniform] if uniform in options else [],
                                      None if progress is None else lambda d, t: progress("layer sensitivity", d, t))
    table = predict_latencies(a.hidden_size, a.intermediate_size, request.buckets, options, target=request.target,
                              progress=None if progress is None else lambda d, t: progress("cost model", d, t))
    front = pareto_front(losses, table.total, options)
    dense = uniform_point(losses, table.total, options, None)
    same = uniform_point(losses, table.total, options, uniform) if uniform in options else None
    if request.target_speedup is not None:
        objective = f"most accurate at {request.target_speedup}x the predicted speed of the fused dense MLP"
        point = front.most_accurate_within(dense.latency / request.target_speedup)
    else:
        if same is None:
            raise InputError("the joint rank choice compares with uniform ranks that share gate and up; "
                             "drop --rank-gate/--rank-up")
        # Most accurate at the uniform ranks' predicted latency, not fastest at their predicted accuracy:
        # the per-layer costs add up only roughly (errors compound), and spending the whole accuracy
        # budget on speed measured far worse than uniform ranks on SmolLM2-135M (docs/compression.md).
        objective = (f"most accurate within the predicted latency of uniform ranks {same.choice[0]} (keep ratio "
                     f"{request.keep_ratio})")
        point = front.most_accurate_within(same.latency)
    record = {
        "objective": objective,
        "accuracy_proxy": "predicted log-perplexity increase: per layer, the whitened truncation loss mapped through "
                          "the NLL increases measured on calibration tokens with that layer alone compressed at the "
                          "uniform and the smallest ranks (piecewise linear), summed over layers"
                          if chunks is not None else "sum over layers of the whitened truncation loss (no "
                          "calibration tokens to measure sensitivity on)",
        "layer_nll_increase": [[float(v) for v in row] for row in measured],
        "latency": table.to_dict(),
        "dense": {"predicted_us": dense.latency, "loss": dense.loss},
        "uniform": None if same is None else {"ranks": list(uniform), "predicted_us": same.latency,
                                              "loss": same.loss},
        "chosen": {"predicted_us": point.latency, "loss": point.loss},
        "front": [{"predicted_us": p.latency, "loss": p.loss,
                   "dense_layers": sum(c is None for c in p.choice)} for p in front.summary(24)],
    }
    layer_ranks = [{"gate": None, "up": None, "down": None} if c is None else {"gate": c[0], "up": c[0], "down": c[1]}
                   for c in point.choice]
    return layer_ranks, record, front, point


def all_dense_warning(request: CompressRequest, record: dict[str, Any]) -> str:
    """What a joint rank choice that kept every layer dense says: that the output is the original
    weights, and why (the SVD MLP predicted no faster than the dense one at the requested buckets)."""
    latency = record["latency"]
    where = (f"at token bucket{'s' if len(latency['buckets']) > 1 else ''} "
             f"{','.join(map(str, latency['buckets']))} on {latency['target']}")
    dense = record["dense"]["predicted_us"]
    if request.target_speedup is not None:
        why = (f"--target-speedup {request.target_speedup} allows the fused dense MLP's predicted latency "
               f"({dense:.1f} us {where}), and dense is exact")
    else:
        uniform = record["uniform"]
        why = (f"the SVD MLP is predicted slower than the fused dense MLP {where}: uniform ranks "
               f"{'/'.join(map(str, uniform['ranks']))} {uniform['predicted_us']:.1f} us vs dense {dense:.1f} us "
               "(summed over layers and buckets), so dense, which is exact, is the most accurate choice within "
               "that latency")
    return (f"--choose-ranks kept every layer dense: the output holds the original weights, uncompressed; {why}. "
            "Compression buys no predicted speed there: choose larger token buckets (--tokens), or compress "
            "without --choose-ranks")


def load_factors(out_dir: str | Path, manifest: Manifest) -> dict[int, dict[str, Any]]:
    """Every layer's factors ``(u, v)`` (or dense ``W``) from a compression output directory."""
    from safetensors import safe_open

    factors: dict[int, dict[str, Any]] = {}
    for entry in manifest.layers:
        with safe_open(str(Path(out_dir) / layer_file(entry.layer)), framework="np") as handle:
            factors[entry.layer] = {}
            for proj, p in entry.projections.items():
                if p.dense:
                    factors[entry.layer][proj] = handle.get_tensor(dense_name(entry.layer, proj)).astype(np.float32)
                else:
                    u, v = factor_names(entry.layer, proj)
                    factors[entry.layer][proj] = (handle.get_tensor(u).astype(np.float32),
                                                  handle.get_tensor(v).astype(np.float32))
    return factors


def run_compress(request: CompressRequest, *, progress: StageProgress | None = None) -> CompressResult:
    """Compress as ``request`` says (see the module docstring); return the manifest and warnings."""
    from .forward import CausalLM
    from .quality import evaluate, factored_mlp

    if (request.choose_ranks or request.target_speedup is not None) and request.calibration is None:
        raise InputError("choosing ranks for accuracy and speed needs --calibration (the accuracy proxy is the "
                         "whitened truncation loss on calibration activations)")
    if (request.choose_ranks or request.target_speedup is not None) and not request.buckets:
        raise InputError("choosing ranks for speed needs --tokens with the token buckets you serve, e.g. "
                         "--tokens 1,128,512")
    if request.target_speedup is not None and not request.target_speedup > 0:
        raise InputError(f"--target-speedup must be positive; got {request.target_speedup}")
    if not request.max_ppl_increase >= 0:
        raise InputError(f"--max-ppl-increase must be a non-negative fraction; got {request.max_ppl_increase}")
    if not Path(request.model_dir).is_dir():  # reported before any work, as compress_model words it
        raise InputError(f"model directory not found: {request.model_dir} (it must hold config.json and safetensors "
                         "weights)")
    read_config(request.model_dir)
    loaded: list[Any] = []

    def model() -> Any:
        if not loaded:
            loaded.append(CausalLM(request.model_dir))
        return loaded[0]

    eval_ids = None if request.eval is None else load_tokens(request.eval, request.model_dir, request.eval_tokens,
                                                            what="--eval")
    calibration, calibration_ids = _calibration(request, model, progress)
    layer_ranks = record = front = point = None
    if request.choose_ranks or request.target_speedup is not None:
        layer_ranks, record, front, point = _choose_ranks(request, calibration, calibration_ids, model(), progress)
    manifest = compress_model(
        request.model_dir, request.out_dir, request.keep_ratio, align=request.align, ranks=request.ranks,
        dtype=request.dtype, threads=request.threads, calibration=calibration, damping=request.damping,
        layer_ranks=layer_ranks,
        progress=None if progress is None else lambda d, t: progress("factoring", d, t))
    warnings = []
    if calibration is None:
        warnings.append(PLAIN_SVD_WARNING)
    if layer_ranks is not None and record is not None and all(r["gate"] is None for r in layer_ranks):
        warnings.append(all_dense_warning(request, record))
    kept = manifest.kept_fraction
    if layer_ranks is None and (kept > 1.0 or abs(kept - request.keep_ratio) > 0.05):
        more = " -- more than the dense weights" if kept > 1.0 else ""
        warnings.append(f"kept fraction {kept:.3f} of the MLP parameters{more}, requested keep ratio "
                        f"{request.keep_ratio}: ranks are rounded to multiples of --align {request.align}")
    quality = None
    if eval_ids is not None:
        mlp = factored_mlp(load_factors(request.out_dir, manifest))
        quality = evaluate(model(), eval_ids, mlp, length=request.sequence_length,
                           progress=None if progress is None else lambda d, t: progress("evaluating", d, t))
        if quality.ppl_increase > request.max_ppl_increase:
            warnings.append(f"PERPLEXITY ROSE {quality.ppl_increase:+.1%} ({quality.ppl_original:.2f} -> "
                            f"{quality.ppl_compressed:.2f}), over --max-ppl-increase {request.max_ppl_increase:.0%}: "
                            f"this compressed model is measurably worse; keep more rank, calibrate, or fine-tune")
    if quality is not None or record is not None:
        manifest = replace(manifest, quality=None if quality is None else
                           {**quality.to_dict(), "source": f"{Path(request.eval).name}"},  # type: ignore[arg-type]
                           rank_choice=record)
        write_text_atomic(Path(request.out_dir) / MANIFEST_FILE, manifest.to_json())
    return CompressResult(manifest, warnings, front, point)

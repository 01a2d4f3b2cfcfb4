"""``nmmc compress`` end to end: calibrate, choose ranks, factor, measure, warn.

:func:`run_compress` strings the pieces of :mod:`neuronmm_compiler.compression` together:

1. calibration (optional): token ids or text through the NumPy forward pass, or pre-captured
   activations, folded into ``X^T X`` per projection (:mod:`.calibration`);
2. ranks: the uniform NeuronMM block-aligned ranks of ``keep_ratio``, or -- with ``choose_ranks`` or
   ``target_speedup`` -- per-layer ranks on the Pareto front of predicted latency and whitened loss
   (:mod:`.rank_choice`, :mod:`.latency`);
   or -- ``choose_ranks`` without buckets -- greedily from measured perplexity (:mod:`.measured_choice`);
3. factorization: whitened SVD when calibrated, plain SVD otherwise, then healing (``heal``:
   :mod:`.heal`'s closed-form refit, and :mod:`.finetune`'s distillation) (:func:`.compress.compress_model`),
   and the factor shards of ``tp`` > 1 with the same whitening and healing;
4. quality (optional): perplexity, top-1 agreement and per-layer MLP output error of the compressed
   (and sharded) model on each held-out file and on all together (:mod:`.quality`), in the manifest.

It returns the manifest and the warnings a user must see (plain SVD's cost, a perplexity rise over
the threshold, a kept fraction far from the requested keep ratio).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ..checkpoints.config import read_config
from ..errors import InputError
from ..io import write_text_atomic
from ..workers.cores import available_cores
from .calibration import (
    DEFAULT_SEQUENCE,
    Calibration,
    load_tokens,
    sequences,
)
from .calibration_set import calibration_set, token_paths
from .compress import plan_ranks
from .compress_formats import check_formats, resolve_formats
from .compress_notes import (
    all_dense_warning,
    keeps_everything,
    planned_note,
    ppl_fraction,
    rise_advice,
)
from .compress_steps import _measure, _write_shards, build_model, compressed_mlp, load_factors
from .eval_budget import hold_budget_on_eval
from .heal import DEFAULT_HEAL_DAMPING, DEFAULT_HEAL_METRIC, DEFAULT_HEAL_PRIOR, check_heal_options
from .heal_steps import (
    CHECKPOINTS,
    StageProgress,
    whitened_factors,
)
from .manifest import MANIFEST_FILE, Manifest
from .measured_choice import SELECTION_SHARE, selection_tokens
from .rank_choice import BUDGET_NOT_APPLIED
from .whitening import DEFAULT_DAMPING

__all__ = ["CompressRequest", "CompressResult", "load_factors", "run_compress", "whitened_factors"]

PLAIN_SVD_WARNING = ("plain SVD (no --calibration) ignores which directions the activations use: on a real "
                     "pretrained model (SmolLM2-135M, docs/compression.md) it took held-out perplexity from 15.7 to "
                     "73,694 at keep ratio 0.8 (whitened SVD: 23.3); pass --calibration TEXT for activation-aware "
                     "(whitened) truncation and --eval TEXT to measure the result")


@dataclass(frozen=True)
class CompressRequest:
    """What ``nmmc compress`` was asked (see :func:`run_compress`).

    ``calibration`` and ``eval`` take one path or several (a tuple): several calibration files are mixed,
    each contributing an equal share of ``calibration_tokens``; several eval files are measured one by
    one and together. ``calibration_samples`` adds that many tokens sampled from the original model
    (:mod:`.sampling`) to the calibration set.
    """

    model_dir: str
    out_dir: str
    keep_ratio: float
    align: int = 128
    ranks: dict[str, int] | None = None
    dtype: str = "float32"
    threads: int | None = None  # BLAS and torch threads of every stage; None: every core this process may use
    calibration: str | tuple[str, ...] | None = None
    calibration_tokens: int | None = 16384
    eval: str | tuple[str, ...] | None = None
    eval_tokens: int | None = 8192
    sequence_length: int = DEFAULT_SEQUENCE
    damping: float = DEFAULT_DAMPING
    choose_ranks: bool = False
    target_speedup: float | None = None
    buckets: tuple[int, ...] | None = None  # token buckets; needed for the joint rank choice
    target: Any = None  # a Target; needed for the joint rank choice
    max_ppl_increase: float = 0.10
    calibration_samples: int = 0
    heal: str = "none"
    heal_damping: float = DEFAULT_HEAL_DAMPING
    heal_target: str = "layer"
    heal_prior: float = DEFAULT_HEAL_PRIOR
    heal_metric: str = DEFAULT_HEAL_METRIC  # gate/up refit errors weighed by their path to the MLP output
    finetune: Any = None  # finetune.FinetuneSettings; None: its defaults
    progress_bars: bool = False  # tqdm bars of long stages (fine-tuning) on stderr
    tp: int = 1  # > 1: also write the factor shards of a tensor-parallel deployment (OUT/tp<N>/)
    eval_check: bool = True  # --choose-ranks with --eval: back off until the eval files measure within budget
    act_scale: str = "static"  # FP8 activation scales: static (calibrated, stored) or row (per token, on chip)


@dataclass
class CompressResult:
    manifest: Manifest
    warnings: list[str] = field(default_factory=list)
    front: Any = None  # rank_choice.Front when ranks were chosen jointly
    choice: Any = None
    measured_choice: Any = None  # measured_choice.MeasuredChoice with --choose-ranks and no --tokens


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


def run_compress(request: CompressRequest, *, progress: StageProgress | None = None,
                 note: Callable[[str], None] | None = None) -> CompressResult:
    """Compress as ``request`` says (see the module docstring); return the manifest and warnings. ``note`` receives
    :func:`planned_note`, when there is one, once the inputs are checked and before the work starts."""
    # one thread count for every stage, resolved once: the BLAS library's (NumPy: calibration, SVD, closed form) and
    # torch's (Fisher, fine-tuning); by default every core this process may use, not the BLAS library's own default
    # (OPENBLAS_NUM_THREADS or every core of the machine, whatever the process's affinity)
    request = replace(request, threads=request.threads or available_cores())
    with threadpool_limits(limits=request.threads, user_api="blas"):
        return _run_compress(request, progress, note)


def _run_compress(request: CompressRequest, progress: StageProgress | None,
                  note: Callable[[str], None] | None = None) -> CompressResult:
    from .forward import CausalLM

    asked = request  # as asked: planned_note names its FP8 format
    fmt, mx, allowed = resolve_formats(request)
    check_formats(request, fmt, mx, allowed)
    if fmt is not None or allowed is not None:  # FP8 kernels: their activations and the other layers are bf16
        request = replace(request, dtype="bfloat16")  # (MX layers chosen among others are stored float32 anyway)
    elif mx is not None:  # MX: the factors stored in float32, quantized when read (.mx_layers)
        request = replace(request, dtype="float32")
    # measured greedy: ranks alone without --tokens; with formats, by predicted latency at --tokens (.format_choice)
    measured = request.choose_ranks and request.target_speedup is None and (not request.buckets or bool(allowed))
    calibrated = bool(token_paths(request.calibration)) or request.calibration_samples > 0
    if (request.choose_ranks or request.target_speedup is not None) and not calibrated:
        raise InputError("choosing ranks needs --calibration (whitened factors, and tokens to measure on)")
    if request.target_speedup is not None and not request.buckets:
        raise InputError("choosing ranks for speed needs --tokens with the token buckets you serve, e.g. "
                         "--tokens 1,128,512")
    if request.target_speedup is not None and not request.target_speedup > 0:
        raise InputError(f"--target-speedup must be positive; got {request.target_speedup}")
    if not request.max_ppl_increase >= 0:
        raise InputError(f"--max-ppl-increase must be non-negative; got {request.max_ppl_increase}")
    check_heal_options(request.heal, request.heal_target, request.heal_metric)
    if fmt is not None and ((not calibrated and request.act_scale == "static") or request.tp > 1):
        raise InputError("--dtype fp8 needs --calibration (text or .npy token ids: the static activation scales are "
                         "calibrated on them) and no --tp" if request.tp <= 1 else
                         "--dtype fp8 with --tp is not supported yet (docs/quantization.md)")
    if request.heal != "none" and not calibrated:
        raise InputError("--heal needs --calibration (healing fits the factors on calibration tokens)")
    if request.heal == "finetune" or (request.heal != "none" and request.heal_metric == "fisher"):
        from .finetune import import_torch

        import_torch("--heal finetune" if request.heal == "finetune" else "--heal-metric fisher")  # before any work
    if not Path(request.model_dir).is_dir():  # reported before any work, as compress_model words it
        raise InputError(f"model directory not found: {request.model_dir} (it must hold config.json and safetensors "
                         "weights)")
    config = read_config(request.model_dir)
    keep_all = keeps_everything(request)
    if keep_all and (request.heal != "none" or request.tp > 1):
        raise InputError("--keep-ratio 1.0 keeps every MLP weight dense (FP8 with --dtype fp8): there are no factors "
                         "to " + ("heal; drop --heal" if request.heal != "none" else "shard; drop --tp"))
    budget = ppl_fraction(request.max_ppl_increase)
    loaded: list[Any] = []

    def model() -> Any:
        if not loaded:
            loaded.append(CausalLM(request.model_dir))
        return loaded[0]

    eval_sets = [(p, load_tokens(p, request.model_dir, request.eval_tokens, what="--eval"))
                 for p in token_paths(request.eval)]
    announced: list[bool] = []

    def announce() -> None:  # once, before the first heavy step
        if note is not None and not announced:
            announced.append(True)
            text = planned_note(asked)
            if text:
                note(text)

    calibration, calibration_ids, warnings = calibration_set(request, model, progress, announce)
    announce()
    layer_ranks = record = front = point = None
    chosen = None
    if measured:
        from .format_choice import (
            bytes_costs,
            candidates,
            latency_costs,
            measured_format_choice,
            supported,
            unsupported_notes,
        )
        from .measured_choice import measured_choice
        from .whitening import whitened_svd

        if calibration_ids is None:
            raise InputError("--choose-ranks without --tokens measures perplexity on calibration tokens: give "
                             "--calibration as text or .npy token ids")
        m = model()
        if allowed is not None and note is not None:  # the MX candidates dropped, said before their pricing
            shape = (m.arch.hidden_size, m.arch.intermediate_size)
            for line in unsupported_notes(supported(*shape, candidates(*shape, request.align, allowed))[1]):
                note(line)
        costs = None if allowed is None else bytes_costs(m.arch, allowed, request.align) if not request.buckets else \
            latency_costs(m.arch, allowed, request.buckets, request.target, request.align,
                          None if progress is None else lambda d, t: progress("cost model", d, t))
        chosen = (measured_choice if allowed is None else partial(measured_format_choice, fmt=allowed, costs=costs))(
            m, selection_tokens(calibration_ids, request.sequence_length), budget * SELECTION_SHARE,
            lambda layer, proj, rank: (lambda f: (f.u, f.v))(whitened_svd(
                m.mlp_weight(layer, proj), calibration.gram(layer, proj), rank, request.damping)),
            length=request.sequence_length, align=request.align,
            progress=None if progress is None else lambda d, t: progress("choosing ranks (measured)", d, t))
        layer_ranks = [{p: r for p in ("gate", "up", "down")} for r in chosen.choice]
        record = {**chosen.to_dict(), "budget_ppl_increase": budget, "selection_budget": budget * SELECTION_SHARE,
                  "selection_tokens": int(selection_tokens(calibration_ids, request.sequence_length).size)}
    elif request.choose_ranks or request.target_speedup is not None:
        layer_ranks, record, front, point = _choose_ranks(request, calibration, calibration_ids, model(), progress)
        warnings += [BUDGET_NOT_APPLIED] if request.target_speedup is None else []
    if keep_all:  # every layer dense: the parameter-equal rank would lose what the user asked to keep
        layer_ranks = [dict.fromkeys(("gate", "up", "down")) for _ in range(config.num_hidden_layers)]
    shard_blocks: dict | None = {} if request.tp > 1 and calibration is not None else None
    build = partial(build_model, request, model() if calibrated or fmt is not None else None, calibration,
                    calibration_ids, fmt=fmt, progress=progress, shard_out=shard_blocks,
                    mx=None if mx is None else mx.name)
    quality = None
    if chosen is not None and eval_sets and request.eval_check:  # the budget held on the eval files (.eval_budget)
        built: list[Manifest] = []
        originals: dict = {}  # the original model's predictions on each eval file, computed once for every build

        def trial(choice, formats) -> dict:
            built.append(build([{p: r for p in ("gate", "up", "down")} for r in choice], formats=formats,
                               fresh=bool(built)))
            return _measure(model(), eval_sets, compressed_mlp(request.out_dir, built[-1]), request, progress,
                            originals)

        quality = hold_budget_on_eval(chosen, budget, trial)
        manifest, layer_ranks = built[-1], [{p: r for p in ("gate", "up", "down")} for r in chosen.choice]
        record = {**record, **{k: v for k, v in chosen.to_dict().items() if k != "budget_ppl_increase"}}
    else:
        manifest = build(layer_ranks, formats=None if chosen is None else chosen.formats)
    if calibration is None:
        warnings.append(PLAIN_SVD_WARNING)
    if layer_ranks is not None and record is not None and not measured and all(r["gate"] is None for r in layer_ranks):
        warnings.append(all_dense_warning(request, record))
    if measured and all(r["gate"] is None for r in layer_ranks) and manifest.fp8 is None and manifest.mx is None:
        where = "the --eval files" if chosen.eval_check else "the selection tokens"
        warnings.append("--choose-ranks kept every layer dense: " + (
            f"no layer could be compressed within +{budget:.1%} measured perplexity on {where}" if chosen.candidates
            != [] else f"no candidate is predicted faster than the dense bf16 MLP ({chosen.cost['unit']})"))
    kept = manifest.kept_fraction
    if layer_ranks is None and (kept > 1.0 or abs(kept - request.keep_ratio) > 0.05):
        more = " -- more than the dense weights" if kept > 1.0 else ""
        why = ("the ranks given with --rank-gate/--rank-up/--rank-down" if request.ranks else
               f"ranks are rounded to multiples of --align {request.align}")
        warnings.append(f"kept fraction {kept:.3f} of the MLP parameters{more}, requested keep ratio "
                        f"{request.keep_ratio}: {why}")
    if eval_sets:
        if quality is None:
            quality = _measure(model(), eval_sets, compressed_mlp(request.out_dir, manifest), request, progress)
        if quality["perplexity_increase"] > budget:
            warnings.append(f"PERPLEXITY ROSE {quality['perplexity_increase']:+.1%} "
                            f"({quality['perplexity_original']:.2f} -> {quality['perplexity_compressed']:.2f}), over "
                            f"--max-ppl-increase {budget:.0%}: this compressed model is measurably worse; "
                            + rise_advice(request))
    if request.tp > 1:
        sharded = _write_shards(request, model, calibration, layer_ranks, shard_blocks, eval_sets, progress)
        if sharded is not None:
            quality = {**(quality or {}), "tensor_parallel": sharded}
    if chosen is not None:
        from .measured_choice import plot_front

        plot_front(chosen, Path(request.out_dir) / "choice_front.png")
    if quality is not None or record is not None:
        manifest = replace(manifest, quality=quality, rank_choice=record)  # type: ignore[arg-type]
        write_text_atomic(Path(request.out_dir) / MANIFEST_FILE, manifest.to_json())
    for checkpoint in CHECKPOINTS:
        (Path(request.out_dir) / checkpoint).unlink(missing_ok=True)
    return CompressResult(manifest, warnings, front, point, chosen)

"""``nmmc compress``'s healing step: whitened factors of a rank plan, then the closed form (:mod:`.heal`) with the
Fisher metric (:mod:`.fisher`) when asked, then gradient fine-tuning (:mod:`.finetune`) and its resume from a
checkpoint; the factor-shard blocks of ``--tp`` healed the same way. :mod:`.compress_steps` writes what this heals.

Each stage's wall seconds go into the heal record (``seconds``; the closed form's and its inputs' from the run that
computed them when fine-tuning resumed from a checkpoint), so that a user can check the time a healing took.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoints.weights import WeightReader
from ..errors import InputError
from ..workers.cores import available_cores
from .calibration import Calibration

__all__ = ["CHECKPOINTS", "FINETUNE_CHECKPOINT", "SHARD_FINETUNE_CHECKPOINT", "SHARD_START_CHECKPOINT", "StageProgress",
           "heal", "sample", "shard_args", "teacher_length", "threads_of", "whitened_factors"]

#: ``progress(stage, done, total)``.
StageProgress = Callable[[str, int, int], None]

#: The fine-tuning checkpoints in the output directory, of the factors and of ``--tp``'s blocks (removed at the end).
FINETUNE_CHECKPOINT = "heal-finetune.ckpt"
SHARD_FINETUNE_CHECKPOINT = "heal-finetune-tp.ckpt"
#: ``--tp``'s closed-form blocks, written once when fine-tuning starts, so that a resumed run skips the closed form.
SHARD_START_CHECKPOINT = "heal-closed-form-tp.ckpt"
#: Every file a ``--heal finetune`` run resumes from (removed once the manifest is written, or by a fresh build).
CHECKPOINTS = (FINETUNE_CHECKPOINT, SHARD_FINETUNE_CHECKPOINT, SHARD_START_CHECKPOINT)
#: Sequences sampled together for the fine-tuning data: SmolLM2-135M sampled 150 tokens per CPU second at 64
#: (32,768 tokens in 219 CPU s, 2150 MiB peak with its 1.5 GB KV cache at 512 tokens;
#: benchmarks/results/compression-runs.md, "Third run").
SAMPLE_BATCH = 64


def whitened_factors(model, calibration: Calibration, plans, damping: float) -> dict[int, dict[str, Any]]:
    """Per layer and projection the whitened SVD factors ``(u, v)`` of ``plans`` (None: the dense ``W``)."""
    from .whitening import whiten, whitened_svd

    out: dict[int, dict[str, Any]] = {}
    for layer, ranks in enumerate(plans):
        white = {name: whiten(calibration.grams[layer][name], damping) for name in ("input", "inner")
                 if any(ranks[p] is not None for p in (("down",) if name == "inner" else ("gate", "up")))}
        out[layer] = {}
        for proj, rank in ranks.items():
            w = model.mlp_weight(layer, proj)
            if rank is None:
                out[layer][proj] = w
                continue
            f = whitened_svd(w, calibration.gram(layer, proj), rank, damping,
                             whitening=white["inner" if proj == "down" else "input"])
            out[layer][proj] = (f.u.astype(np.float32), f.v.astype(np.float32))
    return out


def shard_args(request, model) -> dict[str, Any]:
    """``shards`` and ``shard_rank`` of the factor-shard blocks of ``--tp`` (empty without it)."""
    if request.tp <= 1:
        return {}
    from ..tensor_parallel.shard_factors import block_rank, shard_spans

    a = model.arch
    return {"shards": shard_spans(a.intermediate_size, request.tp),
            "shard_rank": lambda rows, cols, full: block_rank(rows, cols, full, a.hidden_size, a.intermediate_size)}


@contextmanager
def _timed(record: dict[str, Any], stage: str) -> Iterator[None]:
    """Record the block's wall seconds as ``record["seconds"][stage]`` (when it completes)."""
    began = time.perf_counter()
    yield
    record.setdefault("seconds", {})[stage] = round(time.perf_counter() - began, 1)


def heal(request, model, calibration: Calibration, ids: np.ndarray | None, plans,
         progress: StageProgress | None, shard_out: dict | None = None, later: list | None = None
         ) -> tuple[dict, dict]:
    """The healed factors and the heal record (see :mod:`.heal`, :mod:`.finetune`); the factor-shard blocks of
    ``--tp`` healed the same way into ``shard_out`` (their fine-tuning appended to ``later``:
    :func:`.compress_steps.build_model` runs it once the factors are written)."""
    from .heal import closed_form_heal

    if ids is None:
        raise InputError("--heal runs the model over calibration tokens: give --calibration as text or .npy token "
                         "ids (pre-captured activations cannot be re-run through the healed layers)")
    record: dict[str, Any] = {"method": request.heal, "calibration": calibration.digest(),
                              "damping": request.heal_damping, "target": request.heal_target,
                              "prior_weight": request.heal_prior, "metric": request.heal_metric,
                              "threads": threads_of(request)}
    if request.heal == "finetune":
        resumed = _resume_finetune(request, model, calibration, ids, plans, record, progress, shard_out, later)
        if resumed is not None:
            return resumed
    with _timed(record, "whitened_svd"):
        start = whitened_factors(model, calibration, plans, request.damping)
    stream = _stream_metrics(request, model, ids, progress, record)
    with _timed(record, "closed_form"):
        healed, report = closed_form_heal(
            model, ids, start, length=request.sequence_length, damping=request.heal_damping,
            target=request.heal_target,
            progress=None if progress is None else lambda d, t: progress("healing (closed form)", d, t),
            shard_out=shard_out, prior=calibration.grams, prior_weight=request.heal_prior,
            metric=request.heal_metric, stream_metrics=stream, **shard_args(request, model))
    record["closed_form_error"] = {
        "mean_before": float(np.mean([v for layer in report.before for v in layer.values()] or [0.0])),
        "mean_after": float(np.mean([v for layer in report.after for v in layer.values()] or [0.0]))}
    del start  # the closed form's output is all fine-tuning needs (frees one copy of the factors)
    if request.heal == "finetune":
        if shard_out:
            _save_shard_start(request, model, calibration, ids, plans, shard_out)
        return _finetune(request, model, calibration, ids, healed, record, progress, shard_out=shard_out,
                         later=later)
    return healed, record


def teacher_length(request) -> int:
    """The tokens of each calibration sequence whose final hidden states the calibration pass keeps for fine-tuning's
    teacher (:func:`.finetune.teacher_states`): a fine-tuning sequence's length with ``--heal finetune``, else 0."""
    if request.heal != "finetune":
        return 0
    from .finetune import FinetuneSettings

    return (request.finetune or FinetuneSettings()).length


def threads_of(request) -> int:
    """``--threads``, every core this process may use by default."""
    return request.threads or available_cores()


def _stream_metrics(request, model, ids: np.ndarray, progress: StageProgress | None, record: dict[str, Any]
                    ) -> list[np.ndarray] | None:
    """``--heal-metric fisher``'s residual-stream metric of every layer (:mod:`.fisher`); None for the others."""
    if request.heal_metric != "fisher":
        return None
    from .fisher import FISHER_MIX, residual_fisher, residual_metric

    with _timed(record, "fisher"):
        fisher, tokens = residual_fisher(model, ids, length=request.sequence_length, threads=threads_of(request),
                                         progress=None if progress is None else lambda d, t: progress("fisher", d, t))
    record["fisher"] = {"tokens": tokens, "mix": FISHER_MIX}
    return [residual_metric(f) for f in fisher]


def sample(request, model, count: int, seed: int, progress: StageProgress | None, stage: str) -> np.ndarray:
    """``count`` tokens sampled from the original model as compress samples (:data:`SAMPLE_BATCH` sequences decoded
    together, on ``--threads``)."""
    from .sampling import sample_tokens

    return sample_tokens(model, count, length=request.sequence_length, batch=SAMPLE_BATCH, seed=seed,
                         threads=threads_of(request),
                         progress=None if progress is None else lambda d, t: progress(stage, d, t))


def _finetune_identity(request, calibration: Calibration) -> dict[str, Any]:
    """What a healing checkpoint must match besides its settings: the calibration, the healing options and every
    weight of the model (the teacher's too: its final norm and LM head feed no calibration Gram)."""
    return {"calibration": calibration.digest(), "damping": request.damping, "heal_damping": request.heal_damping,
            "target": request.heal_target, "prior": request.heal_prior, "metric": request.heal_metric,
            "source": _model_digest(str(request.model_dir), _weight_files_stamp(Path(request.model_dir)))}


def _weight_files_stamp(model_dir: Path) -> tuple:
    """Name, size and modification time of every safetensors file: a changed file changes the cache key below."""
    stats = ((p.name, p.stat()) for p in sorted(model_dir.glob("*.safetensors")))
    return tuple((name, st.st_size, st.st_mtime_ns) for name, st in stats)


@functools.lru_cache(maxsize=4)
def _model_digest(model_dir: str, stamp: tuple) -> str:
    """:meth:`.weights.WeightReader.digest` of every tensor, once per model state (``stamp``) in a process."""
    return WeightReader(model_dir).digest()


def _finetune(request, model, calibration: Calibration, ids: np.ndarray, start, record: dict[str, Any],
              progress: StageProgress | None, state: dict | None = None, shard_out: dict | None = None,
              later: list | None = None) -> tuple[dict, dict]:
    """Fine-tuning from the closed form's factors ``start`` (trained in place); ``record`` (the closed form's)
    is stored in the checkpoint, so that a resumed run can skip the closed form. ``shard_out`` (``--tp``: the
    closed form's factor-shard blocks) is fine-tuned the same way, on the same data, through the sum over ranks
    the deployment computes (:func:`.finetune.finetune_heal` with ``shards``), and updated in place, by a job
    appended to ``later`` (given with ``shard_out``; :func:`.compress_steps.build_model` runs it once the factors
    are written)."""
    from dataclasses import asdict

    from .finetune import FinetuneSettings, finetune_heal, teacher_states

    settings = replace(request.finetune or FinetuneSettings(), threads=threads_of(request))
    record["finetune"] = {k: v for k, v in asdict(settings).items() if k not in ("threads", "checkpoint_seconds")}
    record["finetune"]["start"] = "closed-form"
    # copies, for the record gains fine-tuning's seconds after the checkpoint's extra is made
    extra: dict[str, Any] = {k: dict(record[k]) for k in _CLOSED_FORM_RECORD if k in record}
    distill = ids
    if settings.samples > 0:
        if state is not None and "samples" in (state.get("extra") or {}):
            extra["samples"] = state["extra"]["samples"]
        else:
            with _timed(record, "finetune_sampling"):
                extra["samples"] = sample(request, model, settings.samples, settings.seed + 1, progress,
                                          "sampling (fine-tuning data)")
        distill = np.concatenate([ids, extra["samples"]])
    known = teacher_states(calibration.final, request.sequence_length, settings)  # teacher states it computed
    with _timed(record, "finetune"):
        healed, run = finetune_heal(
            model, distill, start, settings=settings, checkpoint=Path(request.out_dir) / FINETUNE_CHECKPOINT,
            identity=_finetune_identity(request, calibration), progress=request.progress_bars, in_place=True,
            on_step=None if progress is None or request.progress_bars else
            lambda d, t, _loss: progress("healing (fine-tuning)", d, t), state=state, extra=extra, key_ids=ids,
            teacher_hidden=known)
    record["finetune_run"] = run
    if shard_out and later is not None:
        def blocks() -> None:
            bar = f"healing (fine-tuning the --tp {request.tp} blocks)"
            with _timed(record, "finetune_tp"):
                tuned, tp_run = finetune_heal(
                    model, distill, shard_out, settings=replace(settings, dtype=run["dtype"]),  # "auto" chooses once
                    identity=_finetune_identity(request, calibration), progress=request.progress_bars,
                    in_place=True, checkpoint=Path(request.out_dir) / SHARD_FINETUNE_CHECKPOINT, key_ids=ids,
                    shards=shard_args(request, model)["shards"], teacher_hidden=known,
                    on_step=None if progress is None or request.progress_bars else
                    lambda d, t, _l: progress(bar, d, t))
            shard_out.update(tuned)
            record["finetune_tp_run"] = tp_run

        later.append(blocks)
    return healed, record


#: What the closed form adds to the heal record (its error, the Fisher's tokens, the seconds of the stages so far),
#: kept in the fine-tuning checkpoint for a resumed run's manifest.
_CLOSED_FORM_RECORD = ("closed_form_error", "fisher", "seconds")


def _resume_key(request, calibration: Calibration, ids: np.ndarray, plans,
                shards: Sequence[tuple[int, int]] | None = None) -> str:
    """The key of the unsharded fine-tuning's checkpoint (with ``shards``: of ``--tp``'s closed-form blocks)."""
    from .finetune import FinetuneSettings
    from .finetune_checkpoint import checkpoint_key

    ranks = {(layer, p): r for layer, plan in enumerate(plans) for p, r in plan.items() if r is not None}
    identity = _finetune_identity(request, calibration)
    if shards is not None:
        identity = {**identity, "closed_form_blocks": [list(s) for s in shards]}
    return checkpoint_key(request.finetune or FinetuneSettings(), identity, ids, ranks)


def _save_shard_start(request, model, calibration: Calibration, ids: np.ndarray, plans, blocks: dict) -> None:
    """Write ``--tp``'s closed-form blocks (:data:`SHARD_START_CHECKPOINT`), the start their fine-tuning resumes
    from; written once, before the unsharded factors' fine-tuning."""
    from .finetune_checkpoint import save_checkpoint
    from .torch_lm import import_torch

    torch = import_torch()
    key = _resume_key(request, calibration, ids, plans, shard_args(request, model)["shards"])
    # as tensors: torch.save writes their storages one by one (NumPy arrays would be pickled into one buffer)
    save_checkpoint({"key": key, "blocks": {layer: {p: None if b is None else [tuple(torch.from_numpy(t) for t in f)
                                                                               for f in b]
                                                    for p, b in projections.items()}
                                            for layer, projections in blocks.items()}},
                    Path(request.out_dir) / SHARD_START_CHECKPOINT)


def _resume_finetune(request, model, calibration: Calibration, ids: np.ndarray, plans, record: dict[str, Any],
                     progress: StageProgress | None, shard_out: dict | None, later: list | None
                     ) -> tuple[dict, dict] | None:
    """A killed ``--heal finetune`` run's fine-tuning, resumed from its checkpoint without recomputing the
    whitened SVD and the closed form it started from (their record is in the checkpoint); None without one.
    With ``--tp`` (``shard_out``) the closed form's blocks come from :data:`SHARD_START_CHECKPOINT` (None without
    it), and their fine-tuning resumes from its own checkpoint when it has one."""
    from .finetune_checkpoint import checkpoint_factors, load_checkpoint

    out = Path(request.out_dir)
    state = load_checkpoint(out / FINETUNE_CHECKPOINT, _resume_key(request, calibration, ids, plans))
    if state is None or not isinstance(state.get("extra"), dict) or "closed_form_error" not in state["extra"]:
        return None
    if shard_out is not None:
        blocks = load_checkpoint(out / SHARD_START_CHECKPOINT, _resume_key(
            request, calibration, ids, plans, shard_args(request, model)["shards"]))
        if blocks is None:
            return None
        shard_out.update({layer: {p: None if b is None else [tuple(t.numpy() for t in f) for f in b]
                                  for p, b in projections.items()} for layer, projections in blocks["blocks"].items()})
    record.update({k: v for k, v in state["extra"].items() if k in _CLOSED_FORM_RECORD})
    like = {layer: {p: r if r is not None else model.mlp_weight(layer, p) for p, r in plan.items()}
            for layer, plan in enumerate(plans)}
    return _finetune(request, model, calibration, ids, checkpoint_factors(state, like), record, progress, state,
                     shard_out=shard_out, later=later)

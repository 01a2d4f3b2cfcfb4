"""The calibration set of ``nmmc compress``: its token files (each an equal share of ``--calibration-tokens``, a short
file's unused share going to the others), tokens sampled from the model, or one file of pre-captured activations,
checked before the model runs and turned into the activation Grams (:mod:`.calibration`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checkpoints.config import read_config
from ..errors import InputError
from ..io import check_input_file
from .calibration import Calibration, calibrate, calibration_from_activations, load_tokens
from .compress_notes import share_budget
from .heal_steps import StageProgress, sample, teacher_length

if TYPE_CHECKING:
    from .workflow import CompressRequest

__all__ = ["calibration_set", "minimum_calibration_tokens", "single_source_warning", "token_paths"]


def token_paths(value: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str | Path) else tuple(value)


def minimum_calibration_tokens(intermediate_size: int) -> int:
    """Fewest calibration tokens accepted: the MLP's intermediate size (below it the Gram matrix of the
    down projection's input is singular, and whitening fits a subspace of the text's own), at least 256."""
    return max(256, int(intermediate_size))


def single_source_warning(source: str) -> str:
    return (f"calibration comes from a single source ({source}): whitening and healing fit its kind of text, and "
            "on SmolLM2-135M text of another domain lost several times more perplexity than text of the "
            "calibration's own (benchmarks/results/compression-runs.md); mix sources: several --calibration files "
            "of different kinds and --calibration-samples N (text sampled from the model itself)")


def calibration_set(request: CompressRequest, model_loader: Callable[[], Any], progress: StageProgress | None,
                 before_work: Callable[[], None] = lambda: None
                 ) -> tuple[Calibration | None, np.ndarray | None, list[str]]:
    """The Grams, the calibration token ids (None for pre-captured activations), and warnings; ``before_work`` is
    called once the inputs are checked, before the model runs."""
    paths = token_paths(request.calibration)
    if not paths and request.calibration_samples <= 0:
        return None, None, []
    config = read_config(request.model_dir)
    minimum = minimum_calibration_tokens(config.intermediate_size)
    if len(paths) == 1 and Path(paths[0]).suffix == ".safetensors" and request.calibration_samples <= 0:
        path = Path(paths[0])
        check_input_file(path, "--calibration", "one .safetensors file of activations")
        before_work()
        model = model_loader()
        calibration = calibration_from_activations(path, request.model_dir,
                                                   inner_from=lambda layer, x: model.mlp(layer, x)[1])
        if calibration.tokens < minimum:
            raise InputError(f"--calibration {path}: {calibration.tokens} activation rows; at least {minimum} are "
                             "needed (the model's intermediate size)")
        return calibration, None, [single_source_warning(path.name)]
    if any(Path(p).suffix == ".safetensors" for p in paths):
        raise InputError("pre-captured activations (.safetensors) are a calibration set of their own: give that one "
                         "file alone, without other --calibration files or --calibration-samples")
    budget = request.calibration_tokens
    loaded = [load_tokens(p, request.model_dir, budget, what="--calibration") for p in paths]
    takes = share_budget([ids.size for ids in loaded], budget)
    parts, sources, warnings = [], [], []
    for p, ids, take in zip(paths, loaded, takes, strict=True):
        parts.append(ids[:take])
        sources.append(f"{Path(p).name} ({take} tokens)")
    if budget is not None and paths and sum(takes) < budget:
        warnings.append(f"--calibration used {sum(takes)} tokens of the {budget} asked (--calibration-tokens): the "
                        "files hold no more")
    if parts and sum(p.size for p in parts) + request.calibration_samples < minimum:
        raise InputError(f"--calibration has {sum(p.size for p in parts) + request.calibration_samples} tokens; at "
                         f"least {minimum} are needed for this model (its intermediate size: fewer leave the down "
                         "projection's activation Gram matrix singular)")
    model = model_loader() if parts or request.calibration_samples > 0 else None
    for part in parts:  # ids outside the vocabulary are a user error: found before the work starts
        model.check_tokens(part)
    before_work()
    if request.calibration_samples > 0:
        sampled = sample(request, model, request.calibration_samples, 0, progress, "sampling")
        parts.append(sampled)
        sources.append(f"{sampled.size} tokens sampled from the model")
    ids = np.concatenate(parts)
    if ids.size < minimum:
        raise InputError(f"--calibration has {ids.size} tokens; at least {minimum} are needed for this model (its "
                         "intermediate size: fewer leave the down projection's activation Gram matrix singular)")
    warnings += [single_source_warning(Path(paths[0]).name)] if len(paths) == 1 and not request.calibration_samples \
        else []
    calibration = calibrate(model, ids, source=", ".join(sources), length=request.sequence_length,
                            progress=None if progress is None else lambda d, t: progress("calibrating", d, t),
                            keep_final=teacher_length(request))
    return calibration, ids, warnings


#: Calibration tokens on which each layer's sensitivity is measured (one forward pass per layer).

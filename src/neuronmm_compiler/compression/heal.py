"""Healing after truncation: re-solve the factors so the compressed model's layers match the original's.

Truncation (plain or whitened SVD, :mod:`.whitening`) fits each projection to the *original* model's
activations, one projection at a time. In the compressed model every layer's input has already been
changed by the compressed layers before it, and the down projection's input by the compressed gate and
up of its own layer; the errors compound (on SmolLM2-135M at rank 384, +56% perplexity in domain and
+605% out of domain, issue 27). Two remedies, both keeping every rank (block-aligned) and the factor file
format:

``closed-form`` (:func:`closed_form_heal`, NumPy, minutes): layer by layer, in order, run the
calibration tokens through the model whose earlier layers are already healed, so that each projection
sees the inputs ``A`` it will really get, and re-solve its factors by regularised, rank-constrained
least squares against the original layer's output ``B`` on those inputs:

    min_{rank(M) <= r} ||A M - B||_F^2 + lambda ||L^T M||...   with   A^T A + lambda I = L L^T

whose solution is ``M = L^-T [L^-1 A^T B]_r`` (the best rank-r approximation of ``L^-1 A^T B``):
``u = L^-T P_r sqrt(S_r)``, ``v = sqrt(S_r) Q_r^T``. Only the Gram ``A^T A`` and the cross product
``A^T B`` are accumulated, never the activations of all tokens. Gate and up get ``A = x~`` (this
layer's MLP input in the healed model) and ``B = x~ W`` (whitened SVD on the healed model's
activations, i.e. error propagation); down gets ``A = h~ = silu(x~ Ug Vg) * (x~ Uu Vu)`` from the healed
gate and up and ``B = h(x~) Wd``, the original MLP's output on ``x~``, so down also absorbs what the
truncation of gate and up lost. With ``target="stream"`` the targets are instead the original
model's own activations on the same tokens (``x W`` for gate/up, and for down the MLP output that puts
the compressed residual stream back onto the original one), which also corrects the drift of earlier
layers; it fits the calibration text harder.

By default (``metric="mlp-output"``) gate's and up's errors are weighed by how they reach the MLP's output
through silu and down (:mod:`.heal_metric`), not measured in their own output; ``"fisher"`` weighs the MLP
output's error in turn (down's too) by how much the model's predictions care about each direction of the
residual stream (:mod:`.fisher`); ``"projection"`` is the unweighted refit above.

``finetune`` (:mod:`.finetune`, torch): gradient distillation of the factors against the original
model's next-token distribution.

Cost of the closed form: one pass of the calibration tokens through the layers (no LM head) plus, per
projection, a Cholesky and an SVD of the same sizes as whitened SVD's; attention runs per sequence, the token-wise
products per block of :data:`~.calibration.BLOCK_TOKENS` tokens of consecutive sequences. Memory: the residual stream
and MLP input of every calibration token, ``2 * 4 * tokens * hidden`` bytes (76 MB for 16k tokens of
SmolLM2-135M), plus one layer's Grams.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..checkpoints.config import PROJECTIONS
from ..errors import InputError
from .calibration import DEFAULT_SEQUENCE, batch_gram, sequence_groups, sequences
from .forward import add_rows, rms_norm, silu
from .heal_metric import original_mlp
from .heal_shards import shard_down, shard_gate_up
from .heal_solve import DEFAULT_HEAL_DAMPING, Accumulator, project, rank_constrained_lstsq, relative_residual

__all__ = [
    "DEFAULT_HEAL_DAMPING",
    "DEFAULT_HEAL_METRIC",
    "HEAL_METHODS",
    "HEAL_METRICS",
    "HEAL_TARGETS",
    "HealReport",
    "check_heal_options",
    "closed_form_heal",
]

HEAL_METHODS = ("none", "closed-form", "finetune")
HEAL_TARGETS = ("layer", "stream")
#: Weight of the prior (whitened SVD's objective on the original activations) in the closed-form refit.
DEFAULT_HEAL_PRIOR = 1.0
#: What the refit's errors are measured in: the MLP's output (:func:`.heal_metric.original_mlp`), the same weighed by
#: the residual stream's Fisher (:mod:`.fisher`, down's refit too), or each projection's own output.
HEAL_METRICS = ("mlp-output", "fisher", "projection")
DEFAULT_HEAL_METRIC = "mlp-output"
#: Calibration tokens the output metric's Grams are summed over (every k-th block of sequences): a weighting needs
#: fewer tokens than the fit it weighs, and its two [intermediate, intermediate] Grams per layer cost more than
#: the rest.
METRIC_TOKENS = 16384

#: Per layer and projection: ``(u, v)`` factors or a dense ``W`` [in, out].
Factors = Mapping[int, Mapping[str, "tuple[np.ndarray, np.ndarray] | np.ndarray"]]


@dataclass(frozen=True)
class HealReport:
    """Per layer and projection, the relative residual ``||A M - B|| / ||B||`` of the refit on the
    calibration tokens, before (the factors given) and after healing."""

    before: tuple[dict[str, float], ...]
    after: tuple[dict[str, float], ...]
    tokens: int

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "relative_error_before": [dict(d) for d in self.before],
                "relative_error_after": [dict(d) for d in self.after]}


def check_heal_options(method: str, target: str, metric: str) -> None:
    """A one-line InputError for an unknown heal method, target or metric."""
    for what, value, accepted in (("--heal", method, HEAL_METHODS), ("heal target", target, HEAL_TARGETS),
                                  ("heal metric", metric, HEAL_METRICS)):
        if value not in accepted:
            raise InputError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")


def _with_prior(acc: Accumulator, prior, weight: float, layer: int, name: str, w: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(A^T A + w X^T X, A^T B + w X^T X W)``: the refit's normal equations plus the prior's."""
    if prior is None or weight <= 0:
        return acc.gram, acc.cross
    gram0 = np.asarray(prior[layer][name], dtype=np.float64)
    return acc.gram + weight * gram0, acc.cross + weight * (gram0 @ np.asarray(w, dtype=np.float64))


def closed_form_heal(model, ids: np.ndarray, factors: Factors, *, length: int = DEFAULT_SEQUENCE,
                     damping: float = DEFAULT_HEAL_DAMPING, target: str = "layer",
                     progress: Callable[[int, int], None] | None = None,
                     shards: Sequence[tuple[int, int]] | None = None,
                     shard_rank: Callable[[int, int, int], int | None] | None = None,
                     shard_out: dict | None = None, prior: Sequence[Mapping[str, np.ndarray]] | None = None,
                     prior_weight: float = 0.0, metric: str = DEFAULT_HEAL_METRIC,
                     stream_metrics: Sequence[np.ndarray] | None = None, metric_tokens: int = METRIC_TOKENS
                     ) -> tuple[dict, HealReport]:
    """Healed factors (same ranks; dense projections stay dense) and the per-projection residuals.

    ``model`` is a :class:`~.forward.CausalLM`, ``ids`` the calibration token ids, ``factors`` per
    layer and projection ``(u, v)`` or a dense ``W`` (e.g. whitened SVD's). See the module docstring.

    Tensor-parallel shards: with ``shards`` (the ``[start, stop)`` intermediate columns of each rank) and
    ``shard_rank(rows, cols, full_rank)`` (a block's own rank, None: not factored), the factor-shard
    blocks are healed the same way, on the same inputs -- gate/up blocks (their columns) against the same
    targets' columns, and each rank's down block (its rows) on that rank's own ``h~_i`` from its healed
    gate/up blocks, against the original layer's partial sum of that block -- and stored into
    ``shard_out[layer][proj]`` as a list of ``(u, v)`` per rank (or None when a block is not factored).

    ``prior`` (per layer the original model's ``{"input": X^T X, "inner": H^T H}`` on the same tokens, i.e.
    the calibration's Grams) with ``prior_weight`` w > 0 regularises the refit towards whitened SVD's own
    objective: it minimises ``||A M - B||^2 + w ||X (M - W)||^2`` (the second term: the layer's output
    error on the original model's activations), which keeps a refit on few calibration tokens from
    fitting them alone.

    ``metric="mlp-output"`` refits gate and up to the MLP output's error instead of their own
    (:func:`.heal_metric.original_mlp`, its Grams over at most ``metric_tokens`` tokens); down's refit is
    unchanged (it already targets the MLP's output). ``metric="fisher"`` also weighs the MLP output's error,
    down's fit included, by ``stream_metrics`` (per layer, the residual stream's metric of :mod:`.fisher`).
    """
    check_heal_options("closed-form", target, metric)
    if (metric == "fisher") != (stream_metrics is not None):
        raise InputError("the fisher heal metric needs the residual-stream metrics (models.fisher), and only it")
    if not damping > 0:
        raise InputError(f"heal damping must be positive; got {damping!r}")
    a = model.arch
    chunks = sequences(np.asarray(ids), length)
    if not chunks:
        raise InputError("healing needs calibration tokens")
    every = max(1, -(-sum(len(c) for c in chunks) // metric_tokens))  # the metric's blocks: every k-th
    stream = [model.embed[c].astype(np.float32) for c in chunks]  # the healed model's residual stream
    teacher = [s.copy() for s in stream] if target == "stream" else None
    groups = sequence_groups([len(c) for c in chunks])
    healed: dict[int, dict] = {}
    before, after = [], []
    for index, layer in enumerate(model.layers):
        xs, teacher_x = [], []  # per block of sequences (attention runs per sequence)
        for i, h in enumerate(stream):
            h += model._attention(layer, rms_norm(h, layer["input_norm"], a.rms_norm_eps))
            if teacher is not None:
                teacher[i] += model._attention(layer, rms_norm(teacher[i], layer["input_norm"], a.rms_norm_eps))
        for g in groups:
            xs.append(rms_norm(np.concatenate(stream[g]), layer["post_norm"], a.rms_norm_eps))
            if teacher is not None:
                teacher_x.append(rms_norm(np.concatenate(teacher[g]), layer["post_norm"], a.rms_norm_eps))
        given = factors[index]
        out: dict = {}
        errs_before, errs_after = {}, {}
        # gate and up: inputs x~, targets x~ W (from x~'s Gram alone) or the original model's x W
        factored = [p for p in ("gate", "up") if isinstance(given[p], tuple)]
        if teacher is not None:
            acc = {p: Accumulator(a.hidden_size, a.intermediate_size) for p in factored}
            for i, x in enumerate(xs):
                for p, ac in acc.items():
                    ac.add(x, teacher_x[i] @ model.mlp_weight(index, p))
        else:
            gram = sum(batch_gram(x) for x in xs) if factored else None
            acc = {p: Accumulator.of_linear(gram, model.mlp_weight(index, p)) for p in factored}
        stream_q = None if stream_metrics is None else stream_metrics[index]
        wants, metrics = original_mlp(model, index, xs, factored if metric != "projection" else (),
                                       outputs=teacher is None and isinstance(given["down"], tuple), stream=stream_q,
                                       every=every)
        if shards is not None and shard_out is not None:
            shard_out[index] = shard_gate_up(model, index, acc, given, shards, shard_rank, damping, metrics)
        for p in ("gate", "up"):
            if p not in acc:
                out[p] = given[p]
                continue
            rank = given[p][0].shape[1]
            u, v = rank_constrained_lstsq(*_with_prior(acc[p], prior, prior_weight, index, "input",
                                                       model.mlp_weight(index, p)), rank, damping, metrics.get(p))
            errs_before[p] = relative_residual(acc[p].gram, acc[p].cross, acc[p].target, *given[p])
            errs_after[p] = relative_residual(acc[p].gram, acc[p].cross, acc[p].target, u, v)
            out[p] = (u.astype(np.float32), v.astype(np.float32))
        del acc
        # down: inputs h~ from the healed gate and up, targets the original MLP's output on x~ (or the output
        # that brings the residual stream back to the original model's)
        ys = []
        down_acc = Accumulator(a.intermediate_size, a.hidden_size) if isinstance(given["down"], tuple) else None
        teacher_ys = [model.mlp(index, tx)[0] for tx in teacher_x]  # the original model's MLP (target "stream")
        for i, x in enumerate(xs):
            inner = silu(project(x, out["gate"])) * project(x, out["up"])
            if down_acc is not None:
                down_acc.add(inner, wants[i] if teacher is None else
                             np.concatenate(teacher[groups[i]]) + teacher_ys[i] - np.concatenate(stream[groups[i]]))
                ys.append(inner)
            else:
                ys.append(inner @ given["down"])
        if shards is not None and shard_out is not None and isinstance(given["down"], tuple):
            shard_out[index]["down"] = shard_down(model, index, xs, shard_out[index], shards, shard_rank, damping,
                                                   given["down"][0].shape[1], stream_q)
        if down_acc is not None:
            rank = given["down"][0].shape[1]
            u, v = rank_constrained_lstsq(*_with_prior(down_acc, prior, prior_weight, index, "inner",
                                                       model.mlp_weight(index, "down")), rank, damping, stream_q)
            errs_before["down"] = relative_residual(down_acc.gram, down_acc.cross, down_acc.target, *given["down"])
            errs_after["down"] = relative_residual(down_acc.gram, down_acc.cross, down_acc.target, u, v)
            out["down"] = (u.astype(np.float32), v.astype(np.float32))
            ys = [inner @ out["down"][0] @ out["down"][1] for inner in ys]
        else:
            out["down"] = given["down"]
        for i, g in enumerate(groups):
            add_rows(stream[g], ys[i])
            if teacher is not None:
                add_rows(teacher[g], teacher_ys[i])
        healed[index] = {p: out[p] for p in PROJECTIONS}
        before.append(errs_before)
        after.append(errs_after)
        if progress is not None:
            progress(index + 1, len(model.layers))
    return healed, HealReport(tuple(before), tuple(after), int(sum(len(c) for c in chunks)))

"""Measured layer sensitivity: how much compressing one layer's MLP costs the model, on calibration text.

The whitened truncation loss tells how much of a layer's MLP *output* a rank loses, but not what that
loss does to the model's predictions: an error in one layer can be harmless and the same relative
error in another ruinous (tried on SmolLM2-135M: choosing ranks by the unweighted loss, or by the
loss times the MLP's share of the residual stream, gave worse perplexity than uniform ranks at equal
loss). So the rank choice scales each layer's loss by a measured factor: compress that layer alone,
at a reference variant (the smallest ranks, where the effect is largest and best resolved), run the
model on calibration tokens, and take the increase of the mean next-token negative log-likelihood
per unit of whitened loss. One forward pass per layer, on the calibration text only (held-out text
stays held out). The model's predicted damage of an assignment is then ``sum_l scale_l * loss_l``,
the first-order, additive approximation of its log-perplexity increase.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..checkpoints.config import PROJECTIONS
from .forward import log_softmax, silu
from .whitening import whitened_svd

__all__ = ["layer_scales", "mean_nll"]


def mean_nll(model, chunks: Sequence[np.ndarray], override=None) -> float:
    """Mean next-token negative log-likelihood of ``model`` over ``chunks`` (float64)."""
    total, count = 0.0, 0
    for chunk in chunks:
        logp = log_softmax(model.forward(chunk, override=override))
        total -= float(logp[np.arange(len(chunk) - 1), chunk[1:]].astype(np.float64).sum())
        count += len(chunk) - 1
    return total / count


def layer_scales(model, calibration, chunks: Sequence[np.ndarray], reference: tuple[int, int],
                 reference_losses: Sequence[float], damping: float, whitenings: Sequence[dict] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Per layer: (NLL with only that layer's MLP compressed at ``reference`` - NLL of the model) /
    that layer's whitened loss at ``reference`` (``reference_losses``). Never below a tiny positive
    floor, so a layer measured as harmless still prefers less loss to more."""
    base = mean_nll(model, chunks)
    layers = model.arch.num_hidden_layers
    scales = np.zeros(layers)
    for layer in range(layers):
        factors = {}
        for proj, rank in zip(PROJECTIONS, (reference[0], reference[0], reference[1]), strict=True):
            white = None if whitenings is None else whitenings[layer][proj]
            f = whitened_svd(model.mlp_weight(layer, proj), calibration.gram(layer, proj), rank, damping,
                             whitening=white)
            factors[proj] = (f.u.astype(np.float32), f.v.astype(np.float32))

        def override(index: int, x: np.ndarray, layer=layer, factors=factors):
            if index != layer:
                return None
            g, u = ((x @ factors[p][0]) @ factors[p][1] for p in ("gate", "up"))
            return ((silu(g) * u) @ factors["down"][0]) @ factors["down"][1]

        delta = mean_nll(model, chunks, override) - base
        scales[layer] = delta / reference_losses[layer] if reference_losses[layer] > 0 else 0.0
        if progress is not None:
            progress(layer + 1, layers)
    floor = 1e-6 * max(float(scales.max()), 1e-12)
    return np.maximum(scales, floor)


def _interpolate(loss: np.ndarray, points: Sequence[tuple[float, float]]) -> np.ndarray:
    """Piecewise-linear NLL increase at each loss through (0, 0) and the measured (loss, increase) points,
    made non-decreasing; extrapolated with the last segment's slope beyond the last point."""
    xs, ys = [0.0], [0.0]
    for x, y in sorted(points):
        if x > xs[-1]:
            xs.append(x)
            ys.append(max(y, ys[-1]))
    if len(xs) == 1:
        return np.zeros_like(loss)
    out = np.interp(loss, xs, ys)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.where(loss > xs[-1], ys[-1] + slope * (loss - xs[-1]), out)


def scaled_losses(model, calibration, options: Sequence[tuple[int, int] | None], damping: float,
                  chunks: Sequence[np.ndarray] | None, references: Sequence[tuple[int, int]] = (),
                  progress: Callable[[int, int], None] | None = None) -> tuple[list[np.ndarray], np.ndarray, list]:
    """Per layer, the predicted NLL increase of every variant in ``options``: the whitened loss
    (:func:`.rank_choice.layer_losses`) mapped through the layer's measured NLL increases at the
    ``references`` variants and at the smallest ranks (piecewise linear in the loss, 0 at dense), on
    ``chunks`` of calibration tokens. Unmeasured (the loss itself) when ``chunks`` is None, e.g. for
    pre-captured activations. Also returns the measured increases [layers, points] and the per-layer
    whitenings (Cholesky factors, reusable by :func:`.whitening.whitened_svd`)."""
    from .rank_choice import layer_losses
    from .whitening import spectrum, whiten

    raw, whitenings = [], []
    for layer in range(model.arch.num_hidden_layers):
        white = {n: whiten(calibration.grams[layer][n], damping) for n in ("input", "inner")}
        whitenings.append({p: white["inner" if p == "down" else "input"] for p in PROJECTIONS})
        spectra = {p: spectrum(model.mlp_weight(layer, p), whitenings[layer][p][0]) for p in PROJECTIONS}
        raw.append(layer_losses(spectra, options))
    compressed = [o for o in options if o is not None]
    if chunks is None or not compressed:
        return raw, np.zeros((len(raw), 0)), whitenings
    points = sorted({*references, min(compressed)} & set(compressed))
    measured = np.zeros((len(raw), len(points)))
    for j, reference in enumerate(points):
        index = list(options).index(reference)
        measured[:, j] = layer_scales(model, calibration, chunks, reference, [loss[index] for loss in raw], damping,
                                      whitenings, progress) * np.array([loss[index] for loss in raw])
    out = []
    for layer, loss in enumerate(raw):
        at = [(float(loss[list(options).index(p)]), float(max(measured[layer, j], 0.0)))
              for j, p in enumerate(points)]
        out.append(_interpolate(loss, at))
    return out, measured, whitenings

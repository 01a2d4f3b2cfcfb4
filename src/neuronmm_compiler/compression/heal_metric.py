"""The metric the closed-form refit weighs gate's and up's errors by: how they reach the MLP's output.

Truncating gate or up to rank r keeps the directions of their own output that carry the most energy
(on the calibration inputs). But the MLP reads their outputs through ``silu(g) * u`` and then down:
an intermediate feature that down barely reads, or that the gate mostly closes, costs the model little,
however large it is. Weighing each projection's output error by its path to the MLP's output spends the
rank where the model loses most. Measured on SmolLM2-135M at rank 384 (benchmarks/results/compression-runs.md,
"Fifth run").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import expit

from ..checkpoints.config import PROJECTIONS
from .calibration import batch_gram
from .forward import silu

__all__ = ["original_mlp"]


def original_mlp(model, index: int, xs: Sequence[np.ndarray], metric_for: Sequence[str], *, outputs: bool,
                 stream: np.ndarray | None = None, every: int = 1) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """The original MLP of layer ``index`` on each healed input ``x~``: its outputs (when ``outputs``: down's
    targets), and for each projection in ``metric_for`` the metric its refit's errors are weighed by.

    How an error ``e`` in gate's or up's output reaches the MLP's output ``(silu(g) * u) Wd``: to first
    order ``(c * e) Wd`` with ``c = silu(g)`` for up and ``c = silu'(g) * u`` for gate, per token. Summed
    over tokens, ``sum_t e_t diag(c_t) Wd Wd^T diag(c_t) e_t^T``, which with ``e`` taken independent of
    ``c`` is ``sum_t e_t Q e_t^T`` with ``Q = (sum_t c_t^T c_t) * (Wd Wd^T)`` (elementwise: a Schur
    product of two positive semi-definite matrices, so itself one). The refit then minimises the MLP
    output's error instead of each projection's own, which spends the rank on the intermediate
    features down actually reads.

    ``stream`` (the residual stream's metric ``S``, :mod:`.fisher`) weighs the MLP output's error in turn:
    ``Wd S Wd^T`` replaces ``Wd Wd^T``. The metric's sums run over every ``every``-th input only (a weighting
    needs fewer tokens than the fit it weighs)."""
    if not metric_for and not outputs:
        return [], {}
    w = {p: model.mlp_weight(index, p) for p in PROJECTIONS}
    width = w["down"].shape[0]
    sums = {p: np.zeros((width, width)) for p in metric_for}
    wants = []
    for i, x in enumerate(xs):
        weigh = i % every == 0
        if not weigh and not outputs:
            continue
        g, u = x @ w["gate"], x @ w["up"]
        s = silu(g)
        if weigh and "up" in sums:
            sums["up"] += batch_gram(s)
        if weigh and "gate" in sums:
            sig = expit(g)
            sums["gate"] += batch_gram(sig * (1 + g * (1 - sig)) * u)
        if outputs:
            wants.append((s * u) @ w["down"])
    if not sums:
        return wants, {}
    down = np.asarray(w["down"], dtype=np.float64)
    k = down @ down.T if stream is None else down @ stream @ down.T
    return wants, {p: q * k for p, q in sums.items()}

"""How far to trust the cost model: predictions against published measurements, fitted and cross-validated.

The error of one prediction is ``|ln(predicted / measured)|`` (0.10 is about 10%, symmetric for over- and
under-prediction). :func:`assess` fits the model's estimated parameters to all rows of one hardware
target (in-sample) and, to say what that fit is worth on kernels it has not seen, refits it once per
source without that source's rows and predicts them (leave-one-source-out cross-validation). Within
each source it also checks that the model orders the source's variants as the measurements do
(Spearman rank correlation) and, since some sources measure variants that differ by less than their own
run-to-run spread, the share of pairs measured at least :data:`SEPARABLE` apart that it orders right.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..targets import Target
from .fit import fit_parameters, value_of
from .published import PublishedRow


@dataclass
class Prediction:
    row: PublishedRow
    measured_us: float
    default_us: float  # the shipped model
    fitted_us: float  # fitted on every row of the hardware
    held_out_us: float | None  # fitted without the row's source (None: too few other rows to fit)

    @staticmethod
    def error(predicted: float | None, measured: float) -> float | None:
        return None if predicted is None else abs(math.log(predicted / measured))


#: Measurements closer than this (relative) are not an order a model can be held to: one kernel profiled three
#: times in nki-autotune's notes spans 0.3% (364.9-366.0 us), its TRACE comparison reports 83.00 vs 83.06% MFU as
#: a tie, and the AWS guide's three blocked kernels, one profiled call each, lie within 0.7%. 2% is well above all.
SEPARABLE = 0.02


@dataclass
class SourceSummary:
    source_id: str
    rows: int
    median_error: float | None
    max_error: float | None
    spearman: float | None  # held-out predictions vs measurements (None: fewer than 3 variants)
    ordered_pairs: int = 0  # pairs of rows measured at least SEPARABLE apart
    ordered_right: int = 0  # of those, the pairs the held-out predictions order as measured (a tie is wrong)


@dataclass
class Assessment:
    hardware: str
    names: tuple[str, ...]
    fitted: dict[str, float]
    predictions: list[Prediction]
    sources: list[SourceSummary] = field(default_factory=list)

    def errors(self, which: str) -> list[float]:
        values = [Prediction.error(getattr(p, f"{which}_us"), p.measured_us) for p in self.predictions]
        return [v for v in values if v is not None]

    def summary(self, which: str) -> tuple[float, float, int]:
        """(median, max, rows) of the errors of the ``default``, ``fitted`` or ``held_out`` predictions."""
        values = self.errors(which)
        if not values:
            return math.nan, math.nan, 0
        return statistics.median(values), max(values), len(values)


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equal-length sequences (None for fewer than 3 values or a constant one)."""
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    if np.std(ra) == 0 or np.std(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def order_agreement(predicted: Sequence[float], measured: Sequence[float],
                    separable: float = SEPARABLE) -> tuple[int, int]:
    """(pairs measured at least ``separable`` apart, how many of them ``predicted`` orders the same way)."""
    pairs = right = 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            low, high = sorted((measured[i], measured[j]))
            if high < low * (1 + separable):
                continue
            pairs += 1
            right += (predicted[i] - predicted[j]) * (measured[i] - measured[j]) > 0
    return pairs, right


def _ranks(values: Sequence[float]) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    sorted_values = np.asarray(values)[order]
    i = 0
    while i < len(values):  # ties share their mean rank
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2
        i = j + 1
    return ranks


def _fit(rows: Sequence[PublishedRow], base: Target, names: Sequence[str]) -> Target | None:
    """``base`` fitted to ``rows`` on the parameters the rows determine (None: not enough rows)."""
    if len(rows) < 2:
        return None
    try:
        return fit_parameters(rows, [r.measured_us for r in rows], base, names).target  # type: ignore[arg-type]
    except InputError:  # underdetermined: fit the ones the rows do separate
        for count in range(len(names) - 1, 0, -1):
            try:
                return fit_parameters(rows, [r.measured_us for r in rows], base,  # type: ignore[arg-type]
                                      names[:count]).target
            except InputError:
                continue
    return None


def assess(rows: Sequence[PublishedRow], base: Target, names: Sequence[str]) -> Assessment:
    """Default, fitted and leave-one-source-out predictions of ``rows`` (all on ``base``'s hardware)."""
    if not rows:
        raise InputError(f"no published rows for {base.name}")
    fitted = _fit(rows, base, names) or base
    held: dict[int, float | None] = {}
    by_source: dict[str, list[PublishedRow]] = {}
    for row in rows:
        by_source.setdefault(row.source_id, []).append(row)
    for source, members in by_source.items():
        others = [r for r in rows if r.source_id != source]
        model = _fit(others, base, names)
        for row in members:
            held[id(row)] = row.predict_us(model) if model is not None else None
    predictions = [Prediction(r, r.measured_us, r.predict_us(base), r.predict_us(fitted), held[id(r)]) for r in rows]
    result = Assessment(base.name, tuple(names), {n: value_of(fitted, n) for n in names}, predictions)
    for source, members in sorted(by_source.items()):
        mine = [p for p in predictions if p.row.source_id == source]
        errors = [e for p in mine if (e := Prediction.error(p.held_out_us, p.measured_us)) is not None]
        pairs = [(p.held_out_us, p.measured_us) for p in mine if p.held_out_us is not None]
        predicted, measured = [a for a, _ in pairs], [b for _, b in pairs]
        rho = spearman(predicted, measured) if pairs else None
        separated, right = order_agreement(predicted, measured)
        result.sources.append(SourceSummary(source, len(members), statistics.median(errors) if errors else None,
                                            max(errors) if errors else None, rho, separated, right))
    return result

"""How far to trust the cost model's latencies: its measured error per target, said next to every prediction.

The error of a prediction is ``|ln(predicted / measured)|``. For each target, :data:`MODEL_ERROR` holds the
median and the worst error of the shipped model (the default parameters, which were not fitted to any of
these measurements, so the figures are out of sample) over the published measurements nmmc maps to its
schedules (``benchmarks/published/``, read by :mod:`neuronmm_compiler.calibration.published`;
``benchmarks/fidelity.py`` prints them as "default"). ``tests/test_trust.py`` recomputes them from the
dataset, so a change to the model or to the data that moves them fails until this table is updated.

A latency printed as ``70.4 us`` with ``typically within x1.52, worst x3.96`` means: on the published
kernels of that target, half of the model's predictions were within a factor 1.52 of the measured
latency and none was further off than a factor 3.96. A speedup is a ratio of two predictions on one
target; nothing here bounds its error more tightly. A target with no published measurement says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..targets import Target

#: ``benchmarks/published`` digest (sha256 of the CSV files in name order, first 16 hex digits) the
#: figures below were computed from.
DATASET_DIGEST = "43d033c6620be9dc"


@dataclass(frozen=True)
class ModelError:
    """The shipped model's error on one target's published measurements."""

    target: str
    median_abs_log: float
    max_abs_log: float
    rows: int
    sources: int

    def describe(self) -> str:
        """``typically within x1.52, worst x3.96 of 11 published trn1 measurements (3 sources)``."""
        return (f"typically within x{math.exp(self.median_abs_log):.2f}, worst x{math.exp(self.max_abs_log):.2f} "
                f"of {self.rows} published {self.target} measurements ({self.sources} sources)")

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "typical_factor": math.exp(self.median_abs_log),
                "worst_factor": math.exp(self.max_abs_log), "dataset": DATASET_DIGEST}


MODEL_ERROR: dict[str, ModelError] = {
    "trn1": ModelError("trn1", median_abs_log=0.4179, max_abs_log=1.3751, rows=11, sources=3),
    "trn2": ModelError("trn2", median_abs_log=0.2226, max_abs_log=0.4149, rows=9, sources=2),
}


def trust_note(target: Target) -> str:
    """One line saying how far the model's latencies on ``target`` are from measured ones."""
    if target.calibration is not None:
        cal = target.calibration
        return (f"calibrated on {cal.rows} measurements of {cal.measurements}: RMS error "
                f"{cal.rms_rel_error_after:.0%} in-sample")
    entry = MODEL_ERROR.get(target.name)
    if entry is None:
        return f"not validated: no published {target.name} measurement to compare with"
    return entry.describe()


def trust_dict(target: Target) -> dict[str, object]:
    """:func:`trust_note` as JSON: the figures, or why there are none."""
    entry = MODEL_ERROR.get(target.name) if target.calibration is None else None
    return {"note": trust_note(target), **(entry.as_dict() if entry is not None else {})}

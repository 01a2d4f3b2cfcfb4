"""How far to trust the cost model's latencies: its measured error per target, said next to every prediction.

The error of a prediction is ``|ln(predicted / measured)|``. For each target, :data:`MODEL_ERROR` holds the
median and the worst error of the shipped model over the published measurements nmmc maps to its schedules
(``benchmarks/published/``, read by :mod:`neuronmm_compiler.calibration.published`), as
``benchmarks/fidelity.py`` measures them (``benchmarks/results/fidelity-*.json``):

- where the shipped parameters were fitted to that target's rows (trn2), the figures are the
  leave-one-source-out ones ("held_out": each source predicted by the model fitted without it), since the
  in-sample error of a fit says little about kernels it has not seen;
- where they were not (trn1: the published chart and AWS's figures, plus trn2's launch cost), the shipped
  model's own error ("default"), which is out of sample.

``tests/test_trust.py`` checks this table against the committed results and recomputes the shipped model's
in-sample error from the dataset, so a change to the model or the data that moves them fails until
fidelity.py is rerun and this table updated.

A latency printed as ``70.4 us`` with ``typically within x1.53, worst x3.96`` means: on the published
kernels of that target, half of the model's predictions were within a factor 1.53 of the measured
latency and none was further off than a factor 3.96. A speedup is a ratio of two predictions on one
target; nothing here bounds its error more tightly. A target with no published measurement says so.

Every published measurement is of a GEMM kernel: no fused SVD chain or MLP kernel has been measured,
so the figures are said as validated on GEMMs only wherever a fused workload's latency is printed
(``fused=True``). The docs quote these figures as :func:`figures` spells them (``typically x1.53, worst
x3.96``); ``tests/test_trust.py`` keeps every such quote equal to this table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..targets import Target

#: ``benchmarks/published`` digest (sha256 of the CSV files in name order, first 16 hex digits) the
#: figures below were computed from.
DATASET_DIGEST = "5399a77367764503"
#: The benchmarks/fidelity.py results the figures below are taken from.
RESULTS = "benchmarks/results/fidelity-2026-11-30-v3.json"


@dataclass(frozen=True)
class ModelError:
    """The shipped model's error on one target's published measurements."""

    target: str
    median_abs_log: float
    max_abs_log: float
    rows: int
    sources: int
    basis: str  # "held_out" (the shipped parameters were fitted to these rows) or "default" (they were not)

    @property
    def typical(self) -> str:
        """The typical factor as printed, e.g. ``x1.53``."""
        return f"x{math.exp(self.median_abs_log):.2f}"

    @property
    def worst(self) -> str:
        """The worst factor as printed, e.g. ``x3.96``."""
        return f"x{math.exp(self.max_abs_log):.2f}"

    def describe(self) -> str:
        """``typically within x1.53, worst x3.96 of 11 published trn1 measurements (3 sources)``, saying
        when the figures are cross-validated."""
        how = ", cross-validated" if self.basis == "held_out" else ""
        return (f"typically within {self.typical}, worst {self.worst} "
                f"of {self.rows} published {self.target} measurements ({self.sources} sources{how})")

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "typical_factor": math.exp(self.median_abs_log),
                "worst_factor": math.exp(self.max_abs_log), "dataset": DATASET_DIGEST, "results": RESULTS}


MODEL_ERROR: dict[str, ModelError] = {
    "trn1": ModelError("trn1", median_abs_log=0.4222, max_abs_log=1.3757, rows=11, sources=3, basis="default"),
    "trn2": ModelError("trn2", median_abs_log=0.0393, max_abs_log=0.1591, rows=33, sources=3, basis="held_out"),
}


#: Where each stock target's estimated parameters come from (``nmmc targets`` prints it).
PROVENANCE: dict[str, str] = {
    "trn1": "AWS's published figures (DMA chart as published); launch_overhead_us assumed from trn2's fit",
    "trn2": f"launch_overhead_us, dma_size_scale, tensor_engine_efficiency, dma_fixed_cost_us fitted to the "
            f"published trn2 measurements (dataset {DATASET_DIGEST}, benchmarks/fidelity.py)",
    "trn3": "trn2's fitted values assumed (no published trn3 measurement)",
}


def model_error(target: Target) -> ModelError | None:
    """The published-measurement error of a stock target's model (None: a calibrated target, whose own fit
    says how far to trust it, or a target with no published measurement)."""
    return MODEL_ERROR.get(target.name) if target.calibration is None else None


def typical_range(latency_us: float, target: Target) -> tuple[float, float] | None:
    """The band a latency prediction on ``target`` typically falls in (its typical error factor either side;
    half the published measurements were inside it), or None where the model is not validated."""
    entry = model_error(target)
    if entry is None:
        return None
    factor = math.exp(entry.median_abs_log)
    return latency_us / factor, latency_us * factor


#: What the published measurements behind :data:`MODEL_ERROR` are of, said next to a fused workload's figures.
FUSED_CAVEAT = "validated on GEMMs; fused kernels not measured"
#: What the band does not cover on a logical core: every published measurement ran on one physical core.
LNC_CAVEAT = "LNC=2 adds an assumed HBM share and exchange cost, no LNC=2 kernel measured (docs/logical-cores.md)"


def figures(target_name: str) -> str:
    """A stock target's error as the docs quote it: ``typically x1.53, worst x3.96``."""
    entry = MODEL_ERROR[target_name]
    return f"typically {entry.typical}, worst {entry.worst}"


def trust_note(target: Target, fused: bool = False) -> str:
    """One line saying how far the model's latencies on ``target`` are from measured ones; ``fused``:
    the latencies are of fused kernels, which the published (GEMM) measurements do not cover."""
    if target.calibration is not None:
        cal = target.calibration
        return (f"calibrated on {cal.rows} measurements of {cal.measurements}: RMS error "
                f"{cal.rms_rel_error_after:.0%} in-sample")
    entry = model_error(target)
    lnc = f"; {LNC_CAVEAT}" if target.lnc > 1 else ""
    if entry is None:
        return f"not validated: no published {target.name} measurement to compare with{lnc}"
    measured = "; measured on one physical core" if lnc else ""
    return entry.describe() + (f"; {FUSED_CAVEAT}" if fused else "") + measured + lnc


def trust_dict(target: Target, fused: bool = False) -> dict[str, object]:
    """:func:`trust_note` as JSON: the figures, or why there are none (and, for a fused workload with
    published figures, that they are of GEMM kernels: ``validated_on``)."""
    entry = model_error(target)
    data: dict[str, object] = {"note": trust_note(target, fused), **(entry.as_dict() if entry is not None else {})}
    if entry is not None and fused:
        data["validated_on"] = "gemm"
    if target.lnc > 1:
        data["lnc"] = target.lnc
        data["validated_lnc"] = 1
    return data

"""``nmmc calibrate``: read the measurements, rebuild every kernel, fit, report, make the target."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..targets import Calibration, Target
from .fit import DEFAULT_FIT, FitResult, fit_parameters, rms_rel_error
from .kernels import KernelFile, read_kernel_file
from .measurements import Measurement, read_measurements


@dataclass
class CalibrationReport:
    """The fit over one measurements file and the calibrated target it produced."""

    measurements: list[Measurement]
    kernels: list[KernelFile]
    fit: FitResult
    base: Target
    target: Target

    @property
    def measured(self) -> list[float]:
        return [m.latency_us for m in self.measurements]

    @property
    def rms_before(self) -> float:
        return rms_rel_error(self.fit.predicted_before, self.measured)

    @property
    def rms_after(self) -> float:
        return rms_rel_error(self.fit.predicted_after, self.measured)

    def rows(self) -> list[dict[str, Any]]:
        """Per measurement: where, which kernel, measured and predicted latencies, relative errors."""
        out = []
        for m, before, after in zip(self.measurements, self.fit.predicted_before, self.fit.predicted_after,
                                    strict=True):
            out.append({"line": m.line, "kernel": m.kernel, "measured_us": m.latency_us,
                        "predicted_before_us": before, "predicted_after_us": after,
                        "rel_error_before": (before - m.latency_us) / m.latency_us,
                        "rel_error_after": (after - m.latency_us) / m.latency_us})
        return out

    def parameters(self) -> dict[str, dict[str, Any]]:
        return {n: {"before": self.fit.start[n], "after": self.fit.values[n], "std_rel": self.fit.std_rel[n],
                    "determined": n not in self.fit.undetermined} for n in self.fit.names}

    def as_dict(self) -> dict[str, Any]:
        cal = self.target.calibration
        return {"base_target": self.base.spec, "output": cal.source if cal else None,
                "rms_rel_error_before": self.rms_before, "rms_rel_error_after": self.rms_after,
                "iterations": self.fit.iterations, "converged": self.fit.converged,
                "parameters": self.parameters(), "undetermined": list(self.fit.undetermined), "rows": self.rows()}

    def lines(self) -> list[str]:
        """The human-readable report."""
        out = [f"calibrated {self.base.label} against {len(self.measurements)} measurements "
               f"({self.fit.iterations} model evaluations of the least-squares fit"
               + ("" if self.fit.converged else ", stopped at the evaluation limit") + ")"]
        out.append("parameters:")
        for name, p in self.parameters().items():
            if p["determined"]:
                err = "" if p["std_rel"] is None else f"  (±{p['std_rel']:.1%})"
                out.append(f"  {name:<26} {p['before']:>10.4g} -> {p['after']:<10.4g}{err}")
            else:
                kept = " (kept)" if p["after"] == p["before"] else f" -> {p['after']:.4g}"
                out.append(f"  {name:<26} {p['before']:>10.4g}    not determined by these measurements{kept}")
        width = max(len(m.kernel) for m in self.measurements)
        out.append("measurements:")
        out.append(f"  {'line':>4}  {'kernel':<{width}}  {'measured':>10}  {'before':>10}  {'after':>10}  "
                   f"{'error before':>12}  {'error after':>11}")
        for r in self.rows():
            out.append(f"  {r['line']:>4}  {r['kernel']:<{width}}  {r['measured_us']:>10.2f}  "
                       f"{r['predicted_before_us']:>10.2f}  {r['predicted_after_us']:>10.2f}  "
                       f"{r['rel_error_before']:>+12.1%}  {r['rel_error_after']:>+11.1%}")
        out.append(f"RMS relative error {self.rms_before:.1%} -> {self.rms_after:.1%} (latencies in us)")
        return out


def load_measured_kernels(csv_path: str | Path, target: Target) -> tuple[list[Measurement], list[KernelFile]]:
    """Read the CSV and every kernel file it names (each read once), checked against ``target``'s
    hardware and the rows' ``kernel_sha256``; InputError naming the CSV line on the first problem."""
    measurements = read_measurements(csv_path)
    cache: dict[Path, KernelFile] = {}
    kernels = []
    for m in measurements:
        where = f"{csv_path}:{m.line}"
        key = m.path.resolve()
        if key not in cache:
            try:
                cache[key] = read_kernel_file(m.path, shown=m.kernel)
            except InputError as exc:
                raise InputError(f"{where}: {exc}") from None
        kernel = cache[key]
        if kernel.target_name != target.name:
            raise InputError(f"{where}: {m.kernel} was emitted for {kernel.target_name}, but this calibrates "
                             f"{target.name} (calibrate each target from its own measurements)")
        if m.kernel_sha256 is not None and m.kernel_sha256.lower() != kernel.sha256:
            raise InputError(f"{where}: {m.kernel} changed since it was measured (its sha256 is "
                             f"{kernel.sha256[:12]}..., the row says {m.kernel_sha256[:12]}...)")
        kernels.append(kernel)
    return measurements, kernels


def calibrate(csv_path: str | Path, base: Target, *, output: str, fit: Sequence[str] = DEFAULT_FIT,
              max_iter: int = 100) -> CalibrationReport:
    """Fit ``fit`` (parameter names) of ``base`` to the measurements in ``csv_path``; the report's
    ``target`` is the calibrated target, recording ``output`` as the file it is to be written to."""
    if max_iter < 1:
        raise InputError(f"--max-iter must be at least 1; got {max_iter}")
    measurements, kernels = load_measured_kernels(csv_path, base)
    measured = [m.latency_us for m in measurements]
    result = fit_parameters(kernels, measured, base, fit, max_iter=max_iter)
    calibration = Calibration(source=output, measurements=str(csv_path), rows=len(measurements),
                              rms_rel_error_before=rms_rel_error(result.predicted_before, measured),
                              rms_rel_error_after=rms_rel_error(result.predicted_after, measured),
                              date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              fitted=tuple(result.determined))
    # the fit's target already carries the fitted fields and parameters (in range by construction)
    return CalibrationReport(measurements, kernels, result, base, replace(result.target, calibration=calibration))

"""``nmmc bench``: measure an emitted kernel file on a Neuron device, next to the cost model's
prediction, and record the measurement as a row ``nmmc calibrate`` reads.

Each kernel of the file is timed on its own, by the route the installed SDK documents
(:mod:`.bench_routes`: ``nki.benchmark`` where the package has it, else ``neuron-explorer capture``),
on random inputs of its declared shapes and dtypes: values do not change a kernel's latency. The file's
latency is the sum over its kernels, as the cost model adds them; the p10/p90 columns are the sums
of the kernels' percentiles (an approximation of the file's, exact for a single kernel).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..cost_model import estimate
from ..errors import InputError, NmmcError
from ..targets import Target, get_target
from ..verification import random_inputs
from ..verification.nki_backend import KernelModule
from .bench_routes import BENCHMARK, Route, choose_route, time_kernel
from .kernels import KernelFile, read_kernel_file
from .measurements import relative_to_csv


@dataclass
class KernelTiming:
    """One kernel's measured percentiles and predicted latency (us)."""

    name: str
    p10_us: float
    median_us: float
    p90_us: float
    predicted_us: float


@dataclass
class BenchReport:
    """The measurements of one kernel file."""

    kernel_file: KernelFile = field(repr=False)
    target: Target
    warmup: int
    iters: int
    kernels: list[KernelTiming]
    route: Route = field(repr=False)
    measured_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def total(self, name: str) -> float:
        return sum(getattr(k, name) for k in self.kernels)

    @property
    def rel_error(self) -> float:
        """(predicted - measured median) / measured median, over the whole file."""
        return (self.total("predicted_us") - self.total("median_us")) / self.total("median_us")

    def csv_values(self, csv_path: str | Path) -> dict[str, Any]:
        """The row ``--append-csv`` adds (columns of measurements.BENCH_COLUMNS)."""
        return {"kernel": relative_to_csv(self.kernel_file.path, csv_path), "latency_us": self.total("median_us"),
                "p10_us": self.total("p10_us"), "p90_us": self.total("p90_us"),
                "predicted_us": self.total("predicted_us"), "warmup": self.warmup, "iters": self.iters,
                "kernel_sha256": self.kernel_file.sha256, "measured_at": self.measured_at, "host": socket.gethostname()}

    def as_dict(self) -> dict[str, Any]:
        return {"kernel_file": self.kernel_file.path, "dialect": self.kernel_file.dialect, "target": self.target.spec,
                "route": self.route.name, "warmup": self.warmup, "iters": self.iters, "measured_at": self.measured_at,
                "kernels": [vars(k) for k in self.kernels],
                "latency_us": self.total("median_us"), "p10_us": self.total("p10_us"), "p90_us": self.total("p90_us"),
                "predicted_us": self.total("predicted_us"), "rel_error": self.rel_error}

    def lines(self) -> list[str]:
        width = max(len("total"), *(len(k.name) for k in self.kernels))
        out = [f"{self.kernel_file.path} ({self.kernel_file.dialect}) on {self.target.label}",
               f"  timed with {self.route.describe(self.warmup, self.iters)}",
               f"  {'kernel':<{width}}  {'median us':>10}  {'p10 us':>10}  {'p90 us':>10}  {'predicted us':>12}  "
               f"{'error':>7}"]
        rows = [(k.name, k.median_us, k.p10_us, k.p90_us, k.predicted_us) for k in self.kernels]
        if len(self.kernels) > 1:
            rows.append(("total", self.total("median_us"), self.total("p10_us"), self.total("p90_us"),
                         self.total("predicted_us")))
        for name, median, p10, p90, predicted in rows:
            out.append(f"  {name:<{width}}  {median:>10.2f}  {p10:>10.2f}  {p90:>10.2f}  {predicted:>12.2f}  "
                       f"{(predicted - median) / median:>+7.1%}")
        return out


def bench_file(path: str | Path, *, warmup: int = 10, iters: int = 100, target: Target | None = None,
               seed: int = 0) -> BenchReport:
    """Time every kernel of the file at ``path`` on this host's Neuron device (see the module docstring);
    ``target`` (default: the file's) makes the predictions. ``iters`` is recorded as 1 on the neuron-explorer
    route, which times one run."""
    if warmup < 0 or iters < 1:
        raise InputError(f"--warmup must be >= 0 and --iters >= 1; got {warmup} and {iters}")
    kernel_file = read_kernel_file(path)
    tgt = target or get_target(kernel_file.target_name)
    if tgt.name != kernel_file.target_name:
        raise InputError(f"{path} was emitted for {kernel_file.target_name}, not {tgt.name}")
    route = choose_route(kernel_file.dialect)
    module = KernelModule(kernel_file.source, str(path))
    timings = []
    for spec, program in zip(kernel_file.metadata.kernels, kernel_file.programs, strict=True):
        args = list(random_inputs(spec.inputs, seed).values())
        try:
            measured = time_kernel(route, module.function(spec.name), args, warmup=warmup, iters=iters,
                                   target=tgt.name)
        except NmmcError:
            raise
        except Exception as exc:
            raise NmmcError(f"benchmarking {spec.name} failed: {type(exc).__name__}: {exc}") from exc
        if not all(v > 0 for v in measured.values()):
            raise NmmcError(f"benchmarking {spec.name} returned non-positive latencies {measured}")
        timings.append(KernelTiming(spec.name, measured[10], measured[50], measured[90],
                                    estimate(program, tgt).latency_us))
    return BenchReport(kernel_file, tgt, warmup, iters if route.name == BENCHMARK else 1, timings, route)

"""Published hardware measurements (``benchmarks/published/*.csv``) as cost-model test data.

Each row of the dataset is one figure a public source measured for an NKI matmul-type kernel, with
how it maps to an nmmc workload and schedule (see ``benchmarks/published/README.md`` for the columns).
:func:`load_rows` reads the CSVs; :class:`PublishedRow` compiles its schedule into programs (no kernel
is emitted) and predicts its latency on any target, so the calibration fit
(:func:`~neuronmm_compiler.calibration.fit.fit_parameters`) and ``benchmarks/fidelity.py`` can use
published rows as they use measured kernel files. A row whose schedule nmmc cannot express
(``unmapped``) or whose unit is not a time or a rate is kept out, with the reason.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..cost_model import combine_reports, estimate
from ..errors import InputError, NmmcError
from ..frontends.workloads import Workload, chain_workload, gemm_workload, mlp_workload
from ..kernel_ir.program import Program
from ..targets import Target, get_target

COLUMNS = ("source_id", "source", "hardware", "kernel", "m", "n", "k", "rank", "dtype", "a_layout", "workload",
           "schedule", "value", "unit", "notes")
#: Units of a latency, in microseconds.
TIME_UNITS = {"us": 1.0, "ms": 1000.0, "s": 1e6}
#: Units of a rate, converted to a latency through the workload's FLOPs.
RATE_UNITS = {"tflops": 1e12, "gflops": 1e9}
#: Model FLOPs utilisation in percent: a latency through the workload's FLOPs and the target's bf16 peak
#: (only for 2-byte dtypes, whose peak that is). Hardware FLOPs utilisation and engine activity are not
#: used: the sources publish them beside the latency of the same run.
MFU_UNIT = "percent_mfu"
#: The ``schedule`` of a row that measured the best kernel of a source's own search (an autotuner's
#: sweep whose winning configuration is not fully published): it is compared with nmmc's best, the
#: fastest under the assessed model of the TUNED_KEEP schedules nmmc's search ranks first (TUNED_TRIALS
#: trials, seed 0, shipped model).
TUNED = "tuned"
TUNED_TRIALS = 150
TUNED_KEEP = 8


@dataclass
class PublishedRow:
    """One published measurement, mapped to an nmmc workload and schedule."""

    source_id: str
    source: str
    hardware: str
    kernel: str
    workload: Workload
    preset: str | None
    params: dict[str, str]
    value: float
    unit: str
    line: int
    programs: list[Program] = field(default_factory=list, repr=False)
    #: A ``tuned`` row: the programs of each of nmmc's best schedules (its search under the shipped model);
    #: the prediction is the fastest of them under the model being assessed.
    alternatives: list[list[Program]] = field(default_factory=list, repr=False)

    @property
    def tuned(self) -> bool:
        """The source measured the best kernel of its own search; it is compared with nmmc's best."""
        return self.preset == TUNED

    @property
    def label(self) -> str:
        return f"{self.source_id}: {self.kernel} ({self.workload.describe()}, {self.hardware})"

    def compile(self, target: Target) -> None:
        """Lower the row's schedule for ``target`` (once; the programs do not depend on model parameters)."""
        from ..driver import cost_workload, lower_graph, lower_programs, tune
        from ..lowerings import lowering_for

        if self.programs:
            return
        if not self.tuned:
            self.programs = cost_workload(self.workload, target=target, preset=self.preset,
                                          params=self.params).programs
            return
        found = tune(self.workload, target=target, trials=TUNED_TRIALS, seed=0, top_k=TUNED_KEEP)
        lowering = lowering_for(self.workload)
        self.alternatives = [lower_programs(lowering, lower_graph(self.workload, lowering, c.schedule), c.schedule,
                                            target) for c in found.search.top]
        self.programs = self.alternatives[0]

    def flops(self) -> int:
        return sum(estimate(p, get_target(self.hardware)).flops for p in self.programs)

    @cached_property
    def measured_us(self) -> float:
        """The measured latency in microseconds (a rate is turned into one through the workload's FLOPs);
        computed once, after :meth:`compile` (the fit reads it for every refit)."""
        unit = self.unit.lower()
        if unit in TIME_UNITS:
            return self.value * TIME_UNITS[unit]
        if unit == MFU_UNIT:
            peak = get_target(self.hardware).peak_bf16_tflops * 1e12
            return self.flops() / (peak * self.value / 100) * 1e6
        return self.flops() / (self.value * RATE_UNITS[unit]) * 1e6

    def predict_us(self, target: Target) -> float:
        """The cost model's latency of the row's kernels on ``target`` (run one after another); for a
        ``tuned`` row, of the fastest of nmmc's best schedules."""
        return min(combine_reports([estimate(p, target) for p in programs]).latency_us
                   for programs in (self.alternatives or [self.programs]))


@dataclass
class Dataset:
    """The rows nmmc can predict, the ones it cannot (with why), and a digest of the files read."""

    rows: list[PublishedRow]
    skipped: list[tuple[str, str]]
    digest: str

    def sources(self) -> list[str]:
        return sorted({r.source_id for r in self.rows})


def _workload(spec: str, m: int, n: int, k: int, rank: str, dtype: str, a_layout: str) -> Workload:
    kind, _, rest = spec.partition(":")
    if kind == "gemm":
        return gemm_workload(m, n, k, dtype=dtype, a_layout=a_layout or "mk")
    if kind == "chain":
        return chain_workload(m, n, k, rank=int(rank), dtype=dtype, a_layout=a_layout or "mk")
    if kind == "mlp":
        fields_ = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
        dense = "dense" in rest.split(",")
        ranks = tuple(int(r) for r in fields_["ranks"].split("/")) if "ranks" in fields_ else None
        return mlp_workload(int(fields_["tokens"]), int(fields_["hidden"]), int(fields_["intermediate"]),
                            ranks=ranks, dense=dense, dtype=dtype)
    raise InputError(f"unknown workload {spec!r} (gemm, chain, mlp:...)")


def _schedule(spec: str) -> tuple[str | None, dict[str, str]]:
    name, *overrides = [part.strip() for part in spec.split(";") if part.strip()]
    params = dict(item.split("=", 1) for item in overrides)
    return (None if name == "default" else name), params


def _read(path: Path) -> Iterable[tuple[int, dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise InputError(f"{path}: the header must be {','.join(COLUMNS)}")
        yield from enumerate(reader, start=2)


def load_rows(directory: str | Path, *, hardware: Iterable[str] | None = None) -> Dataset:
    """Every mappable row of the CSVs in ``directory`` (only the given hardware, when named), compiled for
    its own hardware. Rows that cannot be predicted are listed in ``skipped`` with the reason."""
    files = sorted(Path(directory).glob("*.csv"))
    if not files:
        raise InputError(f"no published measurements (*.csv) in {directory}")
    wanted = set(hardware) if hardware is not None else None
    digest = hashlib.sha256()
    rows: list[PublishedRow] = []
    skipped: list[tuple[str, str]] = []
    for path in files:
        digest.update(path.read_bytes())
        for number, raw in _read(path):
            where = f"{path.name}:{number}"
            if wanted is not None and raw["hardware"] not in wanted:
                continue
            unit = raw["unit"].strip().lower()
            if raw["schedule"].strip() == "unmapped":
                skipped.append((where, "unmapped: " + raw["notes"]))
                continue
            if unit not in TIME_UNITS and unit not in RATE_UNITS and unit != MFU_UNIT:
                skipped.append((where, f"unit {raw['unit']!r} is neither a time, a rate nor MFU"))
                continue
            if unit == MFU_UNIT and raw["dtype"].strip() not in ("bfloat16", "float16"):
                skipped.append((where, f"MFU of a {raw['dtype']} kernel (the target's peak is the bf16 one)"))
                continue
            if "same measurement as" in raw["notes"]:
                skipped.append((where, "another row holds the same measurement"))
                continue
            try:
                workload = _workload(raw["workload"].strip(), int(raw["m"] or 0), int(raw["n"] or 0),
                                     int(raw["k"] or 0), raw["rank"].strip(), raw["dtype"].strip(),
                                     raw["a_layout"].strip())
                preset, params = _schedule(raw["schedule"])
                row = PublishedRow(raw["source_id"], raw["source"], raw["hardware"], raw["kernel"], workload, preset,
                                   params, float(raw["value"]), unit, number)
                row.compile(get_target(raw["hardware"]))
            except (NmmcError, ValueError, KeyError) as exc:
                skipped.append((where, f"cannot map: {exc}"))
                continue
            if not (math.isfinite(row.value) and row.value > 0):
                skipped.append((where, f"value {raw['value']!r} is not a positive number"))
                continue
            rows.append(row)
    return Dataset(rows, skipped, digest.hexdigest()[:16])

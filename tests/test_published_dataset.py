"""The published-measurements dataset (benchmarks/published/*.csv): well-formed, pinned to its sources,
and every row that names an nmmc schedule compiles (or, where noted, costs) under that schedule."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pytest

from neuronmm_compiler.driver import compile_workload, cost_workload
from neuronmm_compiler.errors import ScheduleError
from neuronmm_compiler.frontends.workloads import chain_workload, gemm_workload, mlp_workload
from neuronmm_compiler.schedule.gemm import PRESETS
from neuronmm_compiler.targets import get_target

DATASET = Path(__file__).resolve().parents[1] / "benchmarks" / "published"
HEADER = ["source_id", "source", "hardware", "kernel", "m", "n", "k", "rank", "dtype", "a_layout", "workload",
          "schedule", "value", "unit", "notes"]
HARDWARE = {"trn1", "trn2", "trn3"}
DTYPES = {"bfloat16", "float32", "float16"}
A_LAYOUTS = {"mk", "km"}
UNITS = {"s", "ms", "us", "percent_hfu", "percent_mfu", "percent_mbu", "percent_tensore_active",
         "percent_dma_active", "percent_vectore_active", "percent_gpsimd_active", "ms_tensore_active",
         "ms_dma_active"}
#: rows whose schedule does not fit nmmc's capacity accounting say so with this phrase; they are costed only
COST_ONLY = "cost_workload only"
PINNED_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+@[0-9a-f]{40}:\S")
URL = re.compile(r"^https?://\S+")


def _files() -> list[Path]:
    return sorted(DATASET.glob("*.csv"))


def _rows() -> list[tuple[str, dict[str, str]]]:
    rows = []
    for path in _files():
        with path.open(newline="") as handle:
            rows += [(path.name, row) for row in csv.DictReader(handle)]
    return rows


ROWS = _rows()


def _positive_int(text: str) -> int:
    value = int(text)
    assert value > 0
    return value


def _workload(row: dict[str, str]):
    m, n, k = (_positive_int(row[key]) for key in ("m", "n", "k"))
    kind = row["workload"]
    if kind == "gemm":
        return gemm_workload(m, n, k, dtype=row["dtype"], a_layout=row["a_layout"])
    if kind == "chain":
        return chain_workload(m, n, k, rank=_positive_int(row["rank"]), dtype=row["dtype"], a_layout=row["a_layout"])
    if kind.startswith("mlp:"):
        parts = kind[len("mlp:"):].split(",")
        fields = dict(part.split("=", 1) for part in parts if "=" in part)
        ranks = tuple(int(r) for r in fields["ranks"].split("/")) if "ranks" in fields else None
        return mlp_workload(int(fields["tokens"]), int(fields["hidden"]), int(fields["intermediate"]), ranks=ranks,
                            dense="dense" in parts, dtype=row["dtype"])
    raise AssertionError(f"unknown workload {kind!r}")


def _schedule(text: str) -> tuple[str | None, dict[str, str | int]]:
    name, *overrides = text.split(";")
    params: dict[str, str | int] = {}
    for item in overrides:
        key, value = item.split("=", 1)
        params[key] = int(value) if value.isdigit() else value
    return (None if name == "default" else name), params


def test_every_file_has_the_header():
    assert _files(), "no CSV under benchmarks/published"
    for path in _files():
        with path.open(newline="") as handle:
            assert next(csv.reader(handle)) == HEADER, path.name


def test_size_sources_and_hardware():
    assert len(ROWS) >= 40
    assert len(_files()) >= 4
    assert len({row["source"].split("@")[0].split(":")[0] for _, row in ROWS}) >= 3, "distinct repositories/sites"
    hardware = {row["hardware"] for _, row in ROWS}
    assert {"trn1", "trn2"} <= hardware
    mapped = {row["hardware"] for _, row in ROWS if row["schedule"] != "unmapped"}
    assert {"trn1", "trn2"} <= mapped


def test_source_id_names_the_file():
    """``source_id`` identifies the source (one per CSV), so leave-one-source-out can group rows by it."""
    for name, row in ROWS:
        assert row["source_id"] == name.removesuffix(".csv")
    assert len({row["source_id"] for _, row in ROWS}) >= 4


@pytest.mark.parametrize(("name", "row"), ROWS, ids=[f"{row['source_id']}-{i}" for i, (_, row) in enumerate(ROWS)])
def test_row_is_well_formed(name, row):
    assert row["hardware"] in HARDWARE
    assert row["dtype"] in DTYPES
    assert row["a_layout"] in A_LAYOUTS
    assert row["unit"] in UNITS
    value = float(row["value"])
    assert math.isfinite(value) and value > 0
    if row["unit"].startswith("percent_"):
        assert value <= 100
    source = row["source"]
    assert PINNED_REPO.match(source) or URL.match(source), source
    assert row["kernel"].strip() and row["notes"].strip()
    for key in ("m", "n", "k"):
        _positive_int(row[key])
    if row["rank"]:
        _positive_int(row["rank"])
    if row["schedule"] == "unmapped":
        assert "unmapped:" in row["notes"], "say why it is unmapped (and which nmmc knob is missing)"
    elif row["schedule"] == "tuned":  # the best of a source's own search, compared with nmmc's best
        assert row["notes"].startswith("tuned:"), "say why the row is compared with nmmc's best schedule"
        assert row["unit"] in ("s", "ms", "us")
    else:
        name_, _ = _schedule(row["schedule"])
        if row["workload"] == "gemm":
            assert name_ in PRESETS


#: rows naming a schedule (``tuned`` rows are searched when the dataset is loaded: tests/test_trust.py)
MAPPED = [(name, row) for name, row in ROWS if row["schedule"] not in ("unmapped", "tuned")]
#: a mapped configuration repeats across rows (latency, utilisation, ...): compile each once
CONFIGS = sorted({(row["hardware"], row["m"], row["n"], row["k"], row["rank"], row["dtype"], row["a_layout"],
                   row["workload"], row["schedule"], COST_ONLY in row["notes"]) for _, row in MAPPED})


@pytest.mark.parametrize("config", CONFIGS, ids=["/".join(c[:4] + c[5:9]) for c in CONFIGS])
def test_mapped_schedule_compiles(config):
    hardware, m, n, k, rank, dtype, a_layout, workload, schedule, cost_only = config
    row = dict(m=m, n=n, k=k, rank=rank, dtype=dtype, a_layout=a_layout, workload=workload)
    target = get_target(hardware)
    preset, params = _schedule(schedule)
    try:
        compiled = compile_workload(_workload(row), target=target, preset=preset, params=params)
    except ScheduleError:
        # it does not fit nmmc's capacity accounting: allowed only where the notes say so, and it must still cost
        assert cost_only, f"{schedule} does not fit on {hardware}: say '{COST_ONLY}' in the notes or change it"
        costed = cost_workload(_workload(row), target=target, preset=preset, params=params)
        assert costed.cost.latency_us > 0
    else:
        assert compiled.cost.latency_us > 0

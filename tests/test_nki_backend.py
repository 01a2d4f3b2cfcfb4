"""AWS's NKI toolchain behind ``verify --backend nki-simulator`` and ``nmmc bench``: dispatch to each
dialect's API (exercised with stand-in modules whose simulator is nmmc's interpreter and whose
benchmark returns set latencies), and one clear error when a package or the device is missing."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import compile_gemm, compile_graph
from neuronmm_compiler.calibration import bench_routes
from neuronmm_compiler.calibration.kernels import read_kernel_file
from neuronmm_compiler.calibration.measurements import BENCH_COLUMNS, read_measurements
from neuronmm_compiler.cli import main
from neuronmm_compiler.cost_model import estimate
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.interpreter import run_kernel
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source

TRN1 = get_target("trn1")
#: nki-dialect files are emitted for trn2: nmmc verify checks the NKI rules, and NKI 0.3+ kernels are documented as
#: unsupported on trn1 (NKI-DIALECT-TRN1).
TRN2 = get_target("trn2")
MODULES = {"nki": ("nki", "nki.isa", "nki.language"),
           "neuronxcc": ("neuronxcc", "neuronxcc.nki", "neuronxcc.nki.isa", "neuronxcc.nki.language")}


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def interpret(fn, *args):
    """A stand-in simulator: run the kernel function's file in nmmc's interpreter."""
    path = fn.__code__.co_filename
    result = run_kernel(Path(path).read_text(), filename=path, kernel_name=fn.__name__, args=list(args), target=TRN2)
    return result.outputs[0] if len(result.outputs) == 1 else tuple(result.outputs)


class FakeBenchmark:
    """``package.benchmark(warmup=, iters=)(fn)``: calling it records the run; afterwards
    ``.benchmark_result.nc_latency.get_latency_percentile(p)`` answers from ``latencies[fn name]``."""

    def __init__(self, latencies: dict[str, float], calls: list) -> None:
        self.latencies, self.calls = latencies, calls

    def __call__(self, *, warmup: int, iters: int):
        def wrap(fn):
            median = self.latencies[fn.__name__]
            latency = types.SimpleNamespace(get_latency_percentile=lambda p: median * (0.9 + p / 500))

            def call(*args):
                self.calls.append((fn.__name__, warmup, iters, [a.shape for a in args]))

            call.benchmark_result = types.SimpleNamespace(nc_latency=latency)
            return call

        return wrap


def install(monkeypatch, dialect: str, **attrs) -> types.ModuleType:
    """Stand-in modules for ``dialect``'s package in sys.modules; ``attrs`` go on the NKI module
    (``nki`` or ``neuronxcc.nki``), which also gets an identity ``jit``. Returns that module."""
    modules = {name: types.ModuleType(name) for name in MODULES[dialect]}
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
        monkeypatch.setitem(sys.modules, name, module)
    package = modules["nki" if dialect == "nki" else "neuronxcc.nki"]
    package.jit = lambda fn: fn
    for key, value in attrs.items():
        setattr(package, key, value)
    return package


def absent(monkeypatch, dialect: str) -> None:
    for name in MODULES[dialect]:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError


@pytest.fixture
def gemm_file(tmp_path: Path) -> Path:
    path = tmp_path / "gemm.py"
    path.write_text(compile_gemm(200, 700, 300, target=TRN2, dialect="nki").kernel.source)
    return path


@pytest.fixture
def legacy_mlp_file(tmp_path: Path) -> Path:
    """Two kernels (gate/up, then down) in the neuronxcc dialect."""
    path = tmp_path / "mlp.py"
    compiled = compile_graph(mlp_workload(64, 256, 512, rank=128), target=TRN2, dialect="neuronxcc",
                             params={"mlp": "split"})
    assert len(compiled.programs) == 2
    path.write_text(compiled.kernel.source)
    return path


# ----------------------------------------------------------------------------- verify --backend nki-simulator


@pytest.mark.parametrize(("dialect", "package"), [("nki", "'nki' (NKI 0.3+"), ("neuronxcc", "'neuronx-cc'")])
def test_missing_package_is_one_clear_line(monkeypatch, tmp_path: Path, dialect: str, package: str) -> None:
    path = tmp_path / "k.py"
    path.write_text(compile_gemm(128, 512, 128, target=TRN2, dialect=dialect).kernel.source)
    absent(monkeypatch, dialect)
    result = CliRunner().invoke(main, ["verify", str(path), "--backend", "nki-simulator"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("nmmc: error: ") and package in result.output
    assert "pip.repos.neuron.amazonaws.com" in result.output and "nmmc[neuron]" in result.output
    # the default backend needs none of it
    assert run("verify", str(path)).exit_code == 0


def test_nki_dialect_runs_under_nki_simulate(monkeypatch, gemm_file: Path) -> None:
    calls = []

    def simulate(fn):
        calls.append(fn.__name__)
        return lambda *args: interpret(fn, *args)

    install(monkeypatch, "nki", simulate=simulate, __version__="0.4.1")
    result = run("verify", str(gemm_file), "--backend", "nki-simulator", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert calls == ["gemm_kernel"] and report["backend"] == "nki-simulator" and report["ok"] is True
    assert "dma_transfers" not in report  # the simulator keeps no counters
    interpreted = json.loads(run("verify", str(gemm_file), "--json").output)
    assert report["rel_error"] == interpreted["rel_error"] and interpreted["backend"] == "interpreter"
    human = run("verify", str(gemm_file), "--backend", "nki-simulator")
    assert human.exit_code == 0 and human.output.startswith("OK:") and "nki-simulator" in human.output


def test_older_nki_builds_use_simulate_kernel(monkeypatch, gemm_file: Path) -> None:
    install(monkeypatch, "nki", simulate_kernel=interpret)  # no simulate, no __version__
    assert run("verify", str(gemm_file), "--backend", "nki-simulator").exit_code == 0


def test_neuronxcc_dialect_runs_every_kernel_under_simulate_kernel(monkeypatch, legacy_mlp_file: Path) -> None:
    calls = []

    def simulate_kernel(fn, *args):
        calls.append((fn.__name__, [a.shape for a in args]))
        return interpret(fn, *args)

    install(monkeypatch, "neuronxcc", simulate_kernel=simulate_kernel)
    result = run("verify", str(legacy_mlp_file), "--backend", "nki-simulator", "--json")
    assert result.exit_code == 0, result.output
    assert [name for name, _ in calls] == ["svd_mlp_k0", "svd_mlp_k1"]
    report = json.loads(result.output)
    assert report["ok"] is True and "kernels" not in report  # no counters, not even an empty per-kernel list


def test_a_wrong_simulator_result_fails_verification(monkeypatch, gemm_file: Path) -> None:
    install(monkeypatch, "nki", simulate=lambda fn: lambda *args: np.zeros_like(interpret(fn, *args)))
    result = run("verify", str(gemm_file), "--backend", "nki-simulator")
    assert result.exit_code == 1 and "FAILED" in result.output and "relative error" in result.output


def test_a_simulator_exception_fails_verification(monkeypatch, gemm_file: Path) -> None:
    def simulate(fn):
        def call(*args):
            raise RuntimeError("partition dimension mismatch")
        return call

    install(monkeypatch, "nki", simulate=simulate)
    result = run("verify", str(gemm_file), "--backend", "nki-simulator", "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["error"] == "the NKI simulator raised RuntimeError: partition dimension mismatch"


def test_nki_older_than_0_3_is_refused(monkeypatch, gemm_file: Path) -> None:
    install(monkeypatch, "nki", simulate=lambda fn: fn, __version__="0.2.0")
    result = CliRunner().invoke(main, ["verify", str(gemm_file), "--backend", "nki-simulator"])
    assert result.exit_code == 2 and "version 0.2.0" in result.output and "NKI 0.3 or later" in result.output


def test_source_text_without_a_file_is_simulated_from_a_copy(monkeypatch) -> None:
    install(monkeypatch, "nki", simulate=lambda fn: lambda *args: interpret(fn, *args))
    source = compile_gemm(64, 512, 128, target=TRN2, dialect="nki").kernel.source
    report = verify_source(source, filename="<tuned kernel>", backend="nki-simulator")
    assert report.ok and report.backend == "nki-simulator" and report.counters == {}


# ----------------------------------------------------------------------------- nmmc bench


def test_bench_without_the_package(monkeypatch, gemm_file: Path, tmp_path: Path) -> None:
    absent(monkeypatch, "nki")
    csv = tmp_path / "m.csv"
    result = CliRunner().invoke(main, ["bench", str(gemm_file), "--append-csv", str(csv)])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "'nki' (NKI 0.3+" in result.output
    assert not csv.exists()


def test_bench_without_a_benchmark_api_or_a_device(monkeypatch, gemm_file: Path, tmp_path: Path) -> None:
    install(monkeypatch, "nki", simulate=lambda fn: fn)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    monkeypatch.setattr(bench_routes, "EXPLORER_DIRS", ())
    result = CliRunner().invoke(main, ["bench", str(gemm_file)])
    assert result.exit_code == 2 and "has no benchmark API (nki.benchmark; NKI 0.2+ removed it)" in result.output
    install(monkeypatch, "nki", benchmark=FakeBenchmark({}, []))
    monkeypatch.setattr(bench_routes, "neuron_devices", lambda: [])
    result = CliRunner().invoke(main, ["bench", str(gemm_file)])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "no Neuron device" in result.output


def test_bench_rejects_a_file_that_is_not_a_kernel(tmp_path: Path) -> None:
    path = tmp_path / "notes.py"
    path.write_text("print('hello')\n")
    result = CliRunner().invoke(main, ["bench", str(path)])
    assert result.exit_code == 2 and "not an nmmc kernel file" in result.output


def test_bench_refuses_a_fifo_instead_of_blocking_on_it(tmp_path: Path) -> None:
    fifo = tmp_path / "kernel.py"
    os.mkfifo(fifo)
    result = CliRunner().invoke(main, ["bench", str(fifo)])
    assert result.exit_code == 2 and "not a regular file" in result.output


def test_bench_measures_every_kernel_and_appends_what_calibrate_reads(monkeypatch, legacy_mlp_file: Path,
                                                                     gemm_file: Path, tmp_path: Path) -> None:
    kernels = {"svd_mlp_k0": 40.0, "svd_mlp_k1": 25.0, "gemm_kernel": 60.0}
    calls: list = []
    install(monkeypatch, "neuronxcc", benchmark=FakeBenchmark(kernels, calls))
    monkeypatch.setattr(bench_routes, "neuron_devices", lambda: ["/dev/neuron0"])
    csv = tmp_path / "runs" / "measurements.csv"
    csv.parent.mkdir()
    result = run("bench", str(legacy_mlp_file), "--warmup", "3", "--iters", "20", "--append-csv", str(csv), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [c[0] for c in calls] == ["svd_mlp_k0", "svd_mlp_k1"] and {c[1:3] for c in calls} == {(3, 20)}
    assert report["route"] == "nki.benchmark" and report["iters"] == 20
    assert calls[0][3] == [(64, 256), (256, 128), (128, 512), (256, 128), (128, 512)]  # its declared inputs
    assert report["latency_us"] == pytest.approx(65.0 * 1.0)  # median: 0.9 + 50/500 = 1.0
    assert report["p10_us"] == pytest.approx(65.0 * 0.92) and report["p90_us"] == pytest.approx(65.0 * 1.08)
    kernel_file = read_kernel_file(legacy_mlp_file)
    predicted = sum(estimate(p, TRN2).latency_us for p in kernel_file.programs)
    assert report["predicted_us"] == pytest.approx(predicted)
    assert report["rel_error"] == pytest.approx((predicted - 65.0) / 65.0)

    lines = csv.read_text().splitlines()
    assert lines[0] == ",".join(BENCH_COLUMNS) and len(lines) == 2
    cells = dict(zip(BENCH_COLUMNS, lines[1].split(","), strict=True))
    assert cells["kernel"] == "../mlp.py" and cells["latency_us"] == "65.000" and cells["p10_us"] == "59.800"
    assert cells["warmup"] == "3" and cells["iters"] == "20" and cells["kernel_sha256"] == kernel_file.sha256

    # a second file, in its own dialect's package: appended under the same header; human output
    install(monkeypatch, "nki", benchmark=FakeBenchmark(kernels, calls))
    human = run("bench", str(gemm_file), "--append-csv", str(csv))
    assert human.exit_code == 0, human.output
    assert "median us" in human.output and "gemm_kernel" in human.output and f"appended to {csv}" in human.output
    assert "timed with nki.benchmark: 10 warm-up + 100 timed runs per kernel" in human.output
    rows = read_measurements(csv)
    assert [(r.path.resolve(), r.latency_us) for r in rows] == [(legacy_mlp_file.resolve(), 65.0),
                                                                (gemm_file.resolve(), 60.0)]
    # and the loop closes: nmmc calibrate fits those rows
    result = run("calibrate", str(csv), "--target", "trn2", "--fit", "dma_fixed_cost_us",
                 "-o", str(tmp_path / "cal.json"), "--json")
    assert result.exit_code == 0, result.output
    fit = json.loads(result.output)
    assert fit["rms_rel_error_after"] < fit["rms_rel_error_before"]
    assert [r["measured_us"] for r in fit["rows"]] == [65.0, 60.0]


def test_bench_compares_with_a_calibrated_target(monkeypatch, gemm_file: Path, tmp_path: Path) -> None:
    # 80 us: above the model's 56 us, so fitting the DMA fixed cost alone can match it exactly
    install(monkeypatch, "nki", benchmark=FakeBenchmark({"gemm_kernel": 80.0}, []))
    monkeypatch.setattr(bench_routes, "neuron_devices", lambda: ["/dev/neuron0"])
    csv = tmp_path / "m.csv"
    csv.write_text(f"kernel,latency_us\n{gemm_file},80\n")
    assert run("calibrate", str(csv), "--target", "trn2", "--fit", "dma_fixed_cost_us",
               "-o", str(tmp_path / "cal.json")).exit_code == 0
    result = run("bench", str(gemm_file), "--target", str(tmp_path / "cal.json"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["target"] == str(tmp_path / "cal.json") and abs(report["rel_error"]) < 1e-6
    other = CliRunner().invoke(main, ["bench", str(gemm_file), "--target", "trn1"])
    assert other.exit_code == 2 and "emitted for trn2, not trn1" in other.output


def test_bench_checks_the_csv_before_measuring(monkeypatch, gemm_file: Path, tmp_path: Path) -> None:
    calls: list = []
    install(monkeypatch, "nki", benchmark=FakeBenchmark({"gemm_kernel": 50.0}, calls))
    monkeypatch.setattr(bench_routes, "neuron_devices", lambda: ["/dev/neuron0"])
    result = CliRunner().invoke(main, ["bench", str(gemm_file), "--append-csv", str(tmp_path / "no" / "m.csv")])
    assert result.exit_code == 2 and "does not exist" in result.output
    foreign = tmp_path / "other.csv"
    foreign.write_text("name,seconds\nx,1\n")
    result = CliRunner().invoke(main, ["bench", str(gemm_file), "--append-csv", str(foreign)])
    assert result.exit_code == 2 and "lacks kernel, latency_us" in result.output
    assert calls == [] and foreign.read_text() == "name,seconds\nx,1\n"

"""``nmmc bench``'s timing routes (calibration/bench_routes.py): ``nki.benchmark`` where the dialect's package has
it, else (nki dialect, NKI 0.2+) ``neuron-explorer capture`` of the NEFF the kernel saves under
NEURON_FRAMEWORK_DEBUG=1, its latency read from ``view --output-format summary-json``. No Trainium here: the
packages are stand-in modules, neuron-explorer a stand-in executable, and the summary a fixture written from the
documented schema (tools/neuron-explorer/profile-schema-reference.rst, "Summary": ``total_time``, seconds)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import compile_gemm
from neuronmm_compiler.calibration import bench_routes
from neuronmm_compiler.cli import main
from neuronmm_compiler.errors import NmmcError
from neuronmm_compiler.targets import get_target

FIXTURE = Path(__file__).parent / "fixtures" / "neuron_explorer" / "summary.json"
MODULES = {"nki": ("nki", "nki.isa", "nki.language"),
           "neuronxcc": ("neuronxcc", "neuronxcc.nki", "neuronxcc.nki.isa", "neuronxcc.nki.language")}


def install(monkeypatch, dialect: str, **attrs) -> types.ModuleType:
    modules = {name: types.ModuleType(name) for name in MODULES[dialect]}
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
        monkeypatch.setitem(sys.modules, name, module)
    package = modules["nki" if dialect == "nki" else "neuronxcc.nki"]
    package.jit = attrs.pop("jit", lambda fn: fn)
    for key, value in attrs.items():
        setattr(package, key, value)
    return package


def saving_jit(calls: list):
    """A stand-in ``nki.jit``: a standalone call (NumPy arguments) compiles and runs the kernel; with
    NEURON_FRAMEWORK_DEBUG=1 the compiler saves the NEFF in the working directory."""
    def jit(fn):
        def kernel(*args):
            calls.append((fn.__name__, os.environ.get("NEURON_FRAMEWORK_DEBUG"),
                          os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"), [a.shape for a in args]))
            if os.environ.get("NEURON_FRAMEWORK_DEBUG") == "1":
                Path("file.neff").write_bytes(b"NEFF")
        kernel.__name__ = fn.__name__
        return kernel
    return jit


FAKE_EXPLORER = """\
#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_EXPLORER_LOG"], "a") as log:
    log.write(json.dumps({{"args": args, "cwd": os.getcwd()}}) + "\\n")
code = int(os.environ.get("FAKE_EXPLORER_EXIT", "0"))
if code:
    print("ERROR: nrt_load failed", file=sys.stderr)
    sys.exit(code)
if args[0] == "capture":
    nth = [a for a in args if a.startswith("--profile-nth-exec=")][0].split("=")[1]
    Path(f"profile_exec_{{nth}}.ntff").write_bytes(b"NTFF")
elif args[0] == "view":
    print("INFO: processing profile")
    print(Path(os.environ["FAKE_EXPLORER_SUMMARY"]).read_text())
"""


@pytest.fixture
def explorer(tmp_path: Path, monkeypatch) -> Path:
    """A stand-in neuron-explorer on PATH (and no other one); returns its call log."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "neuron-explorer"
    exe.write_text(FAKE_EXPLORER.format(python=sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "explorer.log"
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("FAKE_EXPLORER_LOG", str(log))
    monkeypatch.setenv("FAKE_EXPLORER_SUMMARY", str(FIXTURE))
    monkeypatch.setattr(bench_routes, "EXPLORER_DIRS", ())
    monkeypatch.setattr(bench_routes, "neuron_devices", lambda: ["/dev/neuron0"])
    return log


@pytest.fixture
def no_explorer(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(bench_routes, "EXPLORER_DIRS", ())
    monkeypatch.setattr(bench_routes, "neuron_devices", lambda: ["/dev/neuron0"])


@pytest.fixture
def nki_file(tmp_path: Path) -> Path:
    path = tmp_path / "gemm.py"
    path.write_text(compile_gemm(256, 512, 128, target=get_target("trn2"), dialect="nki").kernel.source)
    return path


# ----------------------------------------------------------------------------- route selection


@pytest.mark.parametrize("dialect", ["nki", "neuronxcc"])
def test_a_package_with_benchmark_uses_it(monkeypatch, explorer, dialect):
    install(monkeypatch, dialect, benchmark=lambda **kw: None)
    route = bench_routes.choose_route(dialect)
    assert route.name == bench_routes.BENCHMARK and route.explorer is None


def test_nki_without_benchmark_uses_neuron_explorer(monkeypatch, explorer):
    install(monkeypatch, "nki")
    route = bench_routes.choose_route("nki")
    assert route.name == bench_routes.EXPLORER and Path(route.explorer).name == "neuron-explorer"


def test_neuron_explorer_is_found_in_the_neuron_bin_directory(monkeypatch, explorer, tmp_path):
    install(monkeypatch, "nki")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(bench_routes, "EXPLORER_DIRS", (str(tmp_path / "bin"),))
    assert bench_routes.choose_route("nki").explorer == str(tmp_path / "bin" / "neuron-explorer")


def test_neither_route_is_one_line_naming_what_is_missing(monkeypatch, no_explorer, nki_file):
    install(monkeypatch, "nki")
    result = CliRunner().invoke(main, ["bench", str(nki_file)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and result.stdout == ""
    line = result.stderr
    assert line.startswith("nmmc: error: cannot time a nki-dialect kernel: the installed nki has no benchmark API")
    assert "neuron-explorer (aws-neuronx-tools) is neither on PATH nor in" in line


def test_the_legacy_dialect_needs_its_benchmark(monkeypatch, explorer):
    """neuron-explorer is the NKI 0.2+ route; an NKI 0.1 package without benchmark is not timed another way."""
    install(monkeypatch, "neuronxcc")
    with pytest.raises(NmmcError, match=r"neuronxcc\.nki has no benchmark API \(neuronxcc\.nki\.benchmark"):
        bench_routes.choose_route("neuronxcc")


def test_no_device_is_checked_after_the_route(monkeypatch, explorer):
    install(monkeypatch, "nki")
    monkeypatch.setattr(bench_routes, "neuron_devices", lambda: [])
    with pytest.raises(NmmcError, match="no Neuron device"):
        bench_routes.choose_route("nki")


# ----------------------------------------------------------------------------- the neuron-explorer route


def test_bench_through_neuron_explorer(monkeypatch, explorer, nki_file, tmp_path):
    calls: list = []
    install(monkeypatch, "nki", jit=saving_jit(calls))
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    cwd = os.getcwd()
    result = CliRunner().invoke(main, ["bench", str(nki_file), "--warmup", "3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    seconds = json.loads(FIXTURE.read_text())["summary"][0]["total_time"]
    assert report["route"] == "neuron-explorer" and report["iters"] == 1 and report["warmup"] == 3
    assert report["latency_us"] == pytest.approx(seconds * 1e6) == report["p10_us"] == report["p90_us"]
    # the kernel ran standalone once, saving its NEFF; its target was set for the compiler
    assert calls == [("gemm_kernel", "1", "trn2", [(256, 128), (128, 512)])]
    assert "NEURON_FRAMEWORK_DEBUG" not in os.environ and os.getcwd() == cwd
    runs = [json.loads(line) for line in explorer.read_text().splitlines()]
    capture, view = runs
    assert capture["args"][:2] == ["capture", "-n"] and capture["args"][2].endswith("file.neff")
    assert capture["args"][3:] == ["-s", "profile.ntff", "--profile-nth-exec=4"]
    assert view["args"][0] == "view" and view["args"][4].endswith("profile_exec_4.ntff")
    assert view["args"][-2:] == ["--output-format", "summary-json"] and capture["cwd"] == view["cwd"]
    assert not Path(capture["cwd"]).exists()  # the temporary directory is gone
    human = CliRunner().invoke(main, ["bench", str(nki_file)])
    assert human.exit_code == 0 and "timed with neuron-explorer capture" in human.stdout


def test_a_failing_neuron_explorer_is_one_line(monkeypatch, explorer, nki_file):
    install(monkeypatch, "nki", jit=saving_jit([]))
    monkeypatch.setenv("FAKE_EXPLORER_EXIT", "3")
    result = CliRunner().invoke(main, ["bench", str(nki_file)])
    assert result.exit_code == 2 and result.stderr == (
        "nmmc: error: neuron-explorer capture exited 3: ERROR: nrt_load failed\n")


def test_a_kernel_that_saves_no_neff_is_an_error(monkeypatch, explorer, nki_file):
    install(monkeypatch, "nki")  # jit is the identity: running the kernel saves nothing
    monkeypatch.setattr("neuronmm_compiler.calibration.bench.KernelModule.function",
                        lambda self, name: lambda *args: None)
    result = CliRunner().invoke(main, ["bench", str(nki_file)])
    assert result.exit_code == 2 and "saved no NEFF" in result.stderr


# ----------------------------------------------------------------------------- reading the summary


def test_total_time_of_the_documented_summary():
    assert bench_routes.summary_total_time(FIXTURE.read_text()) == pytest.approx(0.000187)
    assert bench_routes.summary_total_time("INFO: processing\n" + FIXTURE.read_text()) == pytest.approx(0.000187)


def test_several_cores_take_the_longest():
    text = json.dumps([{"nc_idx": 0, "total_time": 2e-4}, {"nc_idx": 1, "total_time": 3e-4}])
    assert bench_routes.summary_total_time(text) == pytest.approx(3e-4)


@pytest.mark.parametrize(("text", "message"), [
    ('{"summary": {"hfu_estimated_percent": 70}}', "has no total_time"),
    ('{"summary": {"total_time": 0}}', "not a positive duration"),
    ('{"summary": {"total_time": "fast"}}', "has no total_time"),
    ("{not json", "is not JSON"),
    ("", "has no total_time"),
])
def test_a_summary_without_a_latency_is_an_error(text, message):
    with pytest.raises(NmmcError, match=message):
        bench_routes.summary_total_time(text)


def test_the_routes_are_documented_in_help():
    text = " ".join(CliRunner().invoke(main, ["bench", "--help"]).output.split())
    for phrase in ("nki.benchmark", "neuron-explorer capture --profile-nth-exec=WARMUP+1", "summary-json",
                   "NEURON_FRAMEWORK_DEBUG=1", "/opt/aws/neuron/bin"):
        assert phrase in text, phrase

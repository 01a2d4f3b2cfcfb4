"""How ``nmmc bench`` times a kernel on a Neuron device: the route the installed Neuron SDK documents.

=================== ======================================================= =======================================
route               when                                                    what it runs
=================== ======================================================= =======================================
``nki.benchmark``   the dialect's package has ``benchmark``: NKI 0.1         ``benchmark(warmup=, iters=)(kernel)``
                    (``neuronxcc.nki``), or an ``nki`` build that kept it   ``(*arrays)``; percentiles from
                                                                            ``benchmark_result.nc_latency``
``neuron-explorer`` ``nki`` without ``benchmark`` (NKI 0.2+: "nki.benchmark  the kernel run standalone with NumPy
                    and nki.profile are not available", release notes NKI    arrays under
                    0.2.0) and ``neuron-explorer`` on PATH or in             ``NEURON_FRAMEWORK_DEBUG=1`` (the
                    /opt/aws/neuron/bin (aws-neuronx-tools)                  compiler saves the NEFF in the working
                                                                            directory), then ``neuron-explorer
                                                                            capture -n K.neff -s profile.ntff
                                                                            --profile-nth-exec=W+1`` and ``view -n
                                                                            K.neff -s <ntff> --output-format
                                                                            summary-json``
=================== ======================================================= =======================================

The second route is the NKI guide's ("Profile a NKI Kernel", nki/guides/use-neuron-profile.rst: set
NEURON_FRAMEWORK_DEBUG=1, run the kernel, profile the NEFF with ``neuron-explorer capture``; a standalone kernel
is one called with ``np.ndarray`` arguments, ``nki.jit``'s docstring). ``--profile-nth-exec=N`` runs the NEFF N
times and profiles the N-th, so the first W runs are warm-up. The latency is the summary's ``total_time``
(seconds of on-device execution of the profiled run: tools/neuron-explorer/profile-schema-reference.rst,
"Summary"; ``summary-json`` per tools/neuron-explorer/troubleshooting.rst). That route times one execution, so its
p10, median and p90 are that one value and ``iters`` is 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import NmmcError
from ..verification.nki_backend import PACKAGES, NeuronUnavailableError, neuron_devices, nki_package
from ..vocab import Dialect

BENCHMARK = "nki.benchmark"
EXPLORER = "neuron-explorer"
#: Where aws-neuronx-tools installs neuron-explorer when it is not on PATH (Neuron Explorer troubleshooting).
EXPLORER_DIRS = ("/opt/aws/neuron/bin",)
#: Seconds one neuron-explorer call may take.
EXPLORER_TIMEOUT = 1800


@dataclass(frozen=True)
class Route:
    """The chosen way to time kernels: ``name`` (BENCHMARK or EXPLORER), the dialect's package, and the
    neuron-explorer executable for EXPLORER."""

    name: str
    package: ModuleType
    explorer: str | None = None

    def describe(self, warmup: int, iters: int) -> str:
        if self.name == BENCHMARK:
            return f"{self.package.__name__}.benchmark: {warmup} warm-up + {iters} timed runs per kernel"
        return (f"neuron-explorer capture ({self.explorer}): 1 profiled run after {warmup} warm-up runs per kernel, "
                "its summary total_time (NEURON_FRAMEWORK_DEBUG=1 NEFF; --iters applies to nki.benchmark only)")


def find_explorer() -> str | None:
    """The neuron-explorer executable: on PATH, else in /opt/aws/neuron/bin; None when neither has it."""
    return shutil.which(EXPLORER) or next(
        (found for d in EXPLORER_DIRS if (found := shutil.which(EXPLORER, path=d))), None)


def choose_route(dialect: str) -> Route:
    """The route for a kernel of ``dialect`` on this host (see the module docstring); NeuronUnavailableError, one
    line naming what is missing, when the package, both timing routes or the device are not there."""
    package = nki_package(dialect)
    if callable(getattr(package, "benchmark", None)):
        route = Route(BENCHMARK, package)
    elif Dialect(dialect) is Dialect.NKI and (explorer := find_explorer()):
        route = Route(EXPLORER, package, explorer)
    else:
        module = PACKAGES[Dialect(dialect)][0]
        tools = (" and neuron-explorer (aws-neuronx-tools) is neither on PATH nor in " + ", ".join(EXPLORER_DIRS)
                 if Dialect(dialect) is Dialect.NKI else "")
        raise NeuronUnavailableError(f"cannot time a {dialect}-dialect kernel: the installed {module} has no "
                                     f"benchmark API ({module}.benchmark; NKI 0.2+ removed it){tools}")
    if not neuron_devices():
        raise NeuronUnavailableError("no Neuron device on this host (no /dev/neuron*): 'nmmc bench' runs kernels "
                                     "on a Trainium instance; elsewhere use 'nmmc cost' and 'nmmc verify'")
    return route


def time_kernel(route: Route, fn: Any, args: list[np.ndarray], *, warmup: int, iters: int,
                target: str) -> dict[int, float]:
    """One kernel's 10th, 50th and 90th latency percentiles in microseconds, by ``route``."""
    if route.name == BENCHMARK:
        bench = route.package.benchmark(warmup=warmup, iters=iters)(fn)
        bench(*args)
        latency = bench.benchmark_result.nc_latency
        return {p: float(latency.get_latency_percentile(p)) for p in (10, 50, 90)}
    assert route.explorer is not None
    with tempfile.TemporaryDirectory(prefix="nmmc-bench-") as tmp:
        seconds = explorer_seconds(route.explorer, fn, args, Path(tmp), warmup=warmup, target=target)
    return {p: seconds * 1e6 for p in (10, 50, 90)}


@contextmanager
def _neff_saving(workdir: Path, target: str) -> Iterator[None]:
    """Run with NEURON_FRAMEWORK_DEBUG=1 (the compiler saves the NEFF in the working directory) in ``workdir``,
    and NEURON_PLATFORM_TARGET_OVERRIDE set to the kernel's target unless the user set it."""
    saved = {key: os.environ.get(key) for key in ("NEURON_FRAMEWORK_DEBUG", "NEURON_PLATFORM_TARGET_OVERRIDE")}
    cwd = os.getcwd()
    os.environ["NEURON_FRAMEWORK_DEBUG"] = "1"
    os.environ.setdefault("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _newest(directory: Path, pattern: str, what: str) -> Path:
    found = sorted(directory.rglob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise NmmcError(f"{what}: no {pattern} file in {directory}")
    return found[-1]


def _explorer(explorer: str, args: list[str], workdir: Path) -> str:
    try:
        done = subprocess.run([explorer, *args], cwd=workdir, capture_output=True, text=True,
                              timeout=EXPLORER_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NmmcError(f"neuron-explorer {args[0]} failed: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise NmmcError(f"neuron-explorer {args[0]} exited {done.returncode}: {tail[0]}")
    return done.stdout


def explorer_seconds(explorer: str, fn: Any, args: list[np.ndarray], workdir: Path, *, warmup: int,
                     target: str) -> float:
    """Seconds of on-device execution of one run of the kernel after ``warmup`` runs (the module docstring)."""
    with _neff_saving(workdir, target):
        fn(*args)  # a standalone nki.jit kernel: compiled (NEFF saved here) and executed
    neff = _newest(workdir, "*.neff", "running the kernel with NEURON_FRAMEWORK_DEBUG=1 saved no NEFF")
    _explorer(explorer, ["capture", "-n", str(neff), "-s", "profile.ntff", f"--profile-nth-exec={warmup + 1}"],
              workdir)
    ntff = _newest(workdir, "*.ntff", "neuron-explorer capture wrote no profile")
    summary = _explorer(explorer, ["view", "-n", str(neff), "-s", str(ntff), "--output-format", "summary-json"],
                        workdir)
    return summary_total_time(summary)


def summary_total_time(text: str) -> float:
    """The ``total_time`` (seconds) of ``neuron-explorer view --output-format summary-json`` output: the JSON
    document in ``text`` (anything printed before it is skipped), searched at any depth; the largest when the
    summary has several (one per NeuronCore). NmmcError when there is none or it is not a positive number."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except ValueError as exc:
        raise NmmcError(f"neuron-explorer summary-json is not JSON: {exc}") from None
    values = [v for v in _find(data, "total_time") if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not values:
        raise NmmcError("neuron-explorer summary-json has no total_time")
    if not max(values) > 0:
        raise NmmcError(f"neuron-explorer summary-json total_time is {max(values)}, not a positive duration")
    return float(max(values))


def _find(data: Any, key: str) -> Iterator[Any]:
    if isinstance(data, dict):
        for k, v in data.items():
            if k == key:
                yield v
            yield from _find(v, key)
    elif isinstance(data, list):
        for item in data:
            yield from _find(item, key)

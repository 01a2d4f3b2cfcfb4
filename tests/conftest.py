"""Shared helpers for the test suite."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

# One BLAS and OpenMP (torch) thread per test process unless the caller chose: the suite runs a worker per core
# (pytest -n auto), and each one's libraries starting a thread per core oversubscribed the machine (OpenBLAS's
# threads spin while they wait): the whole suite took 462 s on an idle 2-core host, 385 s with one thread each.
# This must run before numpy or torch is imported; test_repo.py checks that it did. Tests that pass --threads still
# get what they ask for (nmmc sets the threads itself, through threadpoolctl and torch.set_num_threads).
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

# Bytecode while collecting, where PYTHONDONTWRITEBYTECODE forbids it (as on the shared 2-core machine): each test
# worker rewrote and compiled every test module (pytest's assertion rewriting) and the package from source, and so
# did every nmmc process a test starts. While the tests are collected the bytecode of the test modules and of the
# package they import is written, beside them in __pycache__ (ignored by git); the processes tests start read it.
# Afterwards nothing more is written, so a temporary file a test imports (a kernel, an exported package) gets no
# __pycache__ beside it. Collection took 11.7 CPU s per process before, 5.9 once written.
_BYTECODE_WHILE_COLLECTING = sys.dont_write_bytecode
sys.dont_write_bytecode = False

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from helpers import compile_gemm  # noqa: E402
from neuronmm_compiler.verification import verify_source  # noqa: E402

settings.register_profile(
    "nmmc", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("nmmc")


def compile_and_verify(m: int, n: int, k: int, *, seed: int = 0, **options):
    """Compile a GEMM, run it in the interpreter, return (compiled, report); fails on mismatch."""
    compiled = compile_gemm(m, n, k, **options)
    report = verify_source(compiled.kernel.source, filename=f"<gemm {m}x{n}x{k}>", seed=seed)
    assert report.ok, f"{m}x{n}x{k} {options}: {report.error}"
    return compiled, report


#: Tests recorded (cpu_seconds.json, written by scripts/suite_cpu.py) at this many CPU seconds or more are marked
#: ``slow``; ``pytest -m "not slow"`` runs the others, the quick subset (README, docs/ci.md).
SLOW_SECONDS = 0.2
CPU_SECONDS = Path(__file__).with_name("cpu_seconds.json")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` the tests recorded at SLOW_SECONDS or more, and the tests of their file that request one of the
    file's own module (or wider) fixtures such a test requests: that fixture's cost was recorded on the first test
    that used it, and without that test the next one would pay it in the quick subset."""
    recorded = json.loads(CPU_SECONDS.read_text(encoding="utf-8"))["tests"] if CPU_SECONDS.is_file() else {}

    def shared(item: pytest.Item) -> set[tuple[str, str]]:
        module = item.nodeid.split("::", 1)[0]
        info = getattr(item, "_fixtureinfo", None)
        return {(module, name) for name, defs in (info.name2fixturedefs.items() if info else ())
                if defs and defs[-1].scope != "function" and defs[-1].baseid == module}

    slow = {item for item in items if recorded.get(item.nodeid, 0.0) >= SLOW_SECONDS}
    expensive = set().union(*map(shared, slow)) if slow else set()
    for item in items:
        if item in slow or shared(item) & expensive:
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Bytecode is written only while collecting (see the top of this file)."""
    sys.dont_write_bytecode = _BYTECODE_WHILE_COLLECTING


_frozen_module: list[str] = [""]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Keep the garbage collector's full collections cheap: before each test, what is alive is moved out of its reach
    (``gc.freeze``), so a full collection scans only what the test allocates. Verification calls ``gc.collect()`` after
    every kernel it runs (the interpreter's machine sits in reference cycles), and in a test worker that had every
    test collected and earlier modules' objects alive each call scanned 88,000-270,000 objects: 50-140 ms a kernel,
    42% of test_gemm_kernels.py's CPU time. At each new test file the frozen objects are released and collected
    once, so cycles that earlier files left behind are still freed."""
    module = item.nodeid.split("::", 1)[0]
    if module != _frozen_module[0]:
        _frozen_module[0] = module
        gc.unfreeze()
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def private_result_cache(tmp_path, monkeypatch):
    """Every test gets its own empty result cache (nmmc tune reads and writes one by default)."""
    monkeypatch.setenv("NMMC_CACHE_DIR", str(tmp_path / "nmmc-cache"))


@pytest.fixture
def verify_gemm():
    return compile_and_verify


@pytest.fixture(scope="module")
def one_blas_thread():
    """One BLAS thread for a module of tiny matrices: more threads only spin against each other and the other test
    workers on a busy machine (``pytestmark = pytest.mark.usefixtures("one_blas_thread")``)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield

"""Shared helpers for the test suite."""

from __future__ import annotations

import gc
import os

# One BLAS and OpenMP (torch) thread per test process unless the caller chose: the suite runs a worker per core
# (pytest -n auto), and each one's libraries starting a thread per core oversubscribed the machine (OpenBLAS's
# threads spin while they wait): the whole suite took 462 s on an idle 2-core host, 385 s with one thread each.
# This must run before numpy or torch is imported; test_repo.py checks that it did. Tests that pass --threads still
# get what they ask for (nmmc sets the threads itself, through threadpoolctl and torch.set_num_threads).
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

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

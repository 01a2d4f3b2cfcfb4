"""Shared helpers for the test suite."""

from __future__ import annotations

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

"""Shared helpers for the test suite."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from helpers import compile_gemm
from neuronmm_compiler.verification import verify_source

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

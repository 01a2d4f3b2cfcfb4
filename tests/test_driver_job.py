"""One request, one resolution: the driver resolves a workload's lowering entry once per request (driver.Job)."""

from __future__ import annotations

from neuronmm_compiler import driver
from neuronmm_compiler.artifacts.cache import ResultCache
from neuronmm_compiler.frontends.workloads import gemm_workload
from neuronmm_compiler.targets import get_target


def test_a_cached_tune_resolves_the_lowering_entry_once(tmp_path, monkeypatch):
    calls = []
    real = driver.lowering_for

    def counting(workload):
        calls.append(workload)
        return real(workload)

    monkeypatch.setattr(driver, "lowering_for", counting)
    cache = ResultCache(tmp_path)
    job = driver.resolve(gemm_workload(256, 512, 256), get_target("trn2"))
    settings = driver.SearchSettings(trials=4, seed=1)
    searched, hit = driver.tune_cached(job, settings, cache, store=False)
    assert not hit and driver.store_tuned(job, searched, settings, cache)
    answered, hit = driver.tune_cached(job, settings, cache)
    assert hit and answered.compiled.kernel.source == searched.compiled.kernel.source
    assert len(calls) == 1  # search, compile, baselines, cache key and record all read the job
    assert driver.tune(gemm_workload(256, 512, 256), target=get_target("trn2"), trials=4, seed=1).compiled.cost \
        .latency_us == searched.compiled.cost.latency_us

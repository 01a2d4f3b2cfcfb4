"""Short spellings of driver calls for tests: GEMMs by their dimensions, targets by name."""

from __future__ import annotations

from typing import Any

from neuronmm_compiler.driver import Compiled, Tuned, compile_workload, tune
from neuronmm_compiler.frontends.workloads import Workload, gemm_workload
from neuronmm_compiler.targets import Target, get_target


def _target(target: str | Target) -> Target:
    return target if isinstance(target, Target) else get_target(target)


def compile_gemm(m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = "mk",
                 target: str | Target = "trn1", schedule: Any = None, **options: Any) -> Compiled:
    """``compile_workload`` of a GEMM; ``schedule`` is a preset name or a GemmSchedule."""
    workload = gemm_workload(m, n, k, dtype=dtype, a_layout=a_layout)
    if isinstance(schedule, str):
        options["preset"] = schedule
    elif schedule is not None:
        options["schedule"] = schedule
    return compile_workload(workload, target=_target(target), **options)


def tune_gemm(m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = "mk",
              target: str | Target = "trn1", **options: Any) -> Tuned:
    """``tune`` of a GEMM."""
    return tune(gemm_workload(m, n, k, dtype=dtype, a_layout=a_layout), target=_target(target), **options)


def compile_graph(workload: Workload, *, target: str | Target = "trn1", **options: Any) -> Compiled:
    return compile_workload(workload, target=_target(target), **options)


def tune_graph(workload: Workload, *, target: str | Target = "trn1", **options: Any) -> Tuned:
    return tune(workload, target=_target(target), **options)


def verified_nki(workload: Workload, target: str | Target = "trn2", **params: Any) -> tuple[Compiled, Any]:
    """``workload`` compiled in the nki dialect under ``params`` and run in the interpreter: (compiled, report), the
    kernel verified and the cost model's DMA counts (transfers, bytes per partition) equal to the interpreter's."""
    from neuronmm_compiler.verification import verify_source

    compiled = compile_graph(workload, target=target, dialect="nki", params=params)
    report = verify_source(compiled.kernel.source, filename=workload.describe())
    assert report.ok, report.error
    assert compiled.cost.dma_transfers == report.counters["dma_transfers"]
    assert {str(k): v for k, v in compiled.cost.dma_bytes_per_partition.items()} == \
        report.counters["dma_bytes_per_partition"]
    return compiled, report

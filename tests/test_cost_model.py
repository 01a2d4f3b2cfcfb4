"""The analytic cost model: its counts against the interpreter, and its sanity properties."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import compile_and_verify
from neuronmm_compiler.cost_model import dma_efficiency, estimate
from neuronmm_compiler.lowerings.gemm import gemm_space, tune_gemm
from neuronmm_compiler.lowerings.lower_gemm import lower_gemm
from neuronmm_compiler.schedule import PRESETS, GemmProblem, normalize, preset
from neuronmm_compiler.targets import TARGETS, get_target

TRN1 = get_target("trn1")


def _assert_counts_match(compiled, report):
    cost = compiled.cost
    counters = report.counters
    for name, value in counters["hbm_bytes_read"].items():
        assert cost.hbm_bytes_read_by_tensor.get(name, 0) == value, name
    for name, value in counters["hbm_bytes_written"].items():
        assert cost.hbm_bytes_written_by_tensor.get(name, 0) == value, name
    assert cost.dma_transfers == counters["dma_transfers"]
    assert cost.dma_transposes == counters["dma_transposes"]
    assert {str(k): v for k, v in cost.dma_bytes_per_partition.items()} == counters["dma_bytes_per_partition"]
    assert cost.matmul_instructions == counters["matmul_instructions"]
    assert cost.transposes == counters["transposes"]
    assert cost.sbuf_bytes_per_partition == counters["sbuf_peak_bytes"]
    assert cost.psum_banks == counters["psum_peak_banks"]


@pytest.mark.parametrize("shape", [(1, 512, 128), (200, 700, 300), (1024, 2048, 1024), (1, 4096, 4096)], ids=str)
@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("layout", ["mk", "km"])
def test_model_counts_equal_interpreter_for_presets(shape, name, layout):
    """Also test_gemm_kernels.py's bf16 preset check for the neuronxcc dialect (trn1's default): the same kernels."""
    compiled, report = compile_and_verify(*shape, schedule=name, a_layout=layout)
    assert report.dialect == "neuronxcc" and report.rel_error < 1e-2
    _assert_counts_match(compiled, report)


SEARCH_SHAPES = [(1, 2048, 2048), (32, 1536, 1024), (200, 700, 300), (384, 1024, 640), (1000, 600, 900)]


@pytest.mark.parametrize("shape", SEARCH_SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["mk", "km"])
def test_model_counts_equal_interpreter_for_searched_schedules(shape, layout):
    """The top schedules of a search (5 shapes x 2 layouts x 3 = 30 schedules) verify, and the
    model's counts equal the interpreter's for each."""
    problem = GemmProblem(*shape, a_layout=layout)
    result = tune_gemm(problem, TRN1, trials=40, top_k=3)
    assert len(result.top) == 3
    for cand in result.top:
        assert cand.cost.feasible
        compiled, report = compile_and_verify(*shape, a_layout=layout, schedule=cand.schedule)
        _assert_counts_match(compiled, report)


def test_presets_rank_as_their_structure_implies():
    """For a large square GEMM: tiled < hoisted loads < blocked free dims < fully optimized."""
    problem = GemmProblem(4096, 4096, 4096, a_layout="km")
    latency = {name: estimate(lower_gemm(problem, preset(name, problem), TRN1), TRN1).latency_us for name in PRESETS}
    assert latency["aws-tiled"] > latency["aws-hoist-load"] > latency["aws-block-free"] > latency[
        "aws-fully-optimized"]
    full = estimate(lower_gemm(problem, preset("aws-fully-optimized", problem), TRN1), TRN1)
    assert full.bound == "compute"
    assert full.lower_bound_us <= full.latency_us


def _scaled(target, **factors):
    return dataclasses.replace(target, **{k: getattr(target, k) * f for k, f in factors.items()})


@pytest.mark.parametrize("target_name", list(TARGETS))
@pytest.mark.parametrize("field", ["hbm_gbytes_per_s_per_chip", "dma_bytes_per_ns_per_engine", "pe_clock_ghz",
                                   "vector_clock_ghz", "scalar_clock_ghz", "dma_transpose_efficiency"])
def test_more_bandwidth_or_clock_never_predicts_slower(target_name, field):
    base = TARGETS[target_name]
    faster = _scaled(base, **{field: 1.5})
    for shape in [(1, 4096, 4096), (200, 700, 300), (2048, 2048, 2048)]:
        problem = GemmProblem(*shape)
        for name in PRESETS:
            program = lower_gemm(problem, preset(name, problem), base)
            assert estimate(program, faster).latency_us <= estimate(program, base).latency_us + 1e-9


def test_cheaper_dma_fixed_cost_never_predicts_slower():
    base = TRN1
    cheaper = dataclasses.replace(base, dma_fixed_cost_us=base.dma_fixed_cost_us / 2)
    problem = GemmProblem(1024, 2048, 1024)
    for name in PRESETS:
        program = lower_gemm(problem, preset(name, problem), base)
        assert estimate(program, cheaper).latency_us <= estimate(program, base).latency_us


def test_dma_efficiency_curve_is_monotonic_and_matches_table():
    sizes = [2**i for i in range(0, 17)]
    values = [dma_efficiency(s, TRN1) for s in sizes]
    assert values == sorted(values)
    assert dma_efficiency(2048, TRN1) == pytest.approx(0.81)
    assert dma_efficiency(64 * 1024, TRN1) == 1.0


def test_fp32_matmuls_cost_four_times_the_cycles():
    bf16 = GemmProblem(512, 1024, 512)
    fp32 = GemmProblem(512, 1024, 512, dtype="float32")
    sched = preset("aws-block-free", bf16)
    assert estimate(lower_gemm(fp32, sched, TRN1), TRN1).engine_us["tensor"] == pytest.approx(
        4 * estimate(lower_gemm(bf16, sched, TRN1), TRN1).engine_us["tensor"])


def test_search_never_returns_an_infeasible_winner():
    # A shape where large blocks overflow SBUF: the space holds infeasible points.
    problem = GemmProblem(8192, 8192, 8192)
    result = tune_gemm(problem, TRN1, trials=60)
    assert result.feasible < result.evaluated
    assert result.best.cost.feasible and all(c.cost.feasible for c in result.top)


def test_search_is_reproducible_and_seed_sensitive():
    problem = GemmProblem(512, 2048, 4096)
    first = tune_gemm(problem, TRN1, trials=50, seed=3)
    second = tune_gemm(problem, TRN1, trials=50, seed=3)
    assert first.best.schedule == second.best.schedule and first.history == second.history
    other = tune_gemm(problem, TRN1, trials=50, seed=4)
    assert other.history != first.history


def test_exhaustive_search_finds_the_optimum_of_a_small_space():
    problem = GemmProblem(1, 1024, 512)
    space = gemm_space(problem, max_column_tiles=1)  # without PE column tiles: small enough to enumerate
    result = tune_gemm(problem, TRN1, space=space)
    assert result.method == "exhaustive" and result.evaluated == result.space_size
    every = [estimate(lower_gemm(problem, s, TRN1), TRN1) for s in space.distinct(lambda s: normalize(problem, s))]
    assert result.best.latency_us == min(c.latency_us for c in every if c.feasible)


def test_tuned_is_never_slower_than_the_baseline_preset():
    for shape in [(1, 4096, 4096), (32, 2048, 8192), (512, 1024, 1024)]:
        problem = GemmProblem(*shape)
        base = estimate(lower_gemm(problem, preset("aws-fully-optimized", problem), TRN1), TRN1)
        assert tune_gemm(problem, TRN1, trials=60).best.latency_us <= base.latency_us


@pytest.mark.parametrize("name", ["aws-tiled", "aws-fully-optimized"])
@pytest.mark.parametrize("target_name", ["trn1", "trn2"])
def test_the_printed_formulas_are_the_computed_ones(name, target_name):
    """explain prints sympy expressions; estimate evaluates plain Python. Both must give the same times."""
    import sympy as sp

    from neuronmm_compiler.cost_model.formulas import TERMS, symbolic

    target = get_target(target_name)
    problem = GemmProblem(1000, 1536, 700)
    cost = estimate(lower_gemm(problem, preset(name, problem), target), target)
    terms, latency, bound = symbolic()
    assert tuple(terms) == TERMS
    values = {sp.Symbol(k, nonnegative=True): v for k, v in cost.values.items()}
    for term, expr in terms.items():
        assert float(expr.subs(values)) == pytest.approx(cost.values[term], rel=1e-12), term
    times = {sp.Symbol(k): cost.values[k] for k in terms}
    assert float(latency.subs(times)) == pytest.approx(cost.latency_us, rel=1e-12)
    assert float(bound.subs(values)) == pytest.approx(cost.lower_bound_us, rel=1e-12)

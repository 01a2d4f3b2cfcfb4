"""The CI portion of the fuzzer: random graph files through emit, verify and the cost model.

Each example is a graph file drawn by :func:`neuronmm_compiler.verification.fuzz.random_case` from a
hypothesis-controlled random source (so a failure shrinks to a small graph); ``scripts/fuzz.py``
runs the long version. Every case must end ``ok`` (emitted, verified against float64, cost-model
bytes equal to the interpreter's) or ``rejected`` with a user-facing one-line error.
"""

from __future__ import annotations

import dataclasses
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronmm_compiler.verification.fuzz import GOOD, FuzzCase, random_case, run_case

CI_CASES = 70  # 33 s alone on a 2-core host where 110 took 76 s in the suite (the suite's 10-minute budget);
# scripts/fuzz.py runs the long version (1500 cases)
seen: dict[str, int] = {}
reasons: dict[str, int] = {}  # the rejections' messages up to their first digit: a failure below says what was refused


@settings(max_examples=CI_CASES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.randoms(use_true_random=False))
def _random_graphs(rng: random.Random) -> None:
    case = random_case(rng)
    outcome = run_case(case)
    seen[outcome.status] = seen.get(outcome.status, 0) + 1
    assert outcome.status in GOOD, f"{outcome.status}: {outcome.detail}\ncase: {case.describe()}"
    if outcome.status == "rejected":
        assert "\n" not in outcome.detail and outcome.detail.strip()
        reason = re.split(r"\d", outcome.detail, maxsplit=1)[0][:120]
        reasons[reason] = reasons.get(reason, 0) + 1


def test_random_graphs_emit_verify_and_match_the_cost_model() -> None:
    seen.clear()
    reasons.clear()
    _random_graphs()
    total = sum(seen.values())
    assert total >= 64, seen
    # The generator is useful only if most cases compile: a pipeline that rejected everything
    # would pass the loop above.
    assert seen.get("ok", 0) >= 0.6 * total, (seen, sorted(reasons.items(), key=lambda item: -item[1])[:6])


def _case(**overrides) -> FuzzCase:
    document = {"nmmc_graph": 1, "name": "fuzz", "dtype": "fp32",
                "inputs": {"x0": {"shape": [40, 130]}, "w1": {"shape": [130, 70]}},
                "ops": {"op0": {"op": "matmul", "args": ["x0", "w1"]}, "op1": {"op": "silu", "args": ["op0"]}},
                "outputs": {"y0": "op1"}}
    return FuzzCase(document=document, dims={}, target="trn2", dialect="nki", **overrides)


def test_a_plain_case_is_ok() -> None:
    assert run_case(_case()).status == "ok"


def test_an_internal_exception_is_reported_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    import neuronmm_compiler.driver as driver

    def broken(*args, **kwargs):
        raise KeyError("bug")

    monkeypatch.setattr(driver, "compile_workload", broken)
    outcome = run_case(_case())
    assert outcome.status == "internal" and "KeyError" in outcome.detail


def test_a_wrong_kernel_is_reported_unverified(monkeypatch: pytest.MonkeyPatch) -> None:
    import neuronmm_compiler.driver as driver

    real = driver.compile_workload

    def without_silu(*args, **kwargs):  # the kernel evicts the matmul without its activation
        compiled = real(*args, **kwargs)
        source = compiled.kernel.source.replace("op=nl.silu", "op=nl.copy")
        assert source != compiled.kernel.source
        return dataclasses.replace(compiled, kernel=dataclasses.replace(compiled.kernel, source=source))

    monkeypatch.setattr(driver, "compile_workload", without_silu)
    assert run_case(_case()).status == "unverified"


def test_a_user_error_is_rejected_in_one_line() -> None:
    case = _case()
    case.document["ops"]["op0"]["args"] = ["x0", "nowhere"]
    outcome = run_case(case)
    assert outcome.status == "rejected" and "nowhere" in outcome.detail


def test_the_generator_is_deterministic_per_seed() -> None:
    assert random_case(random.Random(5)).describe() == random_case(random.Random(5)).describe()

"""Emit and verify the whole emit matrix: every kernel family nmmc emits, on every target, in both dialects.

Usage: python scripts/emit_matrix.py [--trials N] [--sdk X.Y] [--only SUBSTRING] [--verbose] [--json FILE]

The matrix (shapes kept small, so the whole run takes minutes on two cores): GEMMs under every preset of ``nmmc
schedules`` and tuned (``--trials``), in bf16 and fp32, square, ragged and decode shapes, plus A stored transposed
and a PE-transpose override; SVD chains (default, PE transpose, all weights cached), in both dtypes, square, ragged
and decode; gated MLPs, SVD-compressed whole and split, and dense (the baseline) whole and split, in both dtypes,
prefill and decode; every example graph under examples/graphs (prefill and decode token counts, the other dimensions
bound small, and tuned at the file's own dimensions). Each of those in the ``nki`` and ``neuronxcc`` dialects on
trn1, trn2 and trn3.

Each kernel is compiled through the public driver API (``neuronmm_compiler.driver.compile_workload`` /
``tune``) and verified as ``nmmc verify`` does: nmmc's interpreter against a float64 reference, and the static
NKI rule pass (``--sdk``, default the newest release supporting the dialect on the target). Pairings the support
matrix calls unsupported (``nki`` on trn1, NKI-DIALECT-TRN1) are emitted and verified too and reported apart:
they pass when the kernel computes the right values and the only violated rule is NKI-DIALECT-TRN1.

Prints the counts (kernels, passed, failed, violations by rule id) and exits 1 on any failure.
``tests/test_emit_matrix.py`` runs a slice of the same matrix through these functions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from neuronmm_compiler.driver import compile_workload, named_schedules, tune  # noqa: E402
from neuronmm_compiler.errors import NmmcError  # noqa: E402
from neuronmm_compiler.frontends.graph_file import load_graph_spec  # noqa: E402
from neuronmm_compiler.frontends.workloads import (  # noqa: E402
    Workload,
    chain_workload,
    gemm_workload,
    graph_workload,
    mlp_workload,
)
from neuronmm_compiler.support import support_for  # noqa: E402
from neuronmm_compiler.targets import get_target  # noqa: E402
from neuronmm_compiler.verification import verify_source  # noqa: E402
from neuronmm_compiler.verification.static_check import Violation  # noqa: E402
from neuronmm_compiler.vocab import Dialect  # noqa: E402

DIALECTS = ("nki", "neuronxcc")
TARGETS = ("trn1", "trn2", "trn3")
DTYPES = ("bfloat16", "float32")
#: The rule an unsupported pairing (support.support_for is None) is expected to violate, and only it.
UNSUPPORTED_RULE = "NKI-DIALECT-TRN1"
TRIALS = 6
GEMM_SHAPES = {"square": (256, 1024, 256), "ragged": (200, 700, 300), "decode": (1, 512, 512)}
CHAIN_SHAPES = {"square": (256, 1024, 512, 128), "ragged": (77, 600, 300, 64), "decode": (1, 512, 512, 128)}
MLP_SHAPES = {"prefill": (64, 256, 512), "decode": (1, 256, 512)}
#: One bf16 shape per family at the golden corpus's sizes: several blocks, PSUM banks and K tiles per block.
LARGE_GEMM = (1024, 2048, 1024)
LARGE_CHAIN = (512, 4096, 2048, 512)
LARGE_MLP = (128, 2048, 8192, 1280)
MLP_RANK = 128
GRAPHS = ROOT / "examples" / "graphs"
#: Dimensions bound for the example graphs besides ``tokens`` (keeping them small; a file lacking one ignores it).
GRAPH_DIMS = {"hidden": 256, "out": 512, "intermediate": 512, "rank": 64, "rank1": 128, "rank2": 64}
GRAPH_TOKENS = {"prefill": 128, "decode": 1}
GRAPH_TUNED_TOKENS = 96


@dataclass(frozen=True)
class Case:
    """One kernel of the matrix: a workload compiled under a preset (or the default, or a tuned schedule) for a
    target in a dialect."""

    family: str
    label: str
    target: str
    dialect: str
    build: Callable[[], Workload] = field(compare=False, repr=False)
    preset: str | None = None
    params: tuple[tuple[str, str], ...] = ()
    trials: int | None = None

    @property
    def name(self) -> str:
        return f"{self.label}-{self.dialect}-{self.target}"

    @property
    def supported(self) -> bool:
        """False for a pairing the support matrix calls unsupported (nki on trn1)."""
        return support_for(Dialect(self.dialect), self.target) is not None


@dataclass
class Outcome:
    """What verifying one case gave: the report's verdict, its violations and its error (or the compile error)."""

    case: Case
    numerics_ok: bool
    violations: list[Violation]
    error: str | None
    sdk: str | None
    seconds: float

    @property
    def rules(self) -> set[str]:
        return {v.rule_id for v in self.violations}

    @property
    def passed(self) -> bool:
        """A supported pairing: right values and no violation; an unsupported one: right values, and the only
        violated rule is NKI-DIALECT-TRN1."""
        if not self.numerics_ok:
            return False
        return not self.violations if self.case.supported else self.rules == {UNSUPPORTED_RULE}


def _gemm_cases(target: str, dialect: str, trials: int) -> Iterable[Case]:
    for dtype in DTYPES:
        for shape_name, (m, n, k) in GEMM_SHAPES.items():
            def build(m: int = m, n: int = n, k: int = k, dtype: str = dtype) -> Workload:
                return gemm_workload(m, n, k, dtype=dtype)

            rows, _ = named_schedules(build(), get_target(target))
            for row in rows:
                yield Case("gemm", f"gemm-{shape_name}-{dtype}-{row['name']}", target, dialect, build,
                           preset=row["name"] if row["name"].startswith("aws-") else None)
            yield Case("gemm-tuned", f"gemm-tuned-{shape_name}-{dtype}", target, dialect, build, trials=trials)
    large = gemm_workload(*LARGE_GEMM)
    for row in named_schedules(large, get_target(target))[0]:
        yield Case("gemm", f"gemm-large-bfloat16-{row['name']}", target, dialect, lambda: gemm_workload(*LARGE_GEMM),
                   preset=row["name"] if row["name"].startswith("aws-") else None)
    for dtype in DTYPES:
        yield Case("gemm", f"gemm-km-{dtype}", target, dialect,
                   lambda dtype=dtype: gemm_workload(256, 512, 384, dtype=dtype, a_layout="km"))
        yield Case("gemm", f"gemm-pe-transpose-{dtype}", target, dialect,
                   lambda dtype=dtype: gemm_workload(200, 700, 300, dtype=dtype), params=(("a_transpose", "pe"),))
        # several PSUM accumulators live at once (issue 12 finding 1: one bank each, not one wide tile)
        yield Case("gemm", f"gemm-multibank-{dtype}", target, dialect,
                   lambda dtype=dtype: gemm_workload(256, 2048, 512, dtype=dtype), preset="aws-block-free",
                   params=(("tiles_in_block_k", "2"), ("loop_order", "mnk")))


def _chain_cases(target: str, dialect: str, trials: int) -> Iterable[Case]:
    for dtype in DTYPES:
        for shape_name, (m, n, k, rank) in CHAIN_SHAPES.items():
            def build(m: int = m, n: int = n, k: int = k, rank: int = rank, dtype: str = dtype) -> Workload:
                return chain_workload(m, n, k, rank=rank, dtype=dtype)

            for variant, params in (("default", ()), ("pe", (("x_transpose", "pe"),)),
                                    ("cacheall", (("cache_weights", "all"),))):
                yield Case("chain", f"chain-{shape_name}-{dtype}-{variant}", target, dialect, build, params=params)
        if dtype == "bfloat16":
            yield Case("chain", "chain-large-bfloat16-default", target, dialect,
                       lambda: chain_workload(*LARGE_CHAIN[:3], rank=LARGE_CHAIN[3]))
        yield Case("chain-tuned", f"chain-tuned-{dtype}", target, dialect,
                   lambda dtype=dtype: chain_workload(256, 1024, 512, rank=128, dtype=dtype), trials=trials)


def _mlp_cases(target: str, dialect: str, trials: int) -> Iterable[Case]:
    for dtype in DTYPES:
        for shape_name, (tokens, hidden, intermediate) in MLP_SHAPES.items():
            for dense in (False, True):
                def build(tokens: int = tokens, hidden: int = hidden, intermediate: int = intermediate,
                          dense: bool = dense, dtype: str = dtype) -> Workload:
                    return mlp_workload(tokens, hidden, intermediate, rank=None if dense else MLP_RANK,
                                        dense=dense, dtype=dtype)

                kind = "mlp-dense" if dense else "mlp"
                for mode in ("whole", "split"):
                    yield Case(kind, f"{kind}-{shape_name}-{dtype}-{mode}", target, dialect, build,
                               params=(("mlp", mode),))
        if dtype == "bfloat16":
            for dense in (False, True):
                kind = "mlp-dense" if dense else "mlp"
                for mode in ("whole", "split"):
                    yield Case(kind, f"{kind}-large-bfloat16-{mode}", target, dialect,
                               lambda dense=dense: mlp_workload(*LARGE_MLP[:3], rank=None if dense else LARGE_MLP[3],
                                                                dense=dense),
                               params=(("mlp", mode),))
        yield Case("mlp-tuned", f"mlp-tuned-{dtype}", target, dialect,
                   lambda dtype=dtype: mlp_workload(64, 256, 512, rank=MLP_RANK, dtype=dtype), trials=trials)


def _graph_cases(target: str, dialect: str, trials: int) -> Iterable[Case]:
    for path in sorted(GRAPHS.glob("*.yaml")):
        for token_name, tokens in GRAPH_TOKENS.items():
            def build(path: Path = path, tokens: int = tokens) -> Workload:
                spec = load_graph_spec(path)
                bindings = {k: v for k, v in GRAPH_DIMS.items() if k in spec.dims}
                return graph_workload(spec.graph({**bindings, "tokens": tokens}), spec.source)

            yield Case("graph", f"graph-{path.stem}-{token_name}", target, dialect, build)
        # tuned at the file's own dimensions (wider accumulators than the small bindings reach)
        yield Case("graph-tuned", f"graph-tuned-{path.stem}", target, dialect,
                   lambda path=path: _graph_at_own_dims(path, GRAPH_TUNED_TOKENS), trials=trials)


def _graph_at_own_dims(path: Path, tokens: int) -> Workload:
    spec = load_graph_spec(path)
    return graph_workload(spec.graph({"tokens": tokens}), spec.source)


FAMILIES = ("gemm", "gemm-tuned", "chain", "chain-tuned", "mlp", "mlp-dense", "mlp-tuned", "graph", "graph-tuned")


def matrix_cases(*, trials: int = TRIALS, targets: Sequence[str] = TARGETS,
                 dialects: Sequence[str] = DIALECTS) -> list[Case]:
    """Every case of the matrix (see the module docstring), in a fixed order."""
    cases: list[Case] = []
    for target in targets:
        for dialect in dialects:
            cases += _gemm_cases(target, dialect, trials)
            cases += _chain_cases(target, dialect, trials)
            cases += _mlp_cases(target, dialect, trials)
            cases += _graph_cases(target, dialect, trials)
    return cases


def run_case(case: Case, sdk: str | None = None) -> Outcome:
    """Compile (or tune) the case and verify it as ``nmmc verify`` does (interpreter and static rules)."""
    start = time.perf_counter()
    target = get_target(case.target)
    try:
        workload = case.build()
        if case.trials is not None:
            compiled = tune(workload, target=target, dialect=case.dialect, trials=case.trials, seed=0).compiled
        else:
            compiled = compile_workload(workload, target=target, dialect=case.dialect, preset=case.preset,
                                        params=dict(case.params))
        report = verify_source(compiled.kernel.source, filename=case.name, rules=True, sdk=sdk)
    except NmmcError as exc:
        return Outcome(case, False, [], f"{type(exc).__name__}: {exc}", sdk, time.perf_counter() - start)
    error = None if report.values_ok else report.error
    return Outcome(case, report.values_ok, report.violations, error, report.sdk, time.perf_counter() - start)


@dataclass
class Summary:
    """Counts over outcomes: ``supported`` and ``unsupported`` pairings apart."""

    kernels: int = 0
    passed: int = 0
    failed: int = 0
    numeric_failures: int = 0
    rule_violations: Counter = field(default_factory=Counter)  # rule id -> violations
    rule_kernels: Counter = field(default_factory=Counter)  # rule id -> kernels violating it

    def add(self, outcome: Outcome) -> None:
        self.kernels += 1
        self.passed += outcome.passed
        self.failed += not outcome.passed
        self.numeric_failures += not outcome.numerics_ok
        self.rule_violations.update(v.rule_id for v in outcome.violations)
        self.rule_kernels.update(outcome.rules)

    def as_dict(self) -> dict[str, object]:
        return {"kernels": self.kernels, "passed": self.passed, "failed": self.failed,
                "numeric_failures": self.numeric_failures,
                "rules": {rid: {"violations": n, "kernels": self.rule_kernels[rid]}
                          for rid, n in sorted(self.rule_violations.items())}}


def summarize(outcomes: Iterable[Outcome]) -> tuple[Summary, Summary]:
    """(supported pairings, unsupported pairings)."""
    supported, unsupported = Summary(), Summary()
    for outcome in outcomes:
        (supported if outcome.case.supported else unsupported).add(outcome)
    return supported, unsupported


def summary_lines(supported: Summary, unsupported: Summary) -> list[str]:
    lines = []
    for title, s in (("supported pairings", supported),
                     (f"unsupported pairings (expected to violate {UNSUPPORTED_RULE} only)", unsupported)):
        lines.append(f"{title}: {s.kernels} kernels, {s.passed} passed, {s.failed} failed "
                     f"({s.numeric_failures} with wrong values or no result)")
        lines += [f"  {rid}: {n} violations in {s.rule_kernels[rid]} kernels"
                  for rid, n in sorted(s.rule_violations.items())]
    return lines


def outcome_line(outcome: Outcome, *, verbose: bool = False) -> str:
    status = "ok" if outcome.passed else "FAILED"
    rules = ",".join(sorted(outcome.rules)) or "-"
    line = f"{status:6} {outcome.case.name} [{rules}] {outcome.seconds:.1f}s"
    if outcome.error:
        line += f" error: {outcome.error}"
    if verbose and outcome.violations:
        line += "".join(f"\n         {v}" for v in outcome.violations)
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=TRIALS, help="trials of each tuned case")
    parser.add_argument("--sdk", default=None, help="Neuron SDK release of the rules (default: per dialect/target)")
    parser.add_argument("--only", default=None, help="only cases whose name contains this")
    parser.add_argument("--verbose", action="store_true", help="print every violation")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the outcomes as JSON")
    args = parser.parse_args(argv)
    cases = [c for c in matrix_cases(trials=args.trials) if args.only is None or args.only in c.name]
    start = time.perf_counter()
    outcomes = []
    for case in cases:
        outcome = run_case(case, args.sdk)
        outcomes.append(outcome)
        print(outcome_line(outcome, verbose=args.verbose), flush=True)
    supported, unsupported = summarize(outcomes)
    print(f"\n{len(outcomes)} kernels in {time.perf_counter() - start:.0f} s")
    for line in summary_lines(supported, unsupported):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "supported": supported.as_dict(), "unsupported": unsupported.as_dict(),
            "kernels": [{"name": o.case.name, "family": o.case.family, "passed": o.passed, "sdk": o.sdk,
                         "rules": sorted(o.rules), "error": o.error} for o in outcomes]}, indent=2) + "\n")
    return 0 if supported.failed == 0 and unsupported.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Schedule search: Optuna (TPE) or exhaustive enumeration over a schedule space, guided by the
cost model. What a space holds and how a candidate is costed come from the lowering registry's
entries (:mod:`neuronmm_compiler.lowerings`); nothing here knows a kind of schedule."""

from .candidates import Candidate, Evaluator, SpaceSpec, TuneResult
from .space import SearchSpace
from .tuner import DEFAULT_EXHAUSTIVE_THRESHOLD, DEFAULT_TRIALS, result_from_study, search

__all__ = [
    "DEFAULT_EXHAUSTIVE_THRESHOLD",
    "DEFAULT_TRIALS",
    "Candidate",
    "Evaluator",
    "SearchSpace",
    "SpaceSpec",
    "TuneResult",
    "result_from_study",
    "search",
]

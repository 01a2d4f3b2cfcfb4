"""Schedule search: Optuna (TPE) or exhaustive enumeration over the schedule space, guided by the
cost model."""

from .space import SearchSpace, gemm_space, heuristic_guesses
from .tuner import DEFAULT_EXHAUSTIVE_THRESHOLD, DEFAULT_TRIALS, Candidate, TuneResult, distinct_size, tune_gemm

__all__ = [
    "DEFAULT_EXHAUSTIVE_THRESHOLD",
    "DEFAULT_TRIALS",
    "Candidate",
    "SearchSpace",
    "TuneResult",
    "distinct_size",
    "gemm_space",
    "heuristic_guesses",
    "tune_gemm",
]

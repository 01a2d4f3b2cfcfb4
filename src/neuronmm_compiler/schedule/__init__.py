"""Schedules: the GEMM schedule space, its presets, and lowering to loop-nest programs."""

from .gemm import (
    DEFAULT_PRESET,
    PARAMS,
    PRESETS,
    GemmProblem,
    GemmSchedule,
    normalize,
    preset,
    preset_doc,
)
from .lower_gemm import lower_gemm
from .program import Program

__all__ = [
    "DEFAULT_PRESET",
    "PARAMS",
    "PRESETS",
    "GemmProblem",
    "GemmSchedule",
    "Program",
    "lower_gemm",
    "normalize",
    "preset",
    "preset_doc",
]

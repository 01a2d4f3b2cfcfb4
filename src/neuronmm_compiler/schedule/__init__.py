"""Schedules: the GEMM schedule space, its presets, and lowering to loop-nest programs."""

from .gemm import (
    DEFAULT_PRESET,
    PARAMS,
    PRESETS,
    GemmProblem,
    GemmSchedule,
    ParamSpec,
    check_schedule,
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
    "ParamSpec",
    "Program",
    "check_schedule",
    "lower_gemm",
    "normalize",
    "preset",
    "preset_doc",
]

"""Schedules: the GEMM and fused schedule classes, their parameter specs and presets."""

from .gemm import DEFAULT_PRESET, PARAMS, PRESETS, GemmProblem, GemmSchedule, normalize, preset, preset_doc
from .params import ParamSpec, check_schedule

__all__ = [
    "DEFAULT_PRESET",
    "PARAMS",
    "PRESETS",
    "GemmProblem",
    "GemmSchedule",
    "ParamSpec",
    "check_schedule",
    "normalize",
    "preset",
    "preset_doc",
]

"""Graph passes and the pipeline driver; importing this package registers every pass."""

from . import canonicalize, fold_transposes
from .base import (
    Pass,
    PipelineResult,
    PipelineStep,
    get_pass,
    parse_pipeline,
    register_pass,
    registered_passes,
    run_pipeline,
)
from .canonicalize import Canonicalize
from .fold_transposes import FoldTransposes

#: The pipeline nmmc runs by default before scheduling.
DEFAULT_PIPELINE = "canonicalize,fold-transposes,canonicalize"

__all__ = [
    "DEFAULT_PIPELINE",
    "Canonicalize",
    "FoldTransposes",
    "Pass",
    "PipelineResult",
    "PipelineStep",
    "canonicalize",
    "fold_transposes",
    "get_pass",
    "parse_pipeline",
    "register_pass",
    "registered_passes",
    "run_pipeline",
]

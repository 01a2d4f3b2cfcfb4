"""NKI code generation: print loop-nest programs as kernel files in either NKI dialect."""

from .emit import KernelFile, check_dialect, emit_kernel
from .metadata import (
    METADATA_FORMAT,
    METADATA_PREFIX,
    KernelMetadata,
    KernelSpec,
    ScheduleRecord,
    TensorSpec,
    buffer_specs,
    read_metadata,
)
from .printer import DIALECTS

__all__ = [
    "DIALECTS",
    "METADATA_FORMAT",
    "METADATA_PREFIX",
    "KernelFile",
    "KernelMetadata",
    "KernelSpec",
    "ScheduleRecord",
    "TensorSpec",
    "buffer_specs",
    "check_dialect",
    "emit_kernel",
    "read_metadata",
]

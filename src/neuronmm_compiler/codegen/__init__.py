"""NKI code generation: print loop-nest programs as kernel files in either NKI dialect."""

from .emit import METADATA_PREFIX, KernelFile, buffer_specs, check_dialect, emit_kernel, read_metadata
from .printer import DEFAULT_DIALECT, DIALECTS

__all__ = [
    "DEFAULT_DIALECT",
    "DIALECTS",
    "METADATA_PREFIX",
    "KernelFile",
    "buffer_specs",
    "check_dialect",
    "emit_kernel",
    "read_metadata",
]

"""NKI code generation: print loop-nest programs as kernel files in either NKI dialect."""

from .. import vocab
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

#: The default ``--dialect``, as its plain string: click shows an enum default by its member name
#: (``NKI``), so the command line takes this rather than :data:`~neuronmm_compiler.vocab.DEFAULT_DIALECT`.
DEFAULT_DIALECT: str = vocab.DEFAULT_DIALECT.value

__all__ = [
    "DEFAULT_DIALECT",
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

"""NKI code generation: print loop-nest programs as kernel files in either NKI dialect."""

from .. import vocab
from .emit import METADATA_PREFIX, KernelFile, buffer_specs, check_dialect, emit_kernel, read_metadata
from .printer import DIALECTS

#: The default ``--dialect``, as its plain string: click shows an enum default by its member name
#: (``NKI``), so the command line takes this rather than :data:`~neuronmm_compiler.vocab.DEFAULT_DIALECT`.
DEFAULT_DIALECT: str = vocab.DEFAULT_DIALECT.value

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

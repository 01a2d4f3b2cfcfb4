"""The exception types nmmc raises for user-facing errors.

Every error a user can cause (bad shape, unknown target, a schedule that breaks a hardware limit,
a kernel that violates a limit in the interpreter) is a subclass of :class:`NmmcError`. The CLI
prints its message on one line and exits with code 2; anything else is an internal bug.
"""

from __future__ import annotations


class NmmcError(Exception):
    """Base class of every user-facing nmmc error."""


class InputError(NmmcError):
    """A value given by the user is malformed or out of range (shape, dtype, option)."""


class UnknownNameError(InputError):
    """A name (target, dialect, preset, parameter, pass) is not one nmmc knows."""


class ScheduleError(NmmcError):
    """A schedule is invalid for its problem or violates a limit of the target."""


class IRError(NmmcError):
    """The graph IR is malformed: raised by the verifier and by the text parser."""


class ParseError(IRError):
    """The text form of a graph could not be parsed."""


class KernelError(NmmcError):
    """The interpreter stopped an emitted kernel.

    ``line`` and ``source_line`` name the kernel source line that was executing, when known.
    """

    def __init__(self, message: str, *, line: int | None = None, source_line: str | None = None):
        self.line = line
        self.source_line = source_line
        self.bare_message = message
        where = ""
        if line is not None:
            where = f" (kernel line {line}"
            where += f": {source_line.strip()})" if source_line else ")"
        super().__init__(message + where)


class KernelLimitError(KernelError):
    """A hardware limit was violated: tile size, PSUM bank, SBUF/PSUM capacity, bounds."""


class UninitializedReadError(KernelError):
    """A kernel read on-chip or HBM memory that nothing had written."""


class UnsupportedAPIError(KernelError):
    """A kernel used an NKI call or argument outside the subset nmmc emits and interprets."""

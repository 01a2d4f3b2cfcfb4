"""Atomic file writes: the whole file under its final name, or no file at all.

Every file nmmc writes goes through :func:`atomic_path`: the content is written to a fresh temporary
file in the same directory (``.{name}.{pid}.{random}.tmp``), the file is fsynced, renamed over the
final name with ``os.replace`` (atomic on POSIX), and the directory is fsynced where the platform
allows it, so the rename survives a crash. On any failure, including ``KeyboardInterrupt``, the
temporary file is removed and the final name is untouched. A writer killed outright leaves its
temporary file behind; :func:`stale_temp_files` finds those.

Temporary files are created with ``open(..., "x")``, so they get the mode any new file gets (the
umask), not ``tempfile.mkstemp``'s 0600.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from .errors import InputError

__all__ = ["atomic_path", "stale_temp_files", "temp_name", "write_bytes_atomic", "write_output",
           "write_text_atomic"]


def temp_name(path: Path) -> Path:
    """A fresh temporary name next to ``path``: ``.{name}.{pid}.{random}.tmp`` (see :func:`stale_temp_files`)."""
    return path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def stale_temp_files(directory: Path, final_name_glob: str) -> list[Path]:
    """Temporary files left by an interrupted writer of files matching ``final_name_glob`` in ``directory``."""
    return sorted(directory.glob(f".{final_name_glob}.*.tmp"))


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` for the caller to write; then fsync it and rename it over ``path``.

    For writers that need a file name rather than a handle (safetensors' ``save_file``). The caller
    creates and closes the file inside the ``with`` block; leaving the block normally makes it
    durable and gives it the final name, leaving it by an exception removes it.
    """
    path = Path(path)
    tmp = temp_name(path)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably (see the module docstring)."""
    with atomic_path(path) as tmp, open(tmp, "xb") as handle:
        handle.write(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8, atomically and durably (see the module docstring)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_output(path: str, text: str) -> None:
    """Write a file the user named (a command's ``-o FILE``) with :func:`write_text_atomic`; a missing
    directory is an :class:`~neuronmm_compiler.errors.InputError` rather than an OSError."""
    directory = Path(path).parent
    if not directory.is_dir():
        raise InputError(f"cannot write {path!r}: directory {str(directory)!r} does not exist")
    write_text_atomic(path, text)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where directories can be opened and fsynced (not on Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

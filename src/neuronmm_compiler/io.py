"""Atomic file writes: the whole file under its final name, or no file at all.

Every file nmmc writes goes through :func:`atomic_path`: the content is written to a fresh temporary
file in the same directory (``.{name}.{pid}.{random}.tmp``), the file is fsynced, renamed over the
final name with ``os.replace`` (atomic on POSIX), and the directory is fsynced where the platform
allows it, so the rename survives a crash. On any failure, including ``KeyboardInterrupt``, the
temporary file is removed and the final name is untouched. A writer killed outright leaves its
temporary file behind; :func:`stale_temp_files` finds those.

Temporary files are created with ``open(..., "x")``, so they get the mode any new file gets (the
umask), not ``tempfile.mkstemp``'s 0600.

What an existing final name may be: a regular file (replaced), or a symbolic link, which is written
*through*: the file it points to is replaced atomically and the link is kept. Anything else (a
directory, a device such as ``/dev/null``, a FIFO, a socket) is refused with an
:class:`~neuronmm_compiler.errors.InputError` before anything is written, so a command run as root
never replaces a device node with a regular file.

:func:`check_output_file` and :func:`check_output_dir` check the paths a user names (``-o``,
``--lock``, ``--report``) before a command does any work, so a command that cannot write its
outputs fails at once, with one line, and writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from .errors import InputError

__all__ = ["atomic_path", "check_input_file", "check_output_dir", "check_output_file", "final_path", "stale_temp_files",
           "temp_name", "write_bytes_atomic", "write_output", "write_text_atomic"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def final_path(path: str | Path) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, or the file a symbolic link at
    ``path`` points to (followed to the end). InputError when that exists and is not a regular file."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # new, or under a file ('file/x'): the directory check says
        return path
    except OSError as exc:
        raise InputError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"cannot write {str(path)!r}: it is {_kind(mode)}, not a regular file")
    return path


def check_input_file(path: str | Path, what: str, expected: str = "a file") -> Path:
    """``path`` (followed through symbolic links) is a regular file to read; otherwise an InputError naming
    ``what`` (e.g. ``--calibration``) and saying what the path is instead (missing, a directory, a FIFO...)
    and what was ``expected``."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(f"{what} file not found: {path}") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"{what} {str(path)!r} is {_kind(mode)}, not a file: give {expected}")
    return path


def _check_directory(directory: Path, path: str) -> None:
    """``directory`` (where ``path`` goes) exists, is a directory and can be written."""
    if not directory.exists():
        # A component of the path is a regular file ('file/x') or is missing.
        for parent in reversed((directory, *directory.parents)):
            if parent.exists() and not parent.is_dir():
                raise InputError(f"cannot write {path!r}: {str(parent)!r} is not a directory")
        raise InputError(f"cannot write {path!r}: directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise InputError(f"cannot write {path!r}: {str(directory)!r} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {path!r}: directory {str(directory)!r} is not writable")


def check_output_file(path: str | Path) -> Path:
    """Check that a file the user named can be written, before any work: its directory exists and is
    writable, and the name is new, a regular file or a symbolic link to one. Returns the file that
    will be replaced (see :func:`final_path`); InputError otherwise."""
    target = final_path(path)
    _check_directory(target.parent, str(path))
    return target


def check_output_dir(path: str | Path) -> Path:
    """Check that an output directory the user named can be written, before any work: it is an
    existing writable directory, or it does not exist and its parent is one (the command creates
    it). InputError otherwise."""
    out = Path(path)
    if out.exists():
        if not out.is_dir():
            raise InputError(f"cannot write to {str(path)!r}: it exists and is not a directory")
        _check_directory(out, str(path))
    elif out.is_symlink():
        raise InputError(f"cannot write to {str(path)!r}: it is a symbolic link to nothing")
    else:
        _check_directory(out.parent, str(path))
    return out


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
    path = final_path(path)
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
    """Write a file the user named (a command's ``-o FILE``) with :func:`write_text_atomic`, after
    :func:`check_output_file`; a path that cannot be written is an
    :class:`~neuronmm_compiler.errors.InputError` rather than an OSError."""
    check_output_file(path)
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise InputError(f"cannot write {path!r}: {exc.strerror or exc}") from None


def write_dir_atomic(out: str | Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path -> text) as the directory ``out``, replacing a previous ``out`` as a whole: the
    files go into a fresh temporary directory next to ``out``, which is then renamed into place (an existing ``out``
    is first renamed aside and removed after), so ``out`` never mixes two runs' files and an interrupted write
    leaves the previous directory, or none, plus a ``.{name}.*.tmp`` directory. The caller has checked ``out``
    (:func:`check_output_dir`) and decided that an existing ``out`` may be replaced."""
    import shutil

    out = Path(out)
    tmp = temp_name(out)
    try:
        tmp.mkdir()
        for relative, text in sorted(files.items()):
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp / relative).write_text(text, encoding="utf-8")
        old = None
        if out.exists():
            old = temp_name(out)
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_directory(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where directories can be opened and fsynced (not on Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

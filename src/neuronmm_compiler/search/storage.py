"""Persistent Optuna storages, so a search can be resumed and shared by several processes or hosts.

Accepted URLs:

* ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (SQLAlchemy's convention): one
  file, fine for one host and a few workers.
* ``journal:///relative/path.log`` or ``journal:////absolute/path.log`` (same convention): Optuna's
  append-only journal file (``JournalStorage(JournalFileBackend(path))``); robust against a killed
  writer and good for many workers on one host or a shared (lock-capable) filesystem.
* ``postgresql://user:password@host[:port]/database`` (also ``postgresql+psycopg2://`` and
  ``postgresql+psycopg://``): for several hosts. Needs a PostgreSQL driver in the environment:
  ``pip install psycopg2-binary`` (or ``psycopg``); without one the URL is an :class:`InputError`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import optuna

from ..errors import InputError

ACCEPTED = ("sqlite:///PATH.db, journal:///PATH.log (three slashes: relative path, four: absolute), "
            "postgresql://USER:PASSWORD@HOST[:PORT]/DATABASE")
_POSTGRES_PREFIXES = ("postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://")


def storage_kind(url: str) -> str:
    """``"sqlite"``, ``"journal"`` or ``"postgresql"``; InputError for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise InputError(f"empty storage URL; accepted forms: {ACCEPTED}")
    for prefix, kind in (("sqlite:///", "sqlite"), ("journal:///", "journal")):
        if url.startswith(prefix):
            if not url[len(prefix):].strip("/"):
                raise InputError(f"storage URL {url!r} names no file; accepted forms: {ACCEPTED}")
            return kind
    if url.startswith(_POSTGRES_PREFIXES):
        return "postgresql"
    raise InputError(f"unsupported storage URL {url!r}; accepted forms: {ACCEPTED}")


def check_storage(url: str, *, must_exist: bool = False) -> str:
    """Check a storage URL before any work, creating nothing; its kind (see :func:`storage_kind`).

    For a file storage (sqlite, journal): the file, when it exists, must be a regular file, and
    otherwise the nearest existing directory above it must be writable (``nmmc tune`` creates the
    file and any missing directories). With ``must_exist`` (``nmmc report``, which reads a study)
    the file must exist. A PostgreSQL URL is only checked for its form and driver here."""
    import os

    kind = storage_kind(url)
    if kind == "postgresql":
        _postgres_url(url)
        return kind
    path = Path(url[len(f"{kind}:///"):])
    if path.exists():
        if not path.is_file():
            raise InputError(f"storage {url!r}: {str(path)!r} is not a regular file")
        return kind
    if must_exist:
        raise InputError(f"storage {url!r}: no such file {str(path)!r} (a study is written by "
                         f"'nmmc tune --storage {url}')")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"storage {url!r}: {str(ancestor)!r} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"storage {url!r}: directory {str(ancestor)!r} is not writable")
    return kind


def _file_path(url: str, prefix: str) -> Path:
    path = Path(url[len(prefix):])
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _sqlite_pragmas(connection: object, _record: object) -> None:
    cursor = connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _fast_sqlite(storage: optuna.storages.RDBStorage) -> None:
    """Every connection of ``storage`` in WAL mode with ``synchronous=NORMAL``: a commit appends to the
    write-ahead log without waiting for the disk, where SQLite's default (a rollback journal, FULL) syncs
    the file at each of the ~20 commits Optuna makes per trial (one per suggested parameter): that was
    most of a stored search's time (issue 28: ~12x the in-memory search). WAL keeps readers and one writer
    concurrent, so workers and processes sharing the file wait less; a crash of the process loses nothing,
    a power loss at most the last trials (the file stays consistent, and a rerun runs them again). WAL
    needs the file on a local filesystem, as the sqlite storage already does (one host)."""
    from sqlalchemy import event

    event.listen(storage.engine, "connect", _sqlite_pragmas)
    storage.engine.dispose()  # the connection RDBStorage opened to create the schema predates the listener


def _postgres_url(url: str) -> str:
    has_psycopg2 = importlib.util.find_spec("psycopg2") is not None
    has_psycopg = importlib.util.find_spec("psycopg") is not None
    if url.startswith("postgresql+psycopg2://") and not has_psycopg2:
        raise InputError("storage URL uses psycopg2, which is not installed: pip install psycopg2-binary")
    if url.startswith("postgresql+psycopg://") and not has_psycopg:
        raise InputError("storage URL uses psycopg (3), which is not installed: pip install psycopg")
    if url.startswith("postgresql://"):
        # Name the driver: SQLAlchemy's default for plain postgresql:// differs between versions.
        if has_psycopg2:
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
        if has_psycopg:
            return "postgresql+psycopg://" + url[len("postgresql://"):]
        raise InputError("a postgresql:// storage needs a PostgreSQL driver: pip install psycopg2-binary "
                         "(or psycopg)")
    return url


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage behind ``url`` (see the module docstring for the accepted forms)."""
    kind = storage_kind(url)
    if kind == "journal":
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(_file_path(url, "journal:///"))))
    if kind == "sqlite":
        _file_path(url, "sqlite:///")
        # Several workers write one file: wait for the lock rather than fail after SQLite's 5 s.
        storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 120}})
        _fast_sqlite(storage)
        return storage
    try:
        return optuna.storages.RDBStorage(_postgres_url(url), engine_kwargs={"pool_pre_ping": True})
    except InputError:
        raise
    except Exception as exc:  # SQLAlchemy's OperationalError and friends: unreachable server, bad password
        raise InputError(f"cannot open storage {_redact(url)}: {exc.__class__.__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc


def _redact(url: str) -> str:
    """The URL with any password replaced, for messages."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"

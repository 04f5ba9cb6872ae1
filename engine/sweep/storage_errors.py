"""A sweep's storage that cannot serve it, as one line a person can act on (SweepError, exit code 2).

The storage libraries report a damaged, locked or read-only study.db in their own terms (SQLAlchemy's
DatabaseError wrapping sqlite's "file is not a database", Optuna's StorageInternalError). `storage_errors`
turns each kind into what happened to which file and what to do about it; sqlite's short message is the
one stable thing to tell the kinds apart by, beside what the file system itself says about the path.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import optuna
from sqlalchemy import exc as sa_exc

from engine.sweep.errors import SweepError
from engine.sweep.storage import StorageSpec

_FAILURES = (sa_exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, sqlite3.Error)


@contextlib.contextmanager
def storage_errors(spec: StorageSpec, sweep_dir: Path) -> Iterator[None]:
    """Run the block; a failure of the study's storage leaves it as a SweepError of one line."""
    try:
        yield
    except _FAILURES as exc:
        raise SweepError(explain(exc, spec, Path(sweep_dir))) from None


def explain(exc: BaseException, spec: StorageSpec, sweep_dir: Path) -> str:
    """What went wrong with the storage, where, and the fix."""
    said = _database_message(exc)
    if spec.kind != "sqlite":
        return (f"{spec.describe(sweep_dir)}: the study's storage failed ({said}); check that it is "
                "reachable and writable, then run this again")
    path = spec.path(sweep_dir)
    fresh = ("move it away to start a new study in this folder, or start one under another name "
             "(--study NAME)")
    low = said.lower()
    if path.is_dir():
        return f"{path} is a folder, not the study's SQLite database: {fresh}"
    if "not a database" in low:
        return f"{path} is not a SQLite database (damaged, or another kind of file): {fresh}"
    if "malformed" in low or "corrupt" in low:
        return (f"{path} is damaged (its SQLite data is cut short or corrupt): restore it from a backup, "
                f"or {fresh}")
    if "locked" in low or "busy" in low:
        return (f"{path} is locked by another process (a sweep of this study still running, or a tool "
                "holding it open): wait for it to finish, or stop it, then run this again")
    if "readonly" in low or "read-only" in low or not _writable(path):
        return (f"{path} cannot be written (a read-only file, folder or file system): make the file and "
                "its folder writable, or copy the sweep folder somewhere writable and run it from there "
                "(--set run.out_dir=...)")
    if "full" in low:
        return f"{path}: the disk is full; free some space, then run this again"
    return f"{path}: the study's SQLite database failed ({said}): {fresh}"


def _writable(path: Path) -> bool:
    """Whether sqlite could write here: the file (when there is one) and its folder, which holds the
    journal sqlite writes beside it. os.access also answers for a read-only mount, for root too."""
    file_ok = not path.exists() or os.access(path, os.W_OK)
    return file_ok and os.access(path.parent, os.W_OK)


def _database_message(exc: BaseException) -> str:
    """The database's own short message (sqlite's "database is locked"), without the SQL statement and
    the links the wrappers add; else the first line of the error."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlite3.Error):
            return str(seen).strip() or type(seen).__name__
        if isinstance(seen, sa_exc.DBAPIError) and seen.orig is not None:
            return str(seen.orig).strip() or type(seen.orig).__name__
        seen = seen.__cause__ or seen.__context__
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__

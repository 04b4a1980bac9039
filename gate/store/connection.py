"""Opening the database: connect, pragmas (WAL, synchronous=FULL), the flock, migrations."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from pathlib import Path

from gate.errors import Unavailable
from gate.store.schema import MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger(__name__)
# aiosqlite (still installed for tools) logs statements with parameters at DEBUG: never.
logging.getLogger("aiosqlite").setLevel(logging.INFO)

BUSY_TIMEOUT_MS = 10_000
IN_USE = "database in use by another hitl-gate process"


def connect(path: Path) -> sqlite3.Connection:
    """Open ``path`` in autocommit mode (transactions are explicit), rows as ``sqlite3.Row``,
    ``busy_timeout`` ``BUSY_TIMEOUT_MS`` ms, foreign keys on; usable from any one thread."""
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def open_reader(path: Path) -> sqlite3.Connection:
    """The daemon's read connection: ``connect`` with ``PRAGMA query_only`` (it sees the last
    committed state, WAL). Not the read-only opener of the offline tools (``auditlog``)."""
    conn = connect(path)
    conn.execute("PRAGMA query_only = ON")
    return conn


def open_writer(path: Path) -> sqlite3.Connection:
    """The write connection of an already prepared database (``prepare``): WAL,
    synchronous=FULL. Used by the writer process, which opens its own after the fork."""
    conn = connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def lock(path: Path) -> int:
    """Take the exclusive ``flock`` on ``<path>.lock`` and return its fd (closing the fd
    releases it). Raises Unavailable ``storage_unavailable`` ("database in use by another
    hitl-gate process", naming the holders' pids when visible) when another process holds it."""
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holders = lock_holders(Path(f"{path}.lock"))
        named = f" (pid {', '.join(map(str, holders))})" if holders else ""
        raise Unavailable("storage_unavailable", f"{IN_USE}{named}: {path}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def prepare(path: Path) -> sqlite3.Connection:
    """Create ``path`` (its folder exists) if needed (mode 0600 whatever the umask: drafts,
    bodies, permits and nonces are its owner's only; SQLite gives -wal/-shm its mode), enable
    WAL and synchronous=FULL, run the migrations; return the write connection. The caller holds the
    ``lock``. Raises Unavailable when WAL cannot be enabled or the schema is newer than this
    code, sqlite3.Error/OSError when the file cannot be opened."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    conn = connect(path)
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise Unavailable("storage_unavailable", f"could not enable WAL (got {mode})")
        conn.execute("PRAGMA synchronous = FULL")
        migrate(conn)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        raise
    return conn


def migrate(conn: sqlite3.Connection) -> None:
    """Apply the migrations past ``PRAGMA user_version`` (``schema.MIGRATIONS``), each in its
    own ``BEGIN IMMEDIATE``; logs ``event=migrated schema_version=N`` for each. Raises
    Unavailable when the database's schema is newer than ``SCHEMA_VERSION``."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise Unavailable(
            "storage_unavailable",
            f"database schema {version} is newer than this gate ({SCHEMA_VERSION})",
        )
    for index in range(version, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[index]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {index + 1}")
            conn.execute("COMMIT")
        except BaseException:
            rollback_quietly(conn)
            raise
        log.info("event=migrated schema_version=%d", index + 1)


def rollback_quietly(conn: sqlite3.Connection) -> None:
    """ROLLBACK, ignoring "no transaction is active" (SQLite already rolled back a COMMIT
    that failed on SQLITE_FULL/IOERR)."""
    with contextlib.suppress(sqlite3.Error):
        conn.execute("ROLLBACK")


def lock_holders(lock_path: Path) -> list[int]:
    """Pids of the processes with ``lock_path`` open (from /proc/*/fd; the ones this user may
    see), for the "in use" error: after a kill -9 of a gate its writer process may still
    hold the lock (a stopped one, until it is continued or killed)."""
    holders = []
    target = str(lock_path.resolve())  # /proc/*/fd links name the resolved path
    try:
        processes = list(Path("/proc").iterdir())
    except OSError:  # no /proc: the error names no pid
        return []
    for entry in processes:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                holders.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to look at
            continue
    return sorted(holders)


def release(fd: int) -> None:
    """Release the ``lock`` held on ``fd`` (closes it)."""
    os.close(fd)

"""Opening and closing the store: SQLite's lock, the file's pragmas and migrations, or
PostgreSQL's migration under its advisory lock; then the writer (a thread, or the forked
writer process) and the read connection, in the order each needs."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

from gate.clock import PinnedClock
from gate.errors import Unavailable
from gate.postgres.target import PgTarget
from gate.store import connection, pg_backend, writer_process
from gate.store.backend import SqliteSide, WriteSide
from gate.store.batch import Faults, Handler, Writer
from gate.store.pg_backend import PgSide
from gate.store.reads import Reads
from gate.store.writer_thread import ThreadWriter

# where the data is: a SQLite file, or a PostgreSQL database
Where = Path | PgTarget


async def start(
    where: Where,
    fork: bool,
    run: Handler,
    faults: Faults,
    lost: Callable[[], None],
    reads: Reads,
    locks: list[int],
    clock: PinnedClock | None = None,
) -> Writer:
    """Prepare the database and open ``reads``; return the writer that runs ``run``: the
    forked writer process when ``fork`` (``lost`` is called if it dies; no thread may exist
    yet, and no connection crosses the fork: the writer opens its own), else a thread of
    this process. SQLite: take the file's ``flock`` (appended to ``locks``: one gate per
    file). PostgreSQL: no lock (N gates share the database); ``clock`` is pinned to the
    database's time during each write batch. Raises Unavailable 503 ``storage_unavailable``
    for a database that cannot be opened or is newer than this gate; the caller closes
    what was opened (``stop``)."""
    if isinstance(where, PgTarget):
        return await _start_postgres(where, fork, run, faults, lost, reads, clock)
    path = where

    def prepare() -> sqlite3.Connection:
        path.parent.mkdir(parents=True, exist_ok=True)
        locks.append(connection.lock(path))
        return connection.prepare(path)

    def prepare_with_reads() -> sqlite3.Connection:
        conn = prepare()
        try:
            reads.open(path)
        except BaseException:
            conn.close()
            raise
        return conn

    try:
        if fork:
            prepare().close()  # on this thread: no thread may exist at the fork

            def open_side() -> WriteSide:
                return SqliteSide(connection.open_writer(path))

            writer: Writer = await writer_process.start(open_side, str(path), run, faults, lost)
            reads.open(path)
            return writer
        conn = await asyncio.to_thread(prepare_with_reads)
        return ThreadWriter(SqliteSide(conn), run, faults, asyncio.get_running_loop())
    except (sqlite3.Error, OSError) as exc:
        raise Unavailable("storage_unavailable", f"cannot open database {path}: {exc}") from exc


async def _start_postgres(
    target: PgTarget,
    fork: bool,
    run: Handler,
    faults: Faults,
    lost: Callable[[], None],
    reads: Reads,
    clock: PinnedClock | None,
) -> Writer:
    """``start`` on PostgreSQL: migrate (on this thread: none may exist at the fork), then
    the writer, then the reads."""
    pg_backend.prepare(target)

    def open_side() -> WriteSide:
        return PgSide(target, clock)

    try:
        if fork:
            writer: Writer = await writer_process.start(open_side, str(target), run, faults, lost)
        else:
            side = await asyncio.to_thread(open_side)
            writer = ThreadWriter(side, run, faults, asyncio.get_running_loop())
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"cannot open database {target}: {exc}") from exc
    try:
        await asyncio.to_thread(reads.open, target)
    except BaseException as exc:
        await writer.close()
        if isinstance(exc, sqlite3.Error):
            message = f"cannot open database {target}: {exc}"
            raise Unavailable("storage_unavailable", message) from exc
        raise
    return writer


async def stop(writer: Writer | None, reads: Reads, locks: list[int]) -> None:
    """Finish the writer's queued transactions, close the read connection, release the
    locks in ``locks`` (emptied). Idempotent."""
    if writer is not None:
        await writer.close()
    reads.close()
    while locks:
        connection.release(locks.pop())

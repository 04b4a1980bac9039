"""Opening and closing the store: the lock, the file's pragmas and migrations, the writer
(a thread, or the forked writer process) and the read connection, in the order each needs."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

from gate.errors import Unavailable
from gate.store import connection, writer_process
from gate.store.batch import Faults, Handler, Writer
from gate.store.reads import Reads
from gate.store.writer_thread import ThreadWriter


async def start(
    path: Path,
    fork: bool,
    run: Handler,
    faults: Faults,
    lost: Callable[[], None],
    reads: Reads,
    locks: list[int],
) -> Writer:
    """Take the database's ``flock`` (appended to ``locks``), prepare the file and open
    ``reads``; return the writer that runs ``run``: the forked writer process when ``fork``
    (``lost`` is called if it dies; no thread may exist yet, and no connection crosses the
    fork: the writer opens its own), else a thread of this process. Raises Unavailable 503
    ``storage_unavailable`` for a file that cannot be opened; the caller closes what was
    opened (``stop``)."""

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
            writer: Writer = await writer_process.start(path, run, faults, lost)
            reads.open(path)
            return writer
        conn = await asyncio.to_thread(prepare_with_reads)
        return ThreadWriter(conn, run, faults, asyncio.get_running_loop())
    except (sqlite3.Error, OSError) as exc:
        raise Unavailable("storage_unavailable", f"cannot open database {path}: {exc}") from exc


async def stop(writer: Writer | None, reads: Reads, locks: list[int]) -> None:
    """Finish the writer's queued transactions, close the read connection, release the
    locks in ``locks`` (emptied). Idempotent."""
    if writer is not None:
        await writer.close()
    reads.close()
    while locks:
        connection.release(locks.pop())

"""Store: one writer thread (group commit), one reader thread; WAL, synchronous=FULL."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from gate.audit import chain as audit
from gate.errors import Unavailable
from gate.store import writer_process as writerproc
from gate.store.schema import MIGRATIONS, SCHEMA_VERSION
from gate.store.tx import WriteTx, load_full

log = logging.getLogger(__name__)
# aiosqlite (still installed for tools) logs statements with parameters at DEBUG: never.
logging.getLogger("aiosqlite").setLevel(logging.INFO)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000
PROBE_INTERVAL_S = 1.0
MAX_BATCH = 256  # transactions sharing one COMMIT (one fsync)
AUDIT_CHUNK = 2000
IN_USE = "database in use by another hitl-gate process"
# Primary SQLite result codes that mean "the environment refuses writes" (disk full, read-only
# file or mount, I/O error, ...), as opposed to a constraint or a bug: they mark a storage fault.
_FAULT_CODES = frozenset(
    {
        3,  # SQLITE_PERM
        5,  # SQLITE_BUSY
        6,  # SQLITE_LOCKED
        8,  # SQLITE_READONLY
        10,  # SQLITE_IOERR
        11,  # SQLITE_CORRUPT
        13,  # SQLITE_FULL
        14,  # SQLITE_CANTOPEN
        26,  # SQLITE_NOTADB
    }
)


def _is_fault(exc: sqlite3.Error) -> bool:
    """True for a failure of the storage itself (see ``_FAULT_CODES``)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return isinstance(exc, sqlite3.OperationalError)
    return (code & 0xFF) in _FAULT_CODES


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


class Command(NamedTuple):
    """A write transaction by name, with picklable arguments (``Store.transact``).

    ``name`` is ``"probe"`` (the store's own) or one the bound handler knows
    (``Store.bind``; ``gate.core.service.TRANSACTIONS``).
    """

    name: str
    args: tuple[Any, ...] = ()


PROBE = Command("probe")


class _Job:
    """One transaction waiting for the writer (thread or process)."""

    __slots__ = ("fn", "future", "cancelled", "id", "command")

    def __init__(
        self,
        fn: Callable[[WriteTx], Any],
        future: asyncio.Future[Any] | None,
        job_id: int = 0,
        command: Command | None = None,
    ) -> None:
        self.fn = fn
        self.future = future
        self.cancelled = False  # set by the caller when it stops waiting before the job ran
        self.id = job_id
        self.command = command


class Store:
    """The gate's SQLite database.

    All writes go through ``transact(command)``: the transaction runs synchronously on the
    one writer, a thread of this process or (``writer_process=True``, what ``gate serve``
    uses) a process of its own forked at ``open`` (``gate.store.writer_process``: the web
    process's GIL is then not shared with the writer's work). The writer takes every
    transaction waiting (up to ``MAX_BATCH``), runs them inside one ``BEGIN IMMEDIATE``
    transaction, each in its own SAVEPOINT (a refused or failing one rolls back alone),
    COMMITs once (one fsync for the batch: group commit), and only then answers each
    caller. A batch that appended audit entries then logs the chain head its COMMIT left,
    one INFO line ``event=audit_head seq=N hash=H`` (its newest entry's seq and entry hash;
    ``log_head``): an anchor held outside the database file (``audit verify
    --expect-head``). Reads use a second connection on its own thread, one call per read,
    and see the last committed state (WAL).

    The database is held with an exclusive ``flock`` on ``<db>.lock`` while open, so a second
    gate on the same file is refused (Unavailable, "database in use by another hitl-gate
    process").

    Storage faults (disk full, file made read-only, I/O errors) make the failing batch roll
    back and raise Unavailable (503 ``storage_unavailable``); the connection stays usable,
    so writes succeed again as soon as the fault is fixed, without a restart.
    ``write_fault`` holds the last fault's message until a write succeeds again
    (``check_writable`` probes for that).
    """

    def __init__(self, path: Path, *, writer_process: bool = False) -> None:
        self.path = Path(path)
        self.writer_process = writer_process
        self._handler: Callable[[WriteTx, Command], Any] | None = None
        self._client: writerproc.WriterClient | None = None
        # the writer process was lost unexpectedly; ``on_writer_lost()`` is then called once
        # (``gate serve`` stops, and exits 1 for a restart)
        self.writer_lost = False
        self.on_writer_lost: Callable[[], None] | None = None
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._read_pool: ThreadPoolExecutor | None = None
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock_fd: int | None = None
        self._probing = False
        # (seq, entry_hash) of the newest entry the last commit appended, until ``log_head``
        self._unlogged_head: tuple[int, str] | None = None
        self.write_fault: str | None = None
        self._probed_at = 0.0

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid, or None (a writer thread, or not open)."""
        return None if self._client is None else self._client.pid

    @property
    def writer_unanswered_s(self) -> float:
        """Seconds the oldest transaction sent to the writer process has waited for its
        answer (0.0 when none waits, and always with a writer thread): what the health check
        compares with ``writerproc.STALL_S``, and ``/metrics`` shows."""
        return 0.0 if self._client is None else self._client.stalled_s()

    @property
    def unsent_bytes(self) -> int:
        """Bytes of jobs, cancellations and configuration sent to the writer process that
        are not in its socket yet (0 with a writer thread). Once 0, their order is fixed:
        the writer reads the cancellations in its socket before each job of a batch."""
        return 0 if self._client is None else self._client.unsent_bytes

    def bind(self, handler: Callable[[WriteTx, Command], Any]) -> None:
        """Set what runs a ``Command`` other than ``probe``: ``handler(tx, command)`` on the
        writer (in the writer process: the process's copy of it, forked at ``open``;
        ``tx`` is None for a command sent with ``apply``). Call before ``open``."""
        self._handler = handler

    # ---- open / close ----------------------------------------------------------------

    async def open(self) -> None:
        """Open (creating if needed) the file, set WAL + synchronous=FULL, run migrations.

        With ``writer_process`` this forks the writer process: call it before the process
        starts any thread. Raises Unavailable when the file cannot be opened, is newer than
        this code, or is in use by another running gate.
        """
        try:
            if self.writer_process:
                await self._start_writer_process()
            else:
                await asyncio.to_thread(self._open_sync)
        except (sqlite3.Error, OSError) as exc:
            await self._close_client()
            self._close_sync()
            raise Unavailable(
                "storage_unavailable", f"cannot open database {self.path}: {exc}"
            ) from exc
        except BaseException:
            await self._close_client()
            self._close_sync()
            raise
        self._loop = asyncio.get_running_loop()
        self._read_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate-reader")
        if not self.writer_process:
            self._thread = threading.Thread(
                target=self._run_writer, name="gate-writer", daemon=True
            )
            self._thread.start()

    async def _start_writer_process(self) -> None:
        # on this thread: no thread may exist when the writer is forked
        self._open_sync(reader=False)
        assert self._writer is not None
        self._writer.close()  # a connection must not cross a fork: the writer opens its own
        self._writer = None
        self._client = await writerproc.start(self, self._open_writer)
        self._open_reader()

    def _open_writer(self) -> None:
        """In the writer process: open the write connection. The inherited lock fd stays
        open: after a kill -9 of the web process the lock holds until the writer, which
        may still finish a batch, is gone too."""
        self._writer = _connect(self.path)
        self._writer.execute("PRAGMA journal_mode = WAL")
        self._writer.execute("PRAGMA synchronous = FULL")

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _lock_file(self) -> None:
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holders = _lock_holders(Path(f"{self.path}.lock"))
            named = f" (pid {', '.join(map(str, holders))})" if holders else ""
            raise Unavailable("storage_unavailable", f"{IN_USE}{named}: {self.path}") from None
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _open_sync(self, reader: bool = True) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file()
        # a new database (drafts, final bodies, permits, nonces of pending approvals) is
        # readable by its owner only, whatever the umask; SQLite gives -wal/-shm its mode
        with contextlib.suppress(FileExistsError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        self._writer = _connect(self.path)
        mode = self._writer.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise Unavailable("storage_unavailable", f"could not enable WAL (got {mode})")
        self._writer.execute("PRAGMA synchronous = FULL")
        self._migrate(self._writer)
        if reader:
            self._open_reader()

    def _open_reader(self) -> None:
        self._reader = _connect(self.path)
        self._reader.execute("PRAGMA query_only = ON")

    async def close(self) -> None:
        """Finish the queued transactions, close both connections, release the lock (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
        await self._close_client()
        pool, self._read_pool = self._read_pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._close_sync()

    def _close_sync(self) -> None:
        for conn in (self._reader, self._writer):
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
        self._reader = self._writer = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
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
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            log.info("event=migrated schema_version=%d", index + 1)

    # ---- health --------------------------------------------------------------------

    async def schema_version(self) -> int:
        """Return ``PRAGMA user_version`` (what ``/healthz`` reports).

        Raises Unavailable 503 ``storage_unavailable`` while the database refuses writes
        (``check_writable``), so a health check sees a full disk or a read-only file.
        """
        await self.check_writable()
        return int(
            await self._read_call(lambda conn: conn.execute("PRAGMA user_version").fetchone()[0])
        )

    async def check_writable(self) -> None:
        """Raise Unavailable while the last write failed on a storage fault, or while the
        writer process has left a transaction unanswered for over ``writerproc.STALL_S``.

        At most once per ``PROBE_INTERVAL_S`` a probe transaction rewrites the database
        header (``PRAGMA user_version`` set to its own value, committed: it needs room in
        the WAL and a writable file); once it commits, the fault is over.
        """
        if self._client is not None:
            stalled = self._client.stalled_s()
            if stalled > writerproc.STALL_S:
                raise Unavailable(
                    "storage_unavailable",
                    f"the database writer process has not answered for {stalled:.0f} s",
                )
        if self.write_fault is None:
            return
        if time.monotonic() - self._probed_at >= PROBE_INTERVAL_S and not self._probing:
            self._probed_at = time.monotonic()
            self._probing = True
            try:
                await self.transact(PROBE)
            except Unavailable:
                pass
            else:
                self._recovered()
            finally:
                self._probing = False
        if self.write_fault is not None:
            raise Unavailable("storage_unavailable", f"database refuses writes: {self.write_fault}")

    def _faulted(self, exc: sqlite3.Error) -> None:
        if _is_fault(exc):
            if self.write_fault is None:
                log.error("event=storage_unavailable db=%s error=%s", self.path, exc)
            self.write_fault = str(exc)

    def _recovered(self) -> None:
        if self.write_fault is not None:
            log.warning("event=storage_recovered db=%s", self.path)
            self.write_fault = None

    # ---- writes (writer thread) --------------------------------------------------------

    async def transact(self, command: Command | Callable[[WriteTx], T]) -> Any:
        """Run ``command`` in a write transaction on the writer; return its result.

        ``command`` is a ``Command`` (run by ``probe`` or the bound handler) or, with a
        writer thread only, a function ``fn(tx)``. Returns only after the transaction
        committed (on disk with synchronous=FULL). An exception raised by the transaction
        rolls back what it did (and only that) and is raised here; sqlite3 errors become
        Unavailable (503). A transaction commits whole or not at all: when the caller is
        cancelled before it started, it never runs (a writer process: when the cancellation
        reached its socket before the job started, see ``unsent_bytes``); once it started,
        it finishes and commits. Raises TypeError for a function when the writer is a
        process.
        """
        if self._client is not None:
            if not isinstance(command, Command):
                raise TypeError("the writer process runs Command objects only")
            return await self._client.transact(command)
        if self._thread is None or self._loop is None:
            raise Unavailable("storage_unavailable", "database is not open")
        if isinstance(command, Command):
            fn: Callable[[WriteTx], Any] = functools.partial(self.run_command, command=command)
        else:
            fn = command
        future: asyncio.Future[Any] = self._loop.create_future()
        job = _Job(fn, future)
        self._queue.put(job)
        try:
            return await future
        except asyncio.CancelledError:
            job.cancelled = True
            raise

    def apply(self, command: Command) -> None:
        """Have the writer process run ``command`` with its bound handler outside any
        transaction (``tx`` None), after what was sent before it: configuration its copy
        of the service must share. With a writer thread this does nothing (the thread
        shares this process's objects: the caller has applied it already)."""
        if self._client is not None:
            self._client.apply(command)

    def run_command(self, tx: WriteTx, command: Command) -> Any:
        """Writer side: run ``command`` in ``tx`` (``probe``, else the bound handler)."""
        if command == PROBE:
            return tx.probe()
        if self._handler is None:
            raise RuntimeError(f"no handler bound for {command.name!r}")
        return self._handler(tx, command)

    def apply_command(self, command: Command) -> None:
        """Writer process side of ``apply``."""
        if self._handler is not None:
            self._handler(None, command)  # type: ignore[arg-type]

    def run_jobs(
        self, batch: list[_Job], before_job: Callable[[], None]
    ) -> list[tuple[_Job, Any, BaseException | None]]:
        """Writer process side: run ``batch`` as one group commit (``_run_batch``);
        ``before_job()`` is called before each job, once the transaction began."""
        return self._run_batch(batch, before_job)

    def abandon_batch(self) -> None:
        """Writer process side: roll back whatever a failed batch left open."""
        if self._writer is not None:
            _rollback_quietly(self._writer)

    def writable_again(self) -> None:
        """Writer process side: a probe committed, so the storage fault is over."""
        self._recovered()

    def _run_writer(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                batch.append(job)
            try:
                answers = self._run_batch(batch)
            except Exception as exc:  # a bug in the batch runner: fail the batch, keep serving
                log.exception("event=writer_failed")
                _rollback_quietly(self._writer) if self._writer is not None else None
                answers = [(job, None, exc) for job in batch]
            self._deliver(answers)
            self.log_head()

    def _run_batch(
        self, batch: list[_Job], before_job: Callable[[], None] | None = None
    ) -> list[tuple[_Job, Any, BaseException | None]]:
        """Run ``batch`` in one transaction; return each job's (result, error).
        ``before_job()`` runs before each job, after ``BEGIN IMMEDIATE`` succeeded (which may
        have waited on the lock): the writer process reads the cancellations that arrived
        meanwhile (the writer thread sees them set on the job directly)."""
        conn = self._writer
        assert conn is not None
        answers: list[tuple[_Job, Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._faulted(exc)
            error = Unavailable("storage_unavailable", f"database write failed: {exc}")
            return [(job, None, error) for job in batch]
        changes = conn.total_changes
        tx = WriteTx(conn)
        done: list[tuple[_Job, Any]] = []
        for index, job in enumerate(batch):
            if before_job is not None:
                before_job()
            if job.cancelled:
                continue
            tx.job_started()
            try:
                conn.execute("SAVEPOINT job")
                try:
                    result = job.fn(tx)
                except sqlite3.Error:
                    raise
                except BaseException as exc:  # refused (GateError) or a bug: undo this job only
                    tx.forget_tail()
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    answers.append((job, None, exc))
                    continue
                conn.execute("RELEASE job")
            except sqlite3.Error as exc:
                tx.forget_tail()
                if not _is_fault(exc) and conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK TO job")
                        conn.execute("RELEASE job")
                    if conn.in_transaction:  # e.g. a constraint: this job alone fails
                        answers.append(
                            (
                                job,
                                None,
                                Unavailable("storage_unavailable", f"database write failed: {exc}"),
                            )
                        )
                        continue
                # the transaction is lost: fail what ran, run the rest in a new one
                _rollback_quietly(conn)
                self._faulted(exc)
                error = Unavailable("storage_unavailable", f"database write failed: {exc}")
                answers += [(j, None, error) for j, _ in done] + [(job, None, error)]
                rest = batch[index + 1 :]
                return answers + (self._run_batch(rest, before_job) if rest else [])
            done.append((job, result))
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback_quietly(conn)
            self._faulted(exc)
            error = Unavailable("storage_unavailable", f"database write failed: {exc}")
            return answers + [(job, None, error) for job, _ in done]
        if conn.total_changes != changes:  # rows reached the disk: the storage works
            self._recovered()
        if tx.appended_head is not None:
            self._unlogged_head = tx.appended_head  # logged once the callers are answered
        return answers + [(job, result, None) for job, result in done]

    def log_head(self) -> None:
        """Writer side, after a batch's callers were answered (off their path): log the
        chain head its COMMIT left, ``event=audit_head seq=N hash=H``, when it appended
        audit entries; else nothing. An anchor for whoever keeps the log (auditing.md)."""
        head, self._unlogged_head = self._unlogged_head, None
        if head is not None:
            log.info("event=audit_head seq=%d hash=%s", *head)

    def _deliver(self, answers: list[tuple[_Job, Any, BaseException | None]]) -> None:
        if not answers or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(_settle, answers)

    # ---- reads (reader thread) -------------------------------------------------

    async def _read_call(self, fn: Callable[..., T], *args: Any) -> T:
        conn, pool = self._reader, self._read_pool
        if conn is None or pool is None:
            raise Unavailable("storage_unavailable", "database is not open")
        with _reading():
            return await asyncio.get_running_loop().run_in_executor(pool, fn, conn, *args)

    async def fetch_approval(self, approval_id: str) -> dict[str, Any] | None:
        """Return the approval with its revisions, decisions and dispatch, or None."""
        return await self._read_call(_snapshot, load_full, approval_id)

    async def list_approvals(
        self, state: str, pipeline: str | None, limit: int, after: str | None
    ) -> list[dict[str, Any]]:
        """Return up to ``limit`` approvals ordered by approval_id (ULID: creation order).

        ``state`` is pending|resolved|all; ``after`` is the cursor (last approval_id seen).
        """
        where: list[str] = []
        args: list[Any] = []
        if state != "all":
            where.append("state = ?")
            args.append(state)
        if pipeline:
            where.append("pipeline = ?")
            args.append(pipeline)
        if after:
            where.append("approval_id > ?")
            args.append(after)
        sql = "SELECT approval_id FROM approvals"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY approval_id LIMIT ?"
        args.append(limit)

        def page(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            ids = [row[0] for row in conn.execute(sql, args).fetchall()]
            return [full for full in (load_full(conn, i) for i in ids) if full is not None]

        return await self._read_call(_snapshot, page)

    async def _scalar(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        def run(conn: sqlite3.Connection) -> Any:
            row = conn.execute(sql, args).fetchone()
            return None if row is None else row[0]

        return await self._read_call(run)

    async def pending_summary(self) -> tuple[int, int | None]:
        """Return ``(number of pending approvals, earliest created_at in unix ms or None)``."""

        def run(conn: sqlite3.Connection) -> tuple[int, int | None]:
            count, oldest = conn.execute(
                "SELECT COUNT(*), MIN(created_at) FROM approvals INDEXED BY"
                " approvals_pending_expiry WHERE state = 'pending'"
            ).fetchone()
            return int(count), None if oldest is None else int(oldest)

        return await self._read_call(run)

    async def next_expiry(self) -> int | None:
        """Return the earliest ``expires_at`` (unix ms) among pending approvals, or None."""
        value = await self._scalar(
            "SELECT MIN(expires_at) FROM approvals INDEXED BY approvals_pending_expiry"
            " WHERE state = 'pending'"
        )
        return None if value is None else int(value)

    async def dispatch_plan(
        self, now_ms: int, limit: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        """Return ``(due, next_at)`` from one snapshot (one thread hop): up to ``limit``
        un-acked outbox rows due at ``now_ms`` for pending approvals' current revision
        (``approval_id``, ``revision``, ``attempts``, ``next_attempt_at``; earliest first),
        and the earliest ``next_attempt_at`` (unix ms) of any un-acked live dispatch, due
        or not, or None when there is none."""

        def run(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int | None]:
            due = [dict(row) for row in conn.execute(_DUE_DISPATCHES, (now_ms, limit))]
            first = conn.execute(_NEXT_DISPATCH).fetchone()
            return due, None if first is None else int(first[0])

        return await self._read_call(_snapshot, run)

    async def audit_rows(self) -> AsyncIterator[audit.AuditRow]:
        """Yield every audit row in ascending seq (with its key id and signature, if signed),
        read in chunks (constant memory)."""
        after = 0
        while True:
            chunk = await self._read_call(audit_chunk, after, AUDIT_CHUNK)
            for row in chunk:
                yield row
            if len(chunk) < AUDIT_CHUNK:
                return
            after = chunk[-1].seq


_DUE_DISPATCHES = """
    SELECT o.approval_id, o.revision, o.attempts, o.next_attempt_at
    FROM outbox o INDEXED BY outbox_due
    JOIN approvals a ON a.approval_id = o.approval_id
    WHERE o.delivered_at IS NULL AND o.next_attempt_at <= ?
      AND a.state = 'pending' AND a.revision = o.revision
    ORDER BY o.next_attempt_at LIMIT ?"""
_NEXT_DISPATCH = """
    SELECT o.next_attempt_at FROM outbox o INDEXED BY outbox_due
    JOIN approvals a ON a.approval_id = o.approval_id
    WHERE o.delivered_at IS NULL AND a.state = 'pending' AND a.revision = o.revision
    ORDER BY o.next_attempt_at LIMIT 1"""


def audit_chunk(conn: sqlite3.Connection, after: int, limit: int) -> list[audit.AuditRow]:
    """Return up to ``limit`` audit rows with seq > ``after``, ascending."""
    rows = conn.execute(
        "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id,"
        " signature FROM audit_log WHERE seq > ? ORDER BY seq LIMIT ?",
        (after, limit),
    ).fetchall()
    return [audit.AuditRow(*row) for row in rows]


def _snapshot(conn: sqlite3.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(conn, *args)`` inside one read transaction: its statements see one snapshot."""
    conn.execute("BEGIN")
    try:
        return fn(conn, *args)
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("COMMIT")


def _settle(answers: list[tuple[_Job, Any, BaseException | None]]) -> None:
    for job, result, error in answers:
        future = job.future
        if future is None or future.done():
            continue
        try:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        except (TypeError, ValueError) as exc:  # e.g. StopIteration: fail this caller alone
            future.set_exception(RuntimeError(f"the write transaction failed: {exc}"))


@contextmanager
def _reading() -> Iterator[None]:
    """Turn a failed read (I/O error, unreadable file) into Unavailable 503, not a 500."""
    try:
        yield
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"database read failed: {exc}") from exc


def _lock_holders(lock: Path) -> list[int]:
    """Pids of the processes with ``lock`` open (from /proc/*/fd; the ones this user may
    see), for the "in use" error: after a kill -9 of a gate its writer process may still
    hold the lock (a stopped one, until it is continued or killed)."""
    holders = []
    target = str(lock.resolve())  # /proc/*/fd links name the resolved path
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


def _rollback_quietly(conn: sqlite3.Connection) -> None:
    """ROLLBACK, ignoring "no transaction is active" (SQLite already rolled back a COMMIT
    that failed on SQLITE_FULL/IOERR)."""
    with contextlib.suppress(sqlite3.Error):
        conn.execute("ROLLBACK")

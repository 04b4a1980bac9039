"""Store: the gate's database (SQLite, or PostgreSQL) behind one object (one writer, one
reader)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

from gate.audit import chain as audit
from gate.clock import PinnedClock
from gate.errors import Fenced, Unavailable
from gate.postgres.target import PgTarget
from gate.store import opening
from gate.store.batch import BatchObserver, Command, Faults, Handler, Probe, Writer
from gate.store.health import WriteHealth
from gate.store.reads import Reads
from gate.store.schema import SCHEMA_VERSION
from gate.store.tx import WriteTx

R = TypeVar("R")


class Store:
    """The gate's database: a SQLite file (WAL, synchronous=FULL), or a PostgreSQL database
    (``PgTarget``) that several gates may share.

    All writes go through ``transact(command)``: the transaction runs synchronously on the
    one writer, a thread of this process or (``writer_process=True``, what ``gate serve``
    uses) a process of its own forked at ``open`` (``gate.store.writer_process``: the web
    process's GIL is then not shared with the writer's work). Both group-commit
    (``gate.store.batch``: a SAVEPOINT per transaction, one COMMIT per batch) and answer each
    caller only after the COMMIT; a batch that appended audit entries then logs the chain
    head, ``event=audit_head seq=N hash=H`` (``batch.log_head``). Reads (``gate.store.reads``)
    use a second connection on its own thread and see the last committed state.

    A SQLite file is held with an exclusive ``flock`` on ``<db>.lock`` while open, so a second
    gate on the same file is refused (Unavailable, "database in use by another hitl-gate
    process"). On PostgreSQL every write batch holds the ``audit_head`` row lock instead
    (``gate.store.pg_backend``: the batches of all the gates on the database run one at a
    time, as one gate's), and ``clock`` (the gate's, when given) reads the database's time
    inside them. Storage faults (disk full, read-only file, I/O errors) make the failing batch
    roll back and raise Unavailable (503 ``storage_unavailable``); writes succeed again as
    soon as the fault is fixed. ``write_fault`` holds the last fault's message until a
    write succeeds again (``check_writable`` probes for that).
    """

    def __init__(
        self,
        where: Path | PgTarget,
        *,
        writer_process: bool = False,
        clock: PinnedClock | None = None,
    ) -> None:
        self.where: Path | PgTarget = where if isinstance(where, PgTarget) else Path(where)
        self.writer_process = writer_process
        self._clock = clock
        # the writer process was lost unexpectedly; ``on_writer_lost()`` is then called once
        # (``gate serve`` stops, and exits 1 for a restart)
        self.writer_lost = False
        self.on_writer_lost: Callable[[], None] | None = None
        # told each committed write batch's size and write-lock hold time (the metrics);
        # set before ``open``
        self.on_batch: BatchObserver | None = None
        self._handler: Handler | None = None
        self._writer: Writer | None = None
        # every read but the audit rows: ``store.reads.fetch(...)`` and so on
        self.reads = Reads()
        self._faults = Faults(self.where if isinstance(self.where, Path) else str(self.where))
        self._locks: list[int] = []  # the flock on <db>.lock while open
        self._health = WriteHealth(self._faults)

    @property
    def write_fault(self) -> str | None:
        """The last storage fault's message, until a write succeeds again; else None."""
        return self._faults.write_fault

    @property
    def fenced(self) -> Fenced | None:
        """Why this gate may write nothing more until it restarts (a transaction refused
        with Fenced: ``transact``; or ``fence``), or None."""
        return self._health.fenced

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid, or None (a writer thread, or not open)."""
        return None if self._writer is None else self._writer.pid

    @property
    def writer_unanswered_s(self) -> float:
        """Seconds the oldest transaction sent to the writer process has waited for its
        answer (0.0 when none waits, and always with a writer thread): what the health check
        compares with ``writer_process.STALL_S``, and ``/metrics`` shows."""
        return 0.0 if self._writer is None else self._writer.stalled_s()

    @property
    def unsent_bytes(self) -> int:
        """Bytes of jobs, cancellations and configuration sent to the writer process that
        are not in its socket yet (0 with a writer thread). Once 0, their order is fixed:
        the writer reads the cancellations in its socket before each job of a batch."""
        return 0 if self._writer is None else self._writer.unsent_bytes

    def bind(self, handler: Handler) -> None:
        """Set what runs a ``Command`` other than ``Probe``: ``handler(tx, command)`` on the
        writer (in the writer process: the process's copy of it, forked at ``open``;
        ``tx`` is None for a command sent with ``apply``). Call before ``open``."""
        self._handler = handler

    async def open(self) -> None:
        """Open (creating if needed) the file, set WAL + synchronous=FULL, run migrations,
        start the writer (``gate.store.opening.start``: with ``writer_process`` it forks, so
        call it before the process starts any thread). Raises Unavailable when the file
        cannot be opened, is newer than this code, or is in use by another running gate."""
        try:
            self._writer = await opening.start(
                self.where,
                self.writer_process,
                self._run_bound,
                self._faults,
                self._lost,
                self.reads,
                self._locks,
                self._clock,
            )
            self._writer.on_batch = self.on_batch
        except BaseException:
            await self.close()
            raise

    def _run_bound(self, tx: WriteTx | None, command: Command[Any]) -> Any:
        # the handler bound when the writer runs the command (a writer process: its copy)
        if self._handler is None:
            raise RuntimeError(f"no handler bound for {command.name!r}")
        return self._handler(tx, command)

    def _lost(self) -> None:
        self.writer_lost = True
        if self.on_writer_lost is not None:
            self.on_writer_lost()

    async def close(self) -> None:
        """Finish the queued transactions, close both connections, release the lock (idempotent)."""
        writer, self._writer = self._writer, None
        await opening.stop(writer, self.reads, self._locks)

    async def schema_version(self) -> int:
        """Return the schema version (SQLite's ``PRAGMA user_version``, PostgreSQL's
        ``schema_migrations``: what ``/healthz`` reports).

        Raises Unavailable 503 ``storage_unavailable`` while the database refuses writes
        (``check_writable``), so a health check sees a full disk or a read-only file, and
        503 ``schema_too_new`` (naming both versions) once a newer hitl-gate migrated the
        database under this running gate (it would refuse to start on it).
        """
        await self.check_writable()
        version = await self.reads.schema_version()
        if version > SCHEMA_VERSION:
            message = (
                f"the database's schema is version {version}; this gate knows up to"
                f" {SCHEMA_VERSION} (a newer hitl-gate migrated it: replace this gate by the"
                " newer version)"
            )
            extra = {"schema_version": version, "supported_schema_version": SCHEMA_VERSION}
            raise Unavailable("schema_too_new", message, extra={**extra, "message": message})
        return version

    def fence(self, error: Fenced) -> None:
        """This gate may write no more until it restarts, for ``error`` (found outside a
        transaction: another gate retired its receipt key, ``gate.daemon.cluster``):
        ``transact`` and ``check_writable`` raise it from now on (the first one kept)."""
        self._health.fence(error)

    async def check_writable(self) -> None:
        """Raise Unavailable while the last write failed on a storage fault, or while the
        writer process has left a transaction unanswered for over ``writer_process.STALL_S``
        (``gate.store.health``: a probe transaction at most once a second ends a fault);
        Fenced once a transaction was refused so (until the gate restarts)."""
        await self._health.check(self.writer_unanswered_s, self.transact)

    async def transact(self, command: Command[R]) -> R:
        """Run ``command`` in a write transaction on the writer; return its result.

        ``command`` is a ``Probe`` or one the bound handler runs. Returns only after the
        transaction committed (on disk with synchronous=FULL). An exception raised by the
        transaction rolls back what it did (and only that) and is raised here; sqlite3
        errors become Unavailable (503). A transaction commits whole or not at all: when the
        caller is cancelled before it started, it never runs (a writer process: when the
        cancellation reached its socket before the job started, see ``unsent_bytes``); once
        it started, it finishes and commits. A transaction refused with Fenced (this gate
        may write no more until it restarts) makes ``check_writable`` raise it from then
        on. Raises TypeError for anything but a Command,
        Unavailable when the store is not open.
        """
        if not isinstance(command, Command):
            raise TypeError("a write transaction is a Command (see Store.bind)")
        if self._writer is None:
            raise Unavailable("storage_unavailable", "database is not open")
        fenced = self._health.fenced
        if fenced is not None and not isinstance(command, Probe):  # it writes no more
            raise Fenced(fenced.code, fenced.message, extra=fenced.extra)
        try:
            return await self._writer.transact(command)
        except Fenced as exc:  # this gate may write no more: /healthz says so from now on
            self._health.fence(exc)
            raise

    def apply(self, command: Command[None]) -> None:
        """Have the writer process run ``command`` with its bound handler outside any
        transaction (``tx`` None), after what was sent before it: configuration its copy
        of the service must share. With a writer thread this does nothing (the thread
        shares this process's objects: the caller has applied it already)."""
        if self._writer is not None:
            self._writer.apply(command)

    # ---- reads: ``store.reads`` (``gate.store.reads.Reads``) -----------------------

    def audit_rows(self) -> AsyncIterator[audit.AuditRow]:
        """Yield every audit row in ascending seq, in chunks (``Reads.audit_rows``)."""
        return self.reads.audit_rows()

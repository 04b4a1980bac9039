"""Group commit: the one batch runner both writers (thread and process) call, on both
backends.

A batch runs inside one transaction holding the database's write exclusion (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: the ``audit_head`` row lock, ``gate.store.backend``), each
job in its own SAVEPOINT (a refused or failing one rolls back alone), and COMMITs once: one
fsync for the batch. Only then are its callers answered (by the writer that called
``run_batch``, each through ``settle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from gate.errors import Unavailable
from gate.store.backend import SQLITE, BatchBackend, WriteSide
from gate.store.connection import rollback_quietly
from gate.store.tx import WriteTx

log = logging.getLogger(__name__)

R = TypeVar("R")  # a write transaction's result

MAX_BATCH = 256  # transactions sharing one COMMIT (one fsync)
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


class Command(Generic[R]):
    """A write transaction as a value (``Store.transact``): a frozen, slotted dataclass of
    its picklable arguments (the writer process receives it pickled), whose type parameter
    ``R`` is its result, so ``Store.transact(command: Command[R]) -> R`` is typed at the call
    site. ``Probe`` is the store's own; the bound handler runs the others (``Store.bind``;
    the gate's are ``gate.core.commands.Transaction``s, each with its body as ``run``).
    """

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()  # its fields, in order (the dataclass's)

    def __reduce__(self) -> tuple[type[Command[R]], tuple[Any, ...]]:
        # pickled as its class and field values: cheaper, and smaller, than a slotted
        # dataclass's own state (each job crosses the writer process's socket)
        return type(self), tuple([getattr(self, field) for field in self.__match_args__])

    @property
    def name(self) -> str:
        """The transaction's name in logs and errors: its class name in snake_case
        (``CancelQuestion``: ``cancel_question``)."""
        return _CAMEL.sub("_", type(self).__name__).lower()


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


@dataclass(frozen=True, slots=True)
class Probe(Command[None]):
    """The store's own transaction: rewrite the database header (``Store.check_writable``)."""


PROBE = Probe()

# what runs a Command other than ``Probe``: ``handler(tx, command)`` in a transaction, and
# ``handler(None, command)`` for one sent with ``Store.apply`` (outside any transaction)
Handler = Callable[[WriteTx | None, Command[Any]], Any]


class Job:
    """One transaction waiting for the writer: its command, its caller's future (the writer
    thread) or id (the writer process), and whether the caller stopped waiting."""

    __slots__ = ("command", "future", "cancelled", "id")

    def __init__(
        self, command: Command[Any], future: asyncio.Future[Any] | None = None, job_id: int = 0
    ) -> None:
        self.command = command
        self.future = future
        self.cancelled = False  # set when the caller stops waiting before the job ran
        self.id = job_id


# (job, result, error): error None when the job committed with ``result``
Answer = tuple[Job, Any, BaseException | None]


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What ``run_batch`` did: each job's answer (cancelled jobs have none), the
    ``(seq, entry_hash)`` of the newest audit entry its COMMIT kept, or None, whether its
    transaction began (False: no job ran), and, when it committed, how many ``jobs`` ran in
    its transaction and ``lock_s``, the seconds it held the write exclusion (from
    ``BatchBackend.begin`` returning to COMMIT returning; None when nothing committed): what
    ``hitl_gate_batch_jobs`` and ``hitl_gate_write_lock_seconds`` observe."""

    answers: list[Answer]
    head: tuple[int, str] | None
    began: bool = True
    jobs: int = 0
    lock_s: float | None = None


# told ``(jobs, lock_s)`` of each committed batch (``BatchResult``), in the web process
BatchObserver = Callable[[int, float], None]


class Writer(Protocol):
    """What runs the write transactions for ``Store``: ``writer_thread.ThreadWriter`` or
    ``writer_process.WriterClient``. Both run ``run_batch`` (group commit), record
    storage faults in the store's ``Faults`` and tell ``on_batch`` (when set) each
    committed batch's size and write-lock hold time."""

    on_batch: BatchObserver | None

    @property
    def pid(self) -> int | None:
        """The writer process's pid; None for a thread."""

    @property
    def unsent_bytes(self) -> int:
        """Bytes of frames not yet in the writer's socket (0 for a thread)."""

    def stalled_s(self) -> float:
        """Seconds the oldest unanswered transaction has waited (0.0: none, or a thread)."""

    async def transact(self, command: Command[R]) -> R:
        """Run ``command`` in a transaction; return its result after the COMMIT."""

    def apply(self, command: Command[None]) -> None:
        """Run ``command`` outside any transaction, in order with the jobs sent."""

    async def close(self) -> None:
        """Finish what was sent, then stop (idempotent)."""


def is_fault(exc: sqlite3.Error) -> bool:
    """True for a failure of the storage itself (see ``_FAULT_CODES``)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return isinstance(exc, sqlite3.OperationalError)
    return (code & 0xFF) in _FAULT_CODES


class Faults:
    """The writer's storage-fault state: ``write_fault`` holds the last fault's message until
    a write succeeds again. Logs ``event=storage_unavailable`` on the first fault and
    ``event=storage_recovered`` when it is over."""

    __slots__ = ("path", "write_fault")

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self.write_fault: str | None = None

    def faulted(self, exc: sqlite3.Error) -> None:
        """Record ``exc`` if it is a storage fault (``is_fault``); else nothing."""
        if is_fault(exc):
            if self.write_fault is None:
                log.error("event=storage_unavailable db=%s error=%s", self.path, exc)
            self.write_fault = str(exc)

    def recovered(self) -> None:
        """A write reached the disk (or a probe committed): the fault, if any, is over."""
        if self.write_fault is not None:
            log.warning("event=storage_recovered db=%s", self.path)
            self.write_fault = None


def run_command(
    handler: Handler,
    tx: WriteTx,
    command: Command[Any],
    conn: sqlite3.Connection,
    backend: BatchBackend = SQLITE,
) -> Any:
    """Run ``command`` in ``tx``: a ``Probe`` is the backend's (``BatchBackend.probe`` on
    ``conn``), anything else goes to ``handler`` (the store's, which raises RuntimeError
    while none is bound: ``Store.bind``). Raises what the handler raises."""
    if isinstance(command, Probe):
        return backend.probe(conn)
    return handler(tx, command)


def _failed(exc: sqlite3.Error) -> Unavailable:
    return Unavailable("storage_unavailable", f"database write failed: {exc}")


def run_batch(
    conn: sqlite3.Connection,
    batch: list[Job],
    handler: Handler,
    faults: Faults,
    before_job: Callable[[], None] | None = None,
    backend: BatchBackend = SQLITE,
) -> BatchResult:
    """Run ``batch`` in one transaction on ``conn``; return each job's (result, error).

    ``backend`` opens the transaction (``BatchBackend.begin``: SQLite's ``BEGIN IMMEDIATE``,
    PostgreSQL's head lock) and ends it (``before_commit``, ``finished``). ``before_job()``
    runs before each job, after the transaction began (which may have waited on the lock):
    the writer process reads the cancellations that arrived meanwhile (the writer thread
    sees them set on the job directly); a cancelled job is skipped. A job's exception (a
    refusal or a bug) undoes that job alone: rolled back to its SAVEPOINT (SQLite), or, on a
    backend without them (``BatchBackend.savepoints``: PostgreSQL), nothing to undo when it
    wrote nothing, else the transaction is rolled back and the jobs that ran before it run
    again in a new one, without it (their callers were not answered yet). An sqlite3 error
    (PostgreSQL's are raised as their sqlite3 classes) that loses the transaction fails the
    jobs that ran, and the rest run in a new one. Such errors become Unavailable 503
    ``storage_unavailable`` and are recorded in ``faults``; a COMMIT that changed rows ends
    a fault. A COMMIT that fails (a connection lost before its acknowledgement: an unknown
    outcome) answers 503: the caller's retry gets the idempotent answer.
    """
    answers: list[Answer] = []
    began = False
    carried: list[Any] = []  # rate-limit attempts of a refused job, kept for the next round
    while True:
        try:
            result, again = _run_batch(conn, batch, handler, faults, before_job, backend, carried)
        finally:
            backend.finished()
        answers += result.answers
        began = began or result.began
        if again is None:
            return BatchResult(answers, result.head, began, result.jobs, result.lock_s)
        batch, carried = again


# what a round of ``_run_batch`` leaves for the next: the jobs to run, and the rate-limit
# attempts they carry; None: the batch is over
Again = tuple[list[Job], list[Any]] | None


def _run_batch(
    conn: sqlite3.Connection,
    batch: list[Job],
    handler: Handler,
    faults: Faults,
    before_job: Callable[[], None] | None,
    backend: BatchBackend,
    carried: list[Any],
) -> tuple[BatchResult, Again]:
    answers: list[Answer] = []
    tx = WriteTx(conn)
    try:
        backend.begin(conn, tx)
    except sqlite3.Error as exc:
        if conn.in_transaction:  # begun, then the lock or the head failed
            rollback_quietly(conn)
        faults.faulted(exc)
        failed: list[Answer] = [(job, None, _failed(exc)) for job in batch]
        return BatchResult(failed, None, began=False), None
    if carried and tx.rate_events is not None:
        tx.rate_events.carry(carried)
    locked_at = time.perf_counter()
    changes = conn.total_changes
    done: list[tuple[Job, Any]] = []
    run = _run_saved if backend.savepoints else _run_bare
    for index, job in enumerate(batch):
        if before_job is not None:
            before_job()
        if job.cancelled:
            continue
        tx.job_started()
        outcome, value = run(handler, tx, job, conn, backend)
        if outcome == "done":
            done.append((job, value))
            continue
        if outcome == "refused":
            answers.append((job, None, value))
            continue
        rollback_quietly(conn)
        if outcome != "lost":  # "redo": undo this job, run the others again without it
            refused = not isinstance(value, sqlite3.Error)
            answers.append((job, None, value if refused else _failed(value)))
            kept = tx.running_attempts() if refused else []
            again = [j for j, _ in done] + batch[index + 1 :]
            return BatchResult(answers, None), (again, kept) if again else None
        # the transaction is lost: fail what ran, run the rest in a new one
        faults.faulted(value)
        lost = _failed(value)
        answers += [(j, None, lost) for j, _ in done] + [(job, None, lost)]
        rest = batch[index + 1 :]
        return BatchResult(answers, None), (rest, []) if rest else None
    try:
        backend.before_commit(conn, tx)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        rollback_quietly(conn)
        faults.faulted(exc)
        error = _failed(exc)
        return BatchResult(answers + [(job, None, error) for job, _ in done], None), None
    lock_s = time.perf_counter() - locked_at
    if conn.total_changes != changes:  # rows reached the disk: the storage works
        faults.recovered()
    jobs = len(answers) + len(done)
    ran = answers + [(job, result, None) for job, result in done]
    return BatchResult(ran, tx.appended_head, jobs=jobs, lock_s=lock_s), None


def _run_saved(
    handler: Handler, tx: WriteTx, job: Job, conn: sqlite3.Connection, backend: BatchBackend
) -> tuple[str, Any]:
    """Run ``job`` in its own SAVEPOINT (SQLite): ``("done", result)``; ``("refused",
    error)`` when it raised, or failed on an sqlite3 error that is not a fault (a
    constraint: answered 503), rolled back to its SAVEPOINT; ``("lost", error)`` when the
    transaction is lost (a storage fault)."""
    try:
        conn.execute("SAVEPOINT job")
        try:
            result = run_command(handler, tx, job.command, conn, backend)
        except sqlite3.Error:
            raise
        except BaseException as exc:  # refused (GateError) or a bug: undo this job only
            tx.forget_tail()
            conn.execute("ROLLBACK TO job")
            tx.job_ended()  # its rate-limit attempt counts all the same
            conn.execute("RELEASE job")
            return "refused", exc
        tx.job_ended()
        conn.execute("RELEASE job")
        return "done", result
    except sqlite3.Error as exc:
        tx.forget_tail()
        if not is_fault(exc) and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
            if conn.in_transaction:  # e.g. a constraint: this job alone fails
                return "refused", _failed(exc)
        return "lost", exc


def _run_bare(
    handler: Handler, tx: WriteTx, job: Job, conn: sqlite3.Connection, backend: BatchBackend
) -> tuple[str, Any]:
    """Run ``job`` without a SAVEPOINT (``BatchBackend.savepoints`` False): ``("done",
    result)``; ``("refused", error)`` when it raised having written nothing (its rate-limit
    attempt counts); ``("redo", error)`` when it raised after a write, or on an sqlite3
    error that is not a fault (the transaction must be rolled back: the others run again);
    ``("lost", error)`` on a storage fault."""
    before = backend.writes(conn)
    try:
        result = run_command(handler, tx, job.command, conn, backend)
        tx.job_ended()  # sends what its statements held back: may fail, in this job
    except sqlite3.Error as exc:
        tx.forget_tail()
        return ("lost" if is_fault(exc) else "redo"), exc
    except BaseException as exc:  # refused (GateError) or a bug
        tx.forget_tail()
        if backend.writes(conn) != before:
            return "redo", exc
        tx.job_ended()  # its rate-limit attempt counts all the same
        return "refused", exc
    return "done", result


def run_guarded(
    side: WriteSide,
    batch: list[Job],
    handler: Handler,
    faults: Faults,
    before_job: Callable[[], None] | None = None,
) -> BatchResult:
    """``run_batch`` on ``side``'s connection and backend, for both writers: when there is
    no connection (PostgreSQL unreachable) every job fails 503 ``storage_unavailable`` and
    the fault is recorded; a batch whose transaction could not begin because its
    connection was found lost (PostgreSQL: a server restarted, a session ended; no job ran)
    runs once more on a new one; a bug in the batch runner itself (an exception it lets
    out) is logged (``event=writer_failed``), rolls the transaction back and fails every
    job of the batch with it; the writer keeps serving."""
    for last in (False, True):
        try:
            conn = side.connection()
        except sqlite3.Error as exc:
            faults.faulted(exc)
            return BatchResult([(job, None, _failed(exc)) for job in batch], None)
        try:
            result = run_batch(conn, batch, handler, faults, before_job, side.backend)
        except Exception as exc:  # noqa: BLE001 - answered to each caller of the batch
            log.exception("event=writer_failed")
            rollback_quietly(conn)
            return BatchResult([(job, None, exc) for job in batch], None)
        if result.began or last or not getattr(conn, "closed", False):
            break
    return result


def settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Answer one caller: ``value`` is its result when ``ok``, else the exception it raises;
    nothing when it stopped waiting. An answer its future refuses (``StopIteration``) fails
    that caller alone."""
    if future.done():
        return
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except (TypeError, ValueError) as exc:
        future.set_exception(RuntimeError(f"the write transaction failed: {exc}"))


def log_head(head: tuple[int, str] | None) -> None:
    """After a batch's callers were answered (off their path): log the chain head its COMMIT
    left, ``event=audit_head seq=N hash=H``, when it appended audit entries; else nothing.
    An anchor held outside the database file (``audit verify --expect-head``)."""
    if head is not None:
        log.info("event=audit_head seq=%d hash=%s", *head)

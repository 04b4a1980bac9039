"""The store's writer in its own process: group commit off the web process's GIL.

``gate serve`` forks one writer process when it opens the database (``Store(...,
writer_process=True)``), before any thread starts. The child owns the one write connection
and runs the same batch runner as the writer thread (``gate.store.batch.run_batch``: one
``BEGIN IMMEDIATE``, a SAVEPOINT per transaction, one COMMIT = one fsync per batch) on
*commands* (``Command``: a transaction's picklable arguments, typed by its class); its copy of the
bound handler (the service), forked with it, runs them (``Store.bind``). Each caller is
answered only after the commit, as with the thread. ``WriterClient`` implements
``gate.store.batch.Writer``.

Wire, over one ``socketpair`` (both ways): frames of a 4-byte big-endian length and a
pickle. Web process -> writer: ``("job", id, command)``, ``("cancel", id)`` (the caller
stopped waiting: the job is skipped if it has not started), ``("apply", command)``
(configuration, applied between batches, in order). Writer -> web process: ``("ready",
error)`` once, then ``("answers", [(id, ok, result_or_error), ...], write_fault, (jobs,
lock_s))`` after each batch (its size and write-lock hold time, ``lock_s`` None when it did
not commit: handed to ``on_batch``). Pickle is safe here: both ends are this program,
forked from one process, and the socket is private to the two of them.

The writer exits when the web process closes its end (after the queued jobs ran) or
disappears; it keeps the inherited ``<db>.lock`` open until then, so no second gate starts
on the file while it may still write. If the writer dies, ``event=writer_exited`` (with its
exit status) is logged, every write is refused 503 ``storage_unavailable`` and the gate
stops cleanly and exits 1 (``Store.on_writer_lost``, called through ``start``'s
``on_lost``): systemd's ``Restart=on-failure`` starts it again with a new writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from gate.errors import GateError, Unavailable
from gate.store import writer_child
from gate.store.backend import WriteSide
from gate.store.batch import BatchObserver, Command, Faults, Handler, settle
from gate.store.writer_child import HEADER, MAX_FRAME, frame

log = logging.getLogger(__name__)

R = TypeVar("R")

# a transaction unanswered this long (seconds) makes the health check fail: the writer is
# stuck (stopped, or blocked in the kernel); busy_timeout alone may hold a batch 10 s
STALL_S = 30.0
WRITER_GONE = "the database writer process exited (restart the gate)"


# ---- the web process's side -------------------------------------------------------------


class WriterClient:
    """The web process's handle on the writer process: sends jobs, settles their futures.

    Created by ``start``; ``transact`` is ``Store.transact`` in this mode. ``faults`` mirrors
    the writer's (each answer frame carries its ``write_fault``); ``on_lost()`` is called
    once, when the writer process is lost unexpectedly. Not thread-safe: used from the
    event loop only.
    """

    def __init__(
        self,
        pid: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        faults: Faults,
        on_lost: Callable[[], None],
    ) -> None:
        self.faults = faults
        self._on_lost = on_lost
        self.on_batch: BatchObserver | None = None
        self.pid = pid
        self._reader = reader
        self._writer = writer
        # job id -> (its caller's future, loop time it was sent), until answered
        self._pending: dict[int, tuple[asyncio.Future[Any], float]] = {}
        self._broken = False  # the channel broke; the writer is being reaped
        self._next_id = 0
        self._closing = False
        self._reaped = False
        self.gone: str | None = None  # why no write can be sent any more
        self._outgoing: list[bytes] = []  # frames sent by this loop iteration, in order
        self._loop = asyncio.get_running_loop()
        # armed while transactions wait (never when idle): logs a writer stuck past STALL_S
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_logged = False
        self._answers = asyncio.create_task(self._read_answers(), name="writer-answers")

    def _send(self, message: Any) -> None:
        if self.gone is not None:
            raise Unavailable("storage_unavailable", self.gone)
        if self._broken:
            return  # failed with every pending job as soon as the loss is logged
        # the frames of one loop iteration leave in one write (one syscall for the many
        # decisions a busy iteration handles), at the start of the next
        self._outgoing.append(frame(message))
        if len(self._outgoing) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._outgoing:
            data = b"".join(self._outgoing)
            self._outgoing.clear()
            if self.gone is None and not self._broken:
                self._writer.write(data)

    @property
    def unsent_bytes(self) -> int:
        """Bytes sent by callers that are not in the writer's socket yet: frames waiting for
        this loop turn's write, plus what the transport still buffers."""
        return sum(map(len, self._outgoing)) + self._writer.transport.get_write_buffer_size()

    def _check_stall(self) -> None:
        """Timer: log once (``event=writer_stalled``) when the oldest unanswered transaction
        has waited STALL_S; else wait for the time it has left. Not re-armed once nothing
        waits, so an idle gate has no timer."""
        self._stall_timer = None
        if not self._pending or self._broken:
            return
        waited = self.stalled_s()
        if waited >= STALL_S:
            if not self._stall_logged:
                self._stall_logged = True
                log.error(
                    "event=writer_stalled pid=%d unanswered_s=%.0f transactions=%d "
                    "(the database writer process is stopped or blocked; /healthz "
                    "answers 503 until it answers again)",
                    self.pid,
                    waited,
                    len(self._pending),
                )
            delay = STALL_S
        else:
            delay = STALL_S - waited
        self._stall_timer = self._loop.call_later(delay, self._check_stall)

    def stalled_s(self) -> float:
        """Seconds the oldest unanswered transaction has waited (0.0 when none waits)."""
        if not self._pending:
            return 0.0
        return self._loop.time() - min(sent for _, sent in self._pending.values())

    async def transact(self, command: Command[R]) -> R:
        """Run ``command`` in the writer process; return its result after the commit.

        Raises what the transaction raised (GateError for a refusal), Unavailable 503 when
        the writer is gone. Cancelled before the job started, the job never runs.
        """
        self._next_id += 1
        job_id = self._next_id
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._send(("job", job_id, command))
        self._pending[job_id] = (future, self._loop.time())
        if self._stall_timer is None:
            self._stall_timer = self._loop.call_later(STALL_S, self._check_stall)
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(job_id, None) is not None:
                with contextlib.suppress(GateError, OSError, RuntimeError):
                    self._send(("cancel", job_id))
            raise

    def apply(self, command: Command[None]) -> None:
        """Have the writer run ``command`` outside any transaction, after the jobs sent
        before it and before those sent after (e.g. a reloaded configuration). No answer."""
        with contextlib.suppress(GateError):
            self._send(("apply", command))

    async def _read_answers(self) -> None:
        try:
            while True:
                message = await _read_frame(self._reader)
                kind, items, write_fault, (jobs, lock_s) = message
                if kind != "answers":
                    raise ValueError(f"unexpected frame {kind!r} from the writer process")
                self.faults.write_fault = write_fault
                if lock_s is not None and self.on_batch is not None:
                    self.on_batch(jobs, lock_s)
                for job_id, ok, value in items:
                    waiting = self._pending.pop(job_id, None)
                    if waiting is not None:
                        settle(waiting[0], ok, value)
                if self._stall_logged and self.stalled_s() < STALL_S:
                    self._stall_logged = False
                    log.warning("event=writer_answering_again pid=%d", self.pid)
        except Exception:  # noqa: BLE001 - EOF, a reset, a frame not understood: the writer
            pass  # is lost either way, and no waiting caller may hang
        self._broken = True
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if not self._closing:
            # the cause is logged before anything it causes: callers fail only after it
            self._writer.close()  # a writer still running sees its input end and exits
            status = await asyncio.to_thread(_reap, self.pid)
            self._reaped = True
            log.error("event=writer_exited pid=%d %s", self.pid, _exit_text(status))
            self.faults.write_fault = WRITER_GONE
        self.gone = WRITER_GONE
        error = Unavailable("storage_unavailable", f"database write failed: {WRITER_GONE}")
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(error)
        if not self._closing:
            self._on_lost()

    async def close(self) -> None:
        """Let the writer finish what was sent, then end it and reap it (idempotent)."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(OSError, RuntimeError):
            self._flush()
            self._writer.write_eof()
        with contextlib.suppress(asyncio.CancelledError):
            await self._answers
        self._writer.close()
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()
        if not self._reaped:
            self._reaped = True
            status = await asyncio.to_thread(_reap, self.pid)
            if status not in (0, None):
                log.error("event=writer_exited pid=%d %s", self.pid, _exit_text(status))


def _exit_text(status: int | None) -> str:
    """``exit=N``, ``signal=NAME`` (a negative exit code) or ``exit=unknown``."""
    if status is None:
        return "exit=unknown"
    if status < 0:
        try:
            return f"signal={signal.Signals(-status).name}"
        except ValueError:
            return f"signal={-status}"
    return f"exit={status}"


def _reap(pid: int) -> int | None:
    """Wait for the writer ``pid`` to end; return its exit code (negative: the signal that
    ended it), or None when it was reaped already."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status)


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise pickle.UnpicklingError(f"frame of {size} bytes")
    return pickle.loads(await reader.readexactly(size))


async def start(
    open_side: Callable[[], WriteSide],
    name: str,
    handler: Handler,
    faults: Faults,
    on_lost: Callable[[], None],
) -> WriterClient:
    """Fork the writer process for a prepared database (SQLite: its lock held by the caller:
    the child inherits the lock fd) and return the web process's handle on it.

    Call before any thread is started (fork copies only the calling thread). The child opens
    its own write side (``open_side()``, in the child: no connection crosses the fork; ``name``
    is the database in logs and errors), then runs ``handler``'s copy on the commands it is
    sent until the parent closes its end. ``faults`` and ``on_lost``: see ``WriterClient``.
    Raises Unavailable when the writer cannot open the database.
    """
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        pid = os.fork()
        if pid == 0:  # the writer process: never returns into the caller's frames
            code = 1
            try:
                parent_sock.close()
                code = writer_child.main(open_side, name, handler, child_sock, old_mask)
            except BaseException:  # noqa: BLE001 - the child must not unwind into the parent's code
                with contextlib.suppress(BaseException):
                    log.exception("event=writer_failed")
            finally:
                os._exit(code)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    child_sock.close()
    reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
    cause: BaseException | None = None
    try:
        _, error = await _read_frame(reader)  # ("ready", why it cannot serve or None)
    except (asyncio.IncompleteReadError, OSError, EOFError) as exc:
        error, cause = f"the database writer process did not start: {exc}", exc
    if error is not None:
        writer.close()
        await asyncio.to_thread(_reap, pid)
        raise Unavailable("storage_unavailable", error) from cause
    log.debug("event=writer_started pid=%d", pid)
    return WriterClient(pid, reader, writer, faults, on_lost)

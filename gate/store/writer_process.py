"""The store's writer in its own process: group commit off the web process's GIL.

``gate serve`` forks one writer process when it opens the database (``Store(...,
writer_process=True)``), before any thread starts. The child owns the one write connection
and runs the same batch runner as the writer thread (``gate.store.batch.run_batch``: one
``BEGIN IMMEDIATE``, a SAVEPOINT per transaction, one COMMIT = one fsync per batch) on
*commands* (``Command``: a transaction's name and picklable arguments); its copy of the
bound handler (the service), forked with it, runs them (``Store.bind``). Each caller is
answered only after the commit, as with the thread. ``WriterClient`` implements
``gate.store.facade.Writer``.

Wire, over one ``socketpair`` (both ways): frames of a 4-byte big-endian length and a
pickle. Web process -> writer: ``("job", id, command)``, ``("cancel", id)`` (the caller
stopped waiting: the job is skipped if it has not started), ``("apply", command)``
(configuration, applied between batches, in order). Writer -> web process: ``("ready",
error)`` once, then ``("answers", [(id, ok, result_or_error), ...], write_fault)`` after
each batch. Pickle is safe here: both ends are this program, forked from one process, and
the socket is private to the two of them.

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
import struct
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gate.errors import GateError, Unavailable
from gate.store import batch
from gate.store.batch import MAX_BATCH, PROBE, Answer, Command, Faults, Handler, Job
from gate.store.connection import open_writer, rollback_quietly

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
_MAX_FRAME = 1 << 30
# a transaction unanswered this long (seconds) makes the health check fail: the writer is
# stuck (stopped, or blocked in the kernel); busy_timeout alone may hold a batch 10 s
STALL_S = 30.0
PROCESS_NAME = "hitl-gate-db"  # the writer's name in ps -o comm / top (15 bytes at most)
WRITER_GONE = "the database writer process exited (restart the gate)"


def _frame(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


# ---- the web process's side -------------------------------------------------------------


class WriterClient:
    """The web process's handle on the writer process: sends jobs, settles their futures.

    Created by ``start``; ``transact`` is ``Store.transact`` in this mode. ``faults`` mirrors
    the writer's (each answer frame carries its ``write_fault``); ``lost`` is set, and
    ``on_lost()`` called once, when the writer process is lost unexpectedly. Not
    thread-safe: used from the event loop only.
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
        self.lost = False
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
        self._outgoing.append(_frame(message))
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

    async def transact(self, command: Command) -> Any:
        """Run ``command`` in the writer process; return its result after the commit.

        Raises what the transaction raised (GateError for a refusal), Unavailable 503 when
        the writer is gone. Cancelled before the job started, the job never runs.
        """
        self._next_id += 1
        job_id = self._next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
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

    def apply(self, command: Command) -> None:
        """Have the writer run ``command`` outside any transaction, after the jobs sent
        before it and before those sent after (e.g. a reloaded configuration). No answer."""
        with contextlib.suppress(GateError):
            self._send(("apply", command))

    async def _read_answers(self) -> None:
        try:
            while True:
                message = await _read_frame(self._reader)
                kind, items, write_fault = message
                if kind != "answers":
                    raise ValueError(f"unexpected frame {kind!r} from the writer process")
                self.faults.write_fault = write_fault
                for job_id, ok, value in items:
                    waiting = self._pending.pop(job_id, None)
                    if waiting is not None:
                        _settle(waiting[0], ok, value)
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
            self.lost = True
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


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Answer one caller; an answer its future refuses (``StopIteration``) fails that
    caller alone."""
    if future.done():
        return
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except (TypeError, ValueError) as exc:
        future.set_exception(RuntimeError(f"the write transaction failed: {exc}"))


def _reap(pid: int) -> int | None:
    """Wait for the writer ``pid`` to end; return its exit code (negative: the signal that
    ended it), or None when it was reaped already."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status)


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > _MAX_FRAME:
        raise pickle.UnpicklingError(f"frame of {size} bytes")
    return pickle.loads(await reader.readexactly(size))


async def start(
    path: Path, handler: Handler | None, faults: Faults, on_lost: Callable[[], None]
) -> WriterClient:
    """Fork the writer process for the database ``path`` (prepared, its lock held by the
    caller: the child inherits the lock fd) and return the web process's handle on it.

    Call before any thread is started (fork copies only the calling thread). The child opens
    its own write connection, then runs ``handler``'s copy on the commands it is sent until
    the parent closes its end. ``faults`` and ``on_lost``: see ``WriterClient``. Raises
    Unavailable when the writer cannot open the database.
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
                _child_signals(old_mask)
                with contextlib.suppress(OSError):
                    with open("/proc/self/comm", "w", encoding="ascii") as comm:
                        comm.write(PROCESS_NAME)
                code = _child(path, handler, child_sock)
            except BaseException:  # noqa: BLE001 - the child must not unwind into the parent's code
                with contextlib.suppress(BaseException):
                    log.exception("event=writer_failed")
            finally:
                os._exit(code)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    child_sock.close()
    reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
    try:
        kind, error = await _read_frame(reader)
    except (asyncio.IncompleteReadError, OSError, EOFError) as exc:
        writer.close()
        await asyncio.to_thread(_reap, pid)
        raise Unavailable(
            "storage_unavailable", f"the database writer process did not start: {exc}"
        ) from exc
    if error is not None:
        writer.close()
        await asyncio.to_thread(_reap, pid)
        raise Unavailable("storage_unavailable", error)
    log.debug("event=writer_started pid=%d", pid)
    return WriterClient(pid, reader, writer, faults, on_lost)


# ---- the writer process -----------------------------------------------------------------


def _child_signals(mask: Any) -> None:
    """Stop on the parent's word only: ignore the signals the web process handles (a
    terminal's ^C or systemd's SIGTERM reach the whole group), and drop the parent's
    event-loop wake-up fd (a signal here must not wake the parent's loop)."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class _Frames:
    """Frame reader over the writer's socket: ``take`` blocks for at least one frame and
    also takes whatever else has arrived, so one batch takes every waiting job; ``poll``
    never blocks."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()

    def take(self) -> list[Any] | None:
        """Return the next frames (at least one), or None at end of stream."""
        while True:
            messages = self.poll()
            if messages:
                return messages
            try:
                data = self._sock.recv(1 << 20)
            except ConnectionError:  # the web process died with answers unread: the end
                data = b""
            if not data:
                return None
            self._buffer += data

    def poll(self) -> list[Any]:
        """Return the complete frames that have arrived (maybe none), without blocking."""
        try:
            data = self._sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except (BlockingIOError, ConnectionError):  # nothing yet; or the end (``take``)
            data = b""
        self._buffer += data
        messages = []
        view = self._buffer
        offset = 0
        while len(view) - offset >= _HEADER.size:
            (size,) = _HEADER.unpack_from(view, offset)
            end = offset + _HEADER.size + size
            if len(view) < end:
                break
            messages.append(pickle.loads(view[offset + _HEADER.size : end]))
            offset = end
        del self._buffer[:offset]
        return messages


def _child(path: Path, handler: Handler | None, sock: socket.socket) -> int:
    """The writer process's loop: open the write connection (the inherited lock fd stays
    open: after a kill -9 of the web process the lock holds until the writer, which may
    still finish a batch, is gone too), then take frames, run batches, send answers. Returns
    the exit code once the web process has closed its end or is gone."""
    try:
        conn = open_writer(path)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        sock.sendall(_frame(("ready", f"cannot open database {path}: {exc}")))
        return 1
    sock.sendall(_frame(("ready", None)))
    faults = Faults(path)
    frames = _Frames(sock)
    waiting: deque[Any] = deque()  # messages read but not handled yet, in order
    jobs: dict[int, Job] = {}  # the jobs of the batch being assembled or run

    def claim_cancels(messages: Any) -> list[Any]:
        # mark the jobs of this batch whose callers gave up; return the other messages
        rest = []
        for message in messages:
            job = jobs.get(message[1]) if message[0] == "cancel" else None
            if job is not None:
                job.cancelled = True
            else:
                rest.append(message)
        return rest

    def before_job() -> None:
        # before each job of a batch (the first once BEGIN IMMEDIATE got the lock, which may
        # have taken a while): a caller that gave up meanwhile is not run, as with the
        # writer thread. One non-blocking read when nothing arrived.
        waiting.extend(claim_cancels(frames.poll()))

    while True:
        if not waiting:
            got = frames.take()
            if got is None:
                return 0
            waiting.extend(got)
        todo: list[Job] = []
        while waiting:
            kind = waiting[0][0]
            if kind == "job":
                if len(todo) >= MAX_BATCH:
                    break
                _, job_id, command = waiting.popleft()
                job = Job(command, None, job_id)
                jobs[job_id] = job
                todo.append(job)
            elif kind == "cancel":
                cancelled = jobs.get(waiting.popleft()[1])
                if cancelled is not None:
                    cancelled.cancelled = True
            elif kind == "apply":
                if todo:  # the jobs sent before it run first
                    break
                _apply(handler, waiting.popleft()[1])
            else:
                waiting.popleft()
        if not todo:
            continue
        # cancels queued behind where the batch was cut (a reload, MAX_BATCH) count too
        rest = claim_cancels(waiting)
        waiting.clear()
        waiting.extend(rest)
        head = None
        answers: list[Answer]
        try:
            result = batch.run_batch(conn, todo, handler, faults, before_job)
            answers, head = result.answers, result.head
        except Exception as exc:  # noqa: BLE001 - a bug in the batch runner: fail the batch,
            log.exception("event=writer_failed")  # keep serving (as the writer thread does)
            rollback_quietly(conn)
            answers = [(job, None, exc) for job in todo]
        jobs.clear()
        if any(job.command == PROBE and error is None for job, _, error in answers):
            faults.recovered()  # a probe committed: the storage fault is over
        items = [_answer(job, result, error) for job, result, error in answers]
        try:
            try:
                data = _frame(("answers", items, faults.write_fault))
            except Exception:  # noqa: BLE001 - a bug (an unpicklable result): answer it as one
                data = _frame(("answers", [_picklable(item) for item in items], faults.write_fault))
            sock.sendall(data)
        except OSError:
            batch.log_head(head)  # committed all the same
            return 0  # the web process is gone: nobody waits for these answers
        batch.log_head(head)  # after the answers: off the callers' path


def _apply(handler: Handler | None, command: Command) -> None:
    """Run a configuration ``command`` outside any transaction (``handler(None, command)``)."""
    if handler is None:
        return
    try:
        handler(None, command)  # type: ignore[arg-type]  # the handler's ``tx`` may be None
    except Exception:  # noqa: BLE001 - a bug: keep the writer (and its old settings)
        log.exception("event=writer_error apply=%s", command.name)


def _answer(job: Job, result: Any, error: BaseException | None) -> tuple[int, bool, Any]:
    if error is None:
        return job.id, True, result
    return job.id, False, _portable(error, job.command.name)


def _portable(error: BaseException, command: str) -> BaseException:
    """``error`` as the web process can receive it: a GateError that survives pickling as
    itself, another one as a plain GateError with the same code, status, kind and extra;
    anything else (a bug: its traceback is logged here) as a RuntimeError naming it."""
    if isinstance(error, GateError):
        try:
            pickle.loads(pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 - e.g. an __init__ pickle cannot call
            return GateError(
                error.code, error.message, status=error.status, kind=error.kind, extra=error.extra
            )
        return error
    log.error("event=writer_error command=%s", command, exc_info=error)
    return RuntimeError(
        f"the write transaction {command!r} failed: {type(error).__name__}: {error}"
    )


def _picklable(item: tuple[int, bool, Any]) -> tuple[int, bool, Any]:
    job_id, ok, value = item
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001
        log.error("event=writer_error error=unpicklable answer (%s)", exc)
        return job_id, False, RuntimeError(f"unpicklable answer: {type(value).__name__}")
    return item

"""The writer process's side of ``gate.store.writer_process``: its loop and the wire framing.

Forked by ``writer_process.start``; ``main`` opens the write side (``gate.store.backend``:
SQLite's file, or PostgreSQL's connection, opened again when lost), then takes frames
from the web process, runs the jobs as batches (``gate.store.batch.run_batch``) and sends
the answers back, until the web process closes its end. The wire is described in
``gate.store.writer_process``.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import signal
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from gate.errors import GateError
from gate.store import batch
from gate.store.backend import WriteSide
from gate.store.batch import MAX_BATCH, Command, Faults, Handler, Job, Probe

log = logging.getLogger(__name__)

HEADER = struct.Struct(">I")  # a frame: this 4-byte big-endian length, then a pickle
MAX_FRAME = 1 << 30
PROCESS_NAME = "hitl-gate-db"  # the writer's name in ps -o comm / top (15 bytes at most)


def frame(message: Any) -> bytes:
    """``message`` as one frame: its pickle's length (``HEADER``), then the pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def main(
    open_side: Callable[[], WriteSide], name: str, handler: Handler, sock: socket.socket, mask: Any
) -> int:
    """The forked writer: restore the signal ``mask`` (ignoring the web process's signals),
    name the process ``PROCESS_NAME``, then serve ``sock`` (``_child``) on the write side
    ``open_side()`` opens (``name``: the database, in logs and errors); return its exit
    code."""
    _child_signals(mask)
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w", encoding="ascii") as comm:
            comm.write(PROCESS_NAME)
    return _child(open_side, name, handler, sock)


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
        while len(view) - offset >= HEADER.size:
            (size,) = HEADER.unpack_from(view, offset)
            end = offset + HEADER.size + size
            if len(view) < end:
                break
            messages.append(pickle.loads(view[offset + HEADER.size : end]))
            offset = end
        del self._buffer[:offset]
        return messages


def _child(
    open_side: Callable[[], WriteSide], name: str, handler: Handler, sock: socket.socket
) -> int:
    """The writer process's loop: open the write side (SQLite: the inherited lock fd stays
    open: after a kill -9 of the web process the lock holds until the writer, which may
    still finish a batch, is gone too), then take frames, run batches, send answers. Returns
    the exit code once the web process has closed its end or is gone."""
    try:
        side = open_side()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        sock.sendall(frame(("ready", f"cannot open database {name}: {exc}")))
        return 1
    sock.sendall(frame(("ready", None)))
    faults = Faults(name)
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
                claim_cancels([waiting.popleft()])  # one for no job here is dropped
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
        ran = batch.run_guarded(side, todo, handler, faults, before_job)
        jobs.clear()
        if any(isinstance(job.command, Probe) and error is None for job, _, error in ran.answers):
            faults.recovered()  # a probe committed: the storage fault is over
        items = [_answer(job, result, error) for job, result, error in ran.answers]
        stats = (ran.jobs, ran.lock_s)  # the batch's size and write-lock hold time (metrics)
        try:
            try:
                data = frame(("answers", items, faults.write_fault, stats))
            except Exception:  # noqa: BLE001 - a bug (an unpicklable result): answer it as one
                items = [_picklable(item) for item in items]
                data = frame(("answers", items, faults.write_fault, stats))
            sock.sendall(data)
        except OSError:
            batch.log_head(ran.head)  # committed all the same
            return 0  # the web process is gone: nobody waits for these answers
        batch.log_head(ran.head)  # after the answers: off the callers' path


def _apply(handler: Handler, command: Command[None]) -> None:
    """Run a configuration ``command`` outside any transaction (``handler(None, command)``)."""
    try:
        handler(None, command)
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

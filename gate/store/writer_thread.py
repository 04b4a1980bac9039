"""The store's writer as a thread of this process (``Store(path)``; tests and tools).

Implements ``gate.store.batch.Writer``: callers queue ``Job``s, the thread takes every job
waiting (up to ``MAX_BATCH``), runs them with ``batch.run_batch`` (group commit) and answers
the callers on their event loop once the batch committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from typing import TypeVar

from gate.errors import Unavailable
from gate.store import batch
from gate.store.backend import WriteSide
from gate.store.batch import (
    MAX_BATCH,
    Answer,
    BatchObserver,
    Command,
    Faults,
    Handler,
    Job,
    settle,
)

R = TypeVar("R")


class ThreadWriter:
    """The writer thread on ``side``'s connection (which it owns and closes); answers on
    ``loop``.

    ``handler`` runs the commands (``batch.run_command``); ``faults`` is shared with the
    store, which probes with it. Has no process: ``pid`` None, nothing ever unsent or
    unanswered past a stall, never lost.
    """

    pid: int | None = None
    unsent_bytes = 0  # a job is in the queue as soon as ``transact`` is called
    on_batch: BatchObserver | None = None  # told on this thread (a histogram is thread-safe)

    def __init__(
        self,
        side: WriteSide,
        handler: Handler,
        faults: Faults,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.faults = faults
        self._side = side
        self._handler = handler
        self._loop = loop
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="gate-writer", daemon=True
        )
        self._thread.start()

    def stalled_s(self) -> float:
        """Always 0.0 (the thread shares this process: a stuck writer is a stuck gate)."""
        return 0.0

    async def transact(self, command: Command[R]) -> R:
        """Queue ``command``; return its result once its batch committed. Cancelled before
        it started, the job never runs; once started it finishes and commits. Raises what
        the transaction raised, Unavailable 503 when closed or on a storage fault."""
        if self._thread is None:
            raise Unavailable("storage_unavailable", "database is not open")
        future: asyncio.Future[R] = self._loop.create_future()
        job = Job(command, future)
        self._queue.put(job)
        try:
            return await future
        except asyncio.CancelledError:
            job.cancelled = True
            raise

    def apply(self, command: Command[None]) -> None:
        """Nothing: the thread shares this process's objects, the caller applied it."""

    async def close(self) -> None:
        """Finish the queued transactions, stop the thread, close the connection."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
        self._side.close()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            jobs = [first]
            while len(jobs) < MAX_BATCH:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                jobs.append(job)
            result = batch.run_guarded(self._side, jobs, self._handler, self.faults)
            self._deliver(result.answers)
            if result.lock_s is not None and self.on_batch is not None:
                self.on_batch(result.jobs, result.lock_s)
            batch.log_head(result.head)

    def _deliver(self, answers: list[Answer]) -> None:
        if not answers:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(_settle, answers)


def _settle(answers: list[Answer]) -> None:
    for job, result, error in answers:
        if job.future is not None:
            settle(job.future, error is None, result if error is None else error)
